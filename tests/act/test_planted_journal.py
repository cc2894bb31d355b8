"""A journal someone else put in the state directory never makes flexmigd run anything, least of all as root.

A real unprivileged user (made with ``useradd`` for the test, removed after) plants a journal holding a pending
``start`` of a job with ``user = "root"`` whose only effect is to create a marker file. flexmigd in mode ``act``
on a simulated node refuses to start, with one line naming the state directory or the journal, leaves the planted
file exactly as it found it, and the marker never appears. A journal of the daemon's own whose job the current
policy no longer allows (a directory outside ``jobs.allowed_dirs``, a user the node does not have) starts the
daemon, but that job is not launched: it is marked failed, naming the journal row and the field.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.act.encoding import StartPayload, encode
from flexmig.act.journal import Journal
from flexmig.act.records import JobRecord, Slot
from flexmig.jobspec.spec import JobPolicy, parse_job_spec
from support.flexmigd import ActNode, short_base
from support.hostile import scratch_user
from support.jobs import kill_ranks
from support.wait import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: makes a user and runs flexmigd in mode act"),
]

SIM = "h200x1:1g.18gb@0"


@pytest.fixture
def intruder() -> Iterator[pwd.struct_passwd]:
    """A fresh unprivileged user, removed after the test."""
    with scratch_user("fmx") as user:
        yield user


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base("fm-plant-") as d:
        try:
            yield d
        finally:
            kill_ranks(d / "nothing.sqlite3", base=d)


def job_text(base: Path, name: str, user: str, working_dir: Path) -> str:
    return f"""\
name = "{name}"
argv = ["/usr/bin/touch", "{base}/marker-{name}"]
user = "{user}"
working_dir = "{working_dir}"
checkpoint_dir = "{working_dir}/ckpt"
[need]
profile = "1g.18gb"
"""


def write_journal(
    path: Path, base: Path, *, name: str = "evil", user: str = "root", working: Path | None = None
) -> None:
    """A journal holding job ``name`` (pending) and an unfinished plan that starts it on the node's 1g.18gb."""
    working = working or base
    working.mkdir(parents=True, exist_ok=True)
    spec = parse_job_spec(job_text(base, name, user, working), JobPolicy((base,), check_permissions=False))
    j = Journal(path)
    try:
        j.put_job(JobRecord(name=name, uid=uuid.uuid4().hex, spec=spec, state="pending", submitted_s=time.time()))
        j.begin_plan("control", [encode(StartPayload((Slot(0, 0, "1g.18gb"),), "planted"), name)])
    finally:
        j.close()


def run_daemon(node: ActNode, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """flexmigd on ``node``'s configuration, expected to refuse to start: its exit status (None if it was still
    running after ``timeout_s`` and had to be stopped) and output."""
    node.write_config()
    argv = [
        sys.executable, "-m", "flexmig.daemon", "--sim", node.spec, "--sim-state", str(node.sim_state),
        "--config", str(node.config), "--metrics-addr", f"127.0.0.1:{node.port}",
    ]  # fmt: skip
    env = {**os.environ, "NOTIFY_SOCKET": ""}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            proc.terminate()
            out, err = proc.communicate(timeout=60)
            code = None
    return subprocess.CompletedProcess(argv, code, out, err)  # type: ignore[arg-type]


def as_user(user: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=60, user=user.pw_uid, group=user.pw_gid)


def owner_and_mode(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, stat.S_IMODE(st.st_mode)


def test_a_journal_planted_in_a_world_writable_state_directory_is_refused_and_runs_nothing(
    base: Path, intruder: pwd.struct_passwd
) -> None:
    node = ActNode(base, SIM)
    state = node.journal.parent
    state.mkdir(mode=0o777)
    state.chmod(0o777)  # the mistake the attack needs
    scratch = base / "scratch"
    write_journal(scratch / "journal.sqlite3", base)
    scratch.chmod(0o755)
    (scratch / "journal.sqlite3").chmod(0o644)  # readable by the intruder, who copies it in as their own file
    as_user(intruder, "/bin/cp", str(scratch / "journal.sqlite3"), str(node.journal))
    planted = owner_and_mode(node.journal)
    assert planted[0] == intruder.pw_uid

    out = run_daemon(node)

    assert not (base / "marker-evil").exists(), "the planted job ran"
    assert out.returncode not in (0, None), out.stderr
    lines = [x for x in out.stderr.splitlines() if "error" in x.lower()]
    assert lines and f"state directory {state}: refused: mode 0777" in lines[-1]
    assert "Traceback" not in out.stderr
    assert not (base / "marker-evil").exists(), "the planted job ran"
    assert owner_and_mode(node.journal) == planted, "the planted file was changed"


def test_a_journal_of_another_user_in_a_private_state_directory_is_refused_as_it_is(
    base: Path, intruder: pwd.struct_passwd
) -> None:
    node = ActNode(base, SIM)
    drop = base / "drop"
    drop.mkdir()
    os.chown(drop, intruder.pw_uid, intruder.pw_gid)
    write_journal(base / "scratch" / "journal.sqlite3", base)
    (base / "scratch").chmod(0o755)
    (base / "scratch" / "journal.sqlite3").chmod(0o644)
    as_user(intruder, "/bin/cp", str(base / "scratch" / "journal.sqlite3"), str(drop / "journal.sqlite3"))
    state = node.journal.parent
    state.mkdir(mode=0o700)
    os.rename(drop / "journal.sqlite3", node.journal)  # owner kept: how a file of theirs may end up in ours
    planted = owner_and_mode(node.journal)

    out = run_daemon(node)

    assert out.returncode != 0
    assert f"{node.journal}: refused: owned by uid {intruder.pw_uid}, not by the daemon's user" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (base / "marker-evil").exists()
    assert owner_and_mode(node.journal) == planted


def test_a_state_directory_reached_through_a_symlink_is_refused(base: Path) -> None:
    node = ActNode(base, SIM)
    real = base / "elsewhere"
    real.mkdir(mode=0o700)
    write_journal(real / "journal.sqlite3", base)
    node.journal.parent.symlink_to(real)

    out = run_daemon(node)

    assert out.returncode != 0
    assert f"state directory {node.journal.parent}: refused: it is a symlink" in out.stderr
    assert not (base / "marker-evil").exists()


@pytest.mark.parametrize(
    ("field", "why"),
    [
        ("working_dir", "is outside the allowed directories"),
        ("user", "no such user 'nosuchuser' on this node"),
    ],
)
def test_a_journalled_job_the_current_policy_refuses_is_not_launched(base: Path, field: str, why: str) -> None:
    allowed = base / "jobs"
    node = ActNode(base, SIM, allowed=allowed)
    node.journal.parent.mkdir(mode=0o700)
    if field == "user":
        write_journal(node.journal, base, working=allowed)
        # The spec was valid when it was journalled; the node has no such user any more.
        with contextlib.closing(Journal(node.journal)) as j:
            rec = j.get_job("evil")
            assert rec is not None
            data = {**rec.spec.to_dict(), "user": "nosuchuser"}
            j.db.execute("UPDATE jobs SET spec=? WHERE name='evil'", (json.dumps(data),))
    else:
        write_journal(node.journal, base, working=base / "outside")  # allowed when written, not under jobs/ now
    node.start()
    try:
        jobs = wait_until(lambda: not node.unfinished_plans() and node.jobs(), what="the journalled plan to finish")
        job = jobs["evil"]
        assert job["state"] == "failed"
        assert f"{node.journal}: jobs row 'evil': spec: {field}:" in job["error"] and why in job["error"]
        assert not (base / "marker-evil").exists()
        assert node.stop() == 0
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
