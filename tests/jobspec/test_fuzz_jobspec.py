"""Property tests of job specs: no text, document or file makes the parser fail with anything but a JobSpecError
that names the file (and the key, for a document that parsed); what it accepts keeps every safety rule; parsing
acts on nothing (no file written, no process started)."""

from __future__ import annotations

import os
import pwd
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flexmig.errors import JobSpecError
from flexmig.jobspec.spec import RESERVED_ENV, JobPolicy, JobSpec, load_job_spec, parse_job_spec
from support.toml import toml_string, toml_value

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
USER = pwd.getpwuid(os.geteuid()).pw_name
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "busybox", "env"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@pytest.fixture(scope="module")
def allowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("jobs")
    (base / "work").mkdir()
    (base / "work" / "ckpt").mkdir()
    (base / "escape").symlink_to("/etc")
    yield base


def snapshot(base: Path) -> tuple[list[str], list[int]]:
    """What an action would change: the files under the allowed directory, this process's children."""
    files = sorted(str(p.relative_to(base)) for p in base.rglob("*"))
    return files, sorted(c.pid for c in psutil.Process().children(recursive=True))


# ------------------------------------------------------------------------------------------------ TOML rendering


def dump(doc: dict[str, Any]) -> str:
    top = [f"{toml_string(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    tables = []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append(f"[{toml_string(k)}]")
            tables += [f"{toml_string(kk)} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(top + tables) + "\n"


# ------------------------------------------------------------------------------------------------ strategies
hostile_text = st.sampled_from(
    [
        "; rm -rf /",
        "$(reboot)",
        "`id`",
        "a|b",
        "a&&b",
        "x\ny",
        "x\x00y",
        "../../../etc",
        "/etc/shadow",
        "..",
        "",
        " ",
        "ｊｏｂ",
        "\u202ejob",
        "%s%n",
        "x" * 5000,
        "job name",
        "-rf",
    ]
)
huge = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 65, 2**31, 1e308, -0.0]),
)
scalars = st.one_of(hostile_text, huge, st.booleans(), st.text(max_size=15))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=5)


@st.composite
def documents(draw: st.DrawFn, base: Path) -> dict[str, Any]:
    """A valid job spec with 0-3 mutations: a key replaced by a hostile value or a value of another type, a
    required key dropped, or an unknown key added. Unmutated documents are accepted, so the safety checks on
    accepted specs run too."""
    py = sys.executable
    doc: dict[str, Any] = {
        "name": draw(st.from_regex(NAME, fullmatch=True)),
        "argv": [py, "train.py", "--epochs", "3"],
        "user": USER,
        "working_dir": draw(st.sampled_from([str(base / "work"), str(base)])),
        "checkpoint_dir": draw(st.sampled_from(["ckpt", str(base / "work" / "ckpt")])),
        "launcher": draw(st.sampled_from(["plain", "torchrun"])),
        "env": draw(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), st.text(max_size=8))),
        "ranks": {"min": 1, "max": draw(st.integers(1, 64)), "start": 1},
        "need": draw(st.sampled_from([{"profile": "1g.18gb"}, {"memory_gib": 10.5}, {"compute_slices": 2}])),
        "hook": {"signal": draw(st.sampled_from(["SIGUSR1", "SIGUSR2", "SIGTERM"])), "ack_timeout_s": 60},
    }
    hostile: dict[str, st.SearchStrategy[Any]] = {
        "name": hostile_text,
        "argv": st.one_of(
            st.sampled_from(
                [
                    "python train.py",
                    ["/bin/sh", "-c", "id"],
                    ["bash"],
                    ["/usr/bin/env", "python"],
                    ["python; id"],
                    [],
                    ["../../bin/sh"],
                    [py, "x\x00"],
                    ["nonexistent-program"],
                    [py] * 300,
                ]
            ),
            st.lists(hostile_text, min_size=1, max_size=4),
        ),
        "user": st.sampled_from(["nobody-such", "Root", "../root", "root\n", "0", ""]),
        "group": st.sampled_from(["nosuchgroup", "wheel;id", ""]),
        "working_dir": st.sampled_from(
            ["/", "/etc", str(base / ".." / ".."), str(base / "escape"), "../../..", "/proc/self", ""]
        ),
        "checkpoint_dir": st.sampled_from(["/tmp", "../../../etc", str(base / "escape" / "x"), "/"]),
        "launcher": st.sampled_from(["mpirun", "sh", "", "Plain"]),
        "env": st.dictionaries(
            st.sampled_from([*sorted(RESERVED_ENV), "FLEXMIG_ACK_PATH", "TORCHELASTIC_X", "A=B", "1X", ""]),
            st.one_of(hostile_text, huge),
            min_size=1,
            max_size=2,
        ),
        "ranks": st.dictionaries(
            st.sampled_from(["min", "max", "start", "count"]), st.one_of(huge, hostile_text), min_size=1, max_size=3
        ),
        "need": st.dictionaries(
            st.sampled_from(["profile", "memory_gib", "compute_slices", "gpus"]),
            st.one_of(hostile_text, huge, st.sampled_from(["9g.1tb", "1g.18gb;id", "MIG 1g.18gb"])),
            max_size=2,
        ),
        "hook": st.dictionaries(
            st.sampled_from(["signal", "ack_timeout_s", "exit_timeout_s", "command"]),
            st.one_of(st.sampled_from(["SIGKILL", "SIGSTOP", "9", "USR2", "KILL"]), huge, hostile_text),
            min_size=1,
            max_size=3,
        ),
    }
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["hostile", "hostile", "type", "drop", "unknown"]))
        key = draw(st.sampled_from(sorted(hostile)))
        if kind == "hostile":
            doc[key] = draw(hostile[key])
        elif kind == "type":
            doc[key] = draw(values)
        elif kind == "drop":
            doc.pop(key, None)
        else:
            doc[draw(st.sampled_from(["shell", "command", "script", "Name", "root"]))] = draw(values)
    return doc


# ------------------------------------------------------------------------------------------------ checks
def assert_safe(spec: JobSpec, base: Path) -> None:
    """What an accepted spec may never do."""
    assert NAME.fullmatch(spec.name)
    prog = Path(spec.argv[0])
    assert prog.is_absolute() and prog.name not in SHELLS
    assert not any(ch in spec.argv[0] for ch in ";&|`$<>(){}*?[]!~#\\\"' \t\n\r\x00")
    assert all("\x00" not in a for a in spec.argv)
    root = Path(os.path.realpath(base))
    for d in (spec.working_dir, spec.checkpoint_dir):
        assert d == root or root in d.parents, f"{d} escapes {root}"
    assert not any(k in RESERVED_ENV or k.startswith(("FLEXMIG_", "TORCHELASTIC_")) for k, _ in spec.env)
    assert 1 <= spec.ranks_min <= spec.ranks_start <= spec.ranks_max <= 64
    assert 0 < spec.hook.ack_timeout_s <= 86400 and 0 < spec.hook.exit_timeout_s <= 3600
    assert spec.hook.signal not in (signal.SIGKILL, signal.SIGSTOP)


def check(text: str, base: Path, source: Path, *, parsed: bool) -> None:
    """Parse ``text``: a safe spec, or a JobSpecError naming the file (and the key when the TOML was valid)."""
    before = snapshot(base)
    try:
        spec = parse_job_spec(text, JobPolicy((base,)), source=source)
    except JobSpecError as exc:
        event("refused")
        message = str(exc)
        assert message.startswith(f"{source}"), message
        if parsed:
            assert re.match(rf"{re.escape(str(source))}(:\d+)?: \S.*?: \S", message, re.S), message
        else:
            assert re.match(rf"{re.escape(str(source))}(:\d+)?: ", message), message
    else:
        event("accepted")
        assert_safe(spec, base)
    assert snapshot(base) == before, "parsing a spec acted on something"


@FUZZ
@given(st.data())
def test_structured_documents_give_a_safe_spec_or_an_error_naming_file_and_key(
    allowed: Path, data: st.DataObject
) -> None:
    doc = data.draw(documents(allowed))
    check(dump(doc), allowed, allowed / "job.toml", parsed=True)


@FUZZ
@given(st.text(max_size=400))
def test_arbitrary_text_gives_a_safe_spec_or_an_error_naming_the_file(allowed: Path, text: str) -> None:
    check(text, allowed, allowed / "job.toml", parsed=False)


lines = st.one_of(
    st.sampled_from(
        ["[ranks]", "[need]", "[hook]", "[env]", "[[argv]]", "[need", '"""', "'''", 'argv = """', "a.b.c = 1"]
    ),
    st.builds(
        lambda k, v: f"{k} = {v}",
        st.sampled_from(["name", "argv", "user", "working_dir", "min", "profile", "signal", "LD_PRELOAD", "x"]),
        st.sampled_from(['"j"', '["/bin/sh"]', "1", "-1", "1e999", "nan", "true", "[1,", "{a=1}", '"$(id)"']),
    ),
    st.text(max_size=20),
)


@FUZZ
@given(st.lists(lines, max_size=15))
def test_toml_ish_line_soup_gives_a_safe_spec_or_an_error_naming_the_file(allowed: Path, soup: list[str]) -> None:
    check("\n".join(soup), allowed, allowed / "job.toml", parsed=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300) | st.just(b"x" * (64 * 1024 + 1)) | st.just(b'name = "\xff"\n'))
def test_any_file_gives_a_safe_spec_or_an_error_naming_the_file(allowed: Path, data: bytes) -> None:
    path = allowed / "fuzzed.toml"
    path.write_bytes(data)
    path.chmod(0o644)
    try:
        try:
            spec = load_job_spec(path, JobPolicy((allowed,)))
        except JobSpecError as exc:
            assert str(exc).startswith(str(path)), exc
        else:
            assert_safe(spec, allowed)
    finally:
        path.unlink()


def test_a_spec_file_others_may_write_is_refused_whatever_it_holds(allowed: Path) -> None:
    path = allowed / "open.toml"
    path.write_text(f'name = "j"\nargv = ["{sys.executable}"]\nuser = "{USER}"\n')
    path.chmod(0o666)
    try:
        with pytest.raises(JobSpecError, match=r"lets group or others write it"):
            load_job_spec(path, JobPolicy((allowed,)))
    finally:
        path.unlink()
