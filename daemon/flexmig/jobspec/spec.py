"""Job specs: what a job is, read from a TOML file and checked before anything runs.

A spec file steers a daemon that may run as root, so it is treated like configuration: the file must be owned by
root or the daemon's user and writable by nobody else, every key is known and typed, the command is an argv list
(never a shell string, never a shell), names hold no shell metacharacters, and every directory lies inside the
directories the operator allowed. A spec with faults raises one :class:`~flexmig.errors.JobSpecError` that names
every one of them, a line each: the file, the key and, where it can be found, the line (a misspelt key with the
key it was probably meant to be). The keys are documented in docs/jobs.md ("Job specs").
"""

from __future__ import annotations

import difflib
import grp
import math
import os
import pwd
import re
import signal
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from flexmig.config.keys import find_key_line, join_key
from flexmig.config.problems import ConfigFileError, type_name
from flexmig.config.trusted import read_trusted_text
from flexmig.errors import JobSpecError
from flexmig.jobspec.programs import shell_reason
from flexmig.mig.catalogue import MODELS, GpuModel, Profile
from flexmig.mig.need import fitting_profile, need_mib
from flexmig_hook.protocol import ALLOWED_SIGNALS, parse_signal

__all__ = [
    "RESERVED_ENV",
    "HookSettings",
    "JobPolicy",
    "JobSpec",
    "LauncherKind",
    "NeedSpec",
    "load_job_spec",
    "parse_job_spec",
    "recheck_spec",
]

_T = TypeVar("_T")

#: How a job's ranks are started: ``plain`` runs argv once per rank, ``torchrun`` through torch elastic.
LauncherKind = Literal["plain", "torchrun"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\$?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SHELL_META = set(";&|`$<>(){}*?[]!~#\\\"' \t\n\r\x00")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "busybox", "env"})
#: Variables the daemon sets for every rank; a spec may not override them.
RESERVED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
    }
)
_MAX_ARGV = 256
_MAX_ARG_LEN = 4096
_MAX_SPEC_BYTES = 64 * 1024

_TOP_KEYS = frozenset(
    {"name", "argv", "user", "group", "working_dir", "checkpoint_dir", "launcher", "env", "runtime_s"}
)
_MAX_RUNTIME_S = 366 * 86400.0
_TABLES = {
    "ranks": frozenset({"min", "max", "start"}),
    "need": frozenset({"profile", "memory_gib", "compute_slices"}),
    "hook": frozenset({"signal", "ack_timeout_s", "exit_timeout_s", "standby", "standby_timeout_s", "keep"}),
}


@dataclass(frozen=True, slots=True)
class JobPolicy:
    """What the operator allows job specs to do (from the daemon's configuration).

    ``allowed_dirs``: working and checkpoint directories must lie inside one of them (after resolving symlinks).
    ``trusted_uids``: owners a spec file may have (root and the daemon's user by default).
    ``check_permissions``: off only for specs that never touched a file (tests of the parser itself).
    ``default_ack_timeout_s``: the acknowledgement timeout of specs that do not set ``hook.ack_timeout_s``
    (``jobs.ack_timeout_s`` in the daemon's configuration).
    """

    allowed_dirs: tuple[Path, ...]
    trusted_uids: frozenset[int] = field(default_factory=lambda: frozenset({0, os.geteuid()}))
    check_permissions: bool = True
    default_ack_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class NeedSpec:
    """A spec's ``[need]`` table: what one rank needs, a named MIG profile or memory (GiB) and compute slices.

    :meth:`profile_on` picks the profile by the one rule of :func:`flexmig.mig.need.fitting_profile`, which the
    planner follows too (through :func:`flexmig.act.planview.job_request`).
    """

    profile: str | None = None
    memory_gib: float | None = None
    compute_slices: int | None = None

    def describe(self) -> str:
        """For messages: ``1g.18gb`` or ``>= 10 GiB, >= 1 compute slice(s)``."""
        if self.profile:
            return self.profile
        return f">= {self.memory_gib or 0:g} GiB, >= {self.compute_slices or 1} compute slice(s)"

    def profile_on(self, model: GpuModel) -> Profile:
        """The profile a rank gets on ``model``; ValueError when no profile of that model can satisfy the need."""
        if self.profile:
            return model.profile(self.profile)  # KeyError lists the model's profiles
        try:
            fit = fitting_profile(model, need_mib(self.memory_gib or 0.0), self.compute_slices or 1)
        except ValueError:  # not a finite amount of memory
            fit = None
        if fit is None:
            raise ValueError(f"no MIG profile of {model.key} offers {self.describe()}")
        return fit

    def possible_anywhere(self) -> bool:
        """True when some supported GPU model has a profile that satisfies this need."""
        for m in MODELS:
            try:
                self.profile_on(m)
            except (KeyError, ValueError):
                continue
            return True
        return False


@dataclass(frozen=True, slots=True)
class HookSettings:
    """The checkpoint hook's settings for one job."""

    signal: signal.Signals = signal.SIGUSR1
    ack_timeout_s: float = 300.0  # no acknowledgement within this: the move is cancelled, the job keeps running
    exit_timeout_s: float = 30.0  # after the acknowledgement, how long ranks get to exit 0
    standby: bool = False
    """Start the next generation's ranks on a move's targets before the current one checkpoints (the job's script
    calls ``flexmig_hook.install()`` after its start-up; docs/jobs.md, "Standby ranks")."""
    standby_timeout_s: float = 120.0
    """How long a move waits for its standby ranks to be ready before it asks for the checkpoint anyway."""
    keep: int = 2
    """Checkpoints of a series rank 0 keeps after acknowledging one (the acknowledged one and the newest before it;
    0: all): a job moved twice an hour would otherwise leave 48 a day."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job: run ``argv`` as ``user``, one process per MIG instance, ``ranks_min..ranks_max`` of them."""

    name: str
    argv: tuple[str, ...]
    user: str
    group: str | None
    working_dir: Path
    checkpoint_dir: Path
    ranks_min: int
    ranks_max: int
    ranks_start: int
    need: NeedSpec
    launcher: LauncherKind = "plain"
    hook: HookSettings = HookSettings()
    env: tuple[tuple[str, str], ...] = ()
    source: Path | None = None
    runtime_s: float | None = None
    """How long the job is expected to run at its start shape, if its owner says (``runtime_s``): the planner weighs
    a move by the wait it spares and the time the running jobs have left, and without it assumes
    ``unknown_wait_s``."""

    @property
    def ack_path(self) -> Path:
        """Where rank 0 acknowledges checkpoints (``FLEXMIG_ACK_PATH``)."""
        return self.checkpoint_dir / "flexmig-ack.json"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (the daemon keeps it in its journal so a restart needs no spec file)."""
        need: dict[str, Any] = {}
        if self.need.profile:
            need["profile"] = self.need.profile
        if self.need.memory_gib is not None:
            need["memory_gib"] = self.need.memory_gib
        if self.need.compute_slices is not None:
            need["compute_slices"] = self.need.compute_slices
        out: dict[str, Any] = {
            "name": self.name,
            "argv": list(self.argv),
            "user": self.user,
            "working_dir": str(self.working_dir),
            "checkpoint_dir": str(self.checkpoint_dir),
            "launcher": self.launcher,
            "env": dict(self.env),
            "ranks": {"min": self.ranks_min, "max": self.ranks_max, "start": self.ranks_start},
            "need": need,
            "hook": {
                "signal": self.hook.signal.name,
                "ack_timeout_s": self.hook.ack_timeout_s,
                "exit_timeout_s": self.hook.exit_timeout_s,
                "standby": self.hook.standby,
                "standby_timeout_s": self.hook.standby_timeout_s,
                "keep": self.hook.keep,
            },
        }
        if self.group:
            out["group"] = self.group
        if self.runtime_s is not None:
            out["runtime_s"] = self.runtime_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: Path | None = None) -> JobSpec:
        """Rebuild a spec from :meth:`to_dict` output, checking structure and names again (not file permissions).

        Its directories are taken as stored, never resolved again: they were resolved when the spec was submitted,
        and resolving them now would follow a symlink the job's user has put there since (the checkpoint
        directory's parent swapped for a link to a root-owned directory: root would make the next checkpoint
        directory there, and hand it to the user)."""
        return _build(dict(data), source, source.parent if source else Path("/"), None, None, resolve=False)


class _Ctx:
    """Where we are while validating: the file (for messages), its text (to find lines), and the problems found so
    far: checking goes on after a problem, so one round names every problem of the spec."""

    def __init__(self, source: Path | None, text: str | None, label: str | None = None) -> None:
        self.source = source
        self.text = text
        self.problems: list[tuple[int | None, str]] = []
        self.meant: set[str] = set()
        """Keys that misspelt keys were probably meant to be: their absence is not reported again."""
        self.label = label

    def fail(self, key: str, why: str, *, at: str | None = None) -> JobSpecError:
        """The error for ``key``, with the line where ``at`` (default: ``key``; a dotted TOML key) is set."""
        where = self.label or (str(self.source) if self.source else "<job spec>")
        line = find_key_line(self.text, at or key) if self.text else None
        shown = f":{line}" if line else ""
        return _Problem(f"{where}{shown}: {key}: {why}", line)

    def note(self, error: JobSpecError) -> None:
        """Record a problem and go on."""
        if not isinstance(error, _Told):
            self.problems.append((error.line if isinstance(error, _Problem) else None, str(error)))

    def attempt(self, check: Callable[[], _T], default: _T) -> _T:
        """``check()``, or ``default`` when it found a problem (recorded); the checks that build on a value that
        failed are skipped by their callers, so a fault is reported once, not again as the faults it causes."""
        try:
            return check()
        except JobSpecError as exc:
            self.note(exc)
            return default

    def raise_problems(self) -> None:
        """One JobSpecError listing every problem recorded, one line each, in the order of the file."""
        if self.problems:
            ordered = sorted(self.problems, key=lambda p: (p[0] is None, p[0] or 0))
            raise JobSpecError("\n".join(text for _, text in ordered))


class _Problem(JobSpecError):
    """One problem of a spec, with the line it is on (None where the key cannot be found)."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


class _Told(JobSpecError):
    """A problem already reported in other words (a required key that a misspelt key stood for)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")


def _unknown(known: Collection[str], name: str, where: str) -> str:
    """``unknown key (did you mean 'argv'?)``, or the known keys when nothing is close."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key ({where}: {', '.join(sorted(known))})"


def load_job_spec(path: Path, policy: JobPolicy) -> JobSpec:
    """Read, check and return the job spec at ``path``; JobSpecError names the file, key and line of any fault.

    The file is read as the daemon's configuration is (:func:`~flexmig.config.trusted.read_trusted_text`): a spec
    someone else could have written, anything but an ordinary file, and a file over 64 KiB are refused unread.
    Blocks on the file system: the daemon calls it off its event loop.
    """
    path = Path(path).absolute()
    try:
        text = read_trusted_text(
            path,
            what="job spec",
            max_bytes=_MAX_SPEC_BYTES,
            trusted_uids=policy.trusted_uids,
            check_permissions=policy.check_permissions,
        )
    except ConfigFileError as exc:
        raise JobSpecError(str(exc)) from None
    return parse_job_spec(text, policy, source=path)


def parse_job_spec(text: str, policy: JobPolicy, source: Path | None = None) -> JobSpec:
    """Parse and check a spec from TOML text; ``source`` names it in errors and anchors relative paths."""
    ctx = _Ctx(source, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where = str(source) if source else "<job spec>"
        raise JobSpecError(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        where = str(source) if source else "<job spec>"
        raise JobSpecError(f"{where}: not valid TOML: nested too deeply") from None
    except ValueError as exc:  # tomllib's int() of more than 4,300 digits raises a plain ValueError
        where = str(source) if source else "<job spec>"
        raise JobSpecError(f"{where}: not valid TOML: {exc}") from None
    base = source.parent if source else Path.cwd()
    return _build(data, source, base, ctx, policy)


def recheck_spec(spec: JobSpec, policy: JobPolicy, where: str) -> JobSpec:
    """``spec`` as read back from the daemon's journal, checked again exactly as a submitted spec file is, against
    ``policy`` as it is now: argv (never a shell), names, the user and group on this node, directories inside
    ``allowed_dirs``. JobSpecError ``<where>: <key>: <why>`` otherwise; the checked spec (same source) if it passes.
    """
    checked = _build(spec.to_dict(), None, Path("/"), _Ctx(None, None, where), policy, resolve=False)
    return replace(checked, source=spec.source)


def _tables(c: _Ctx, data: dict[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The spec's tables (an empty one for each absent or malformed one), noting every unknown key and what it may
    have meant."""
    for key in data:
        if key not in _TOP_KEYS and key not in _TABLES:
            c.note(c.fail(key, _unknown(_TOP_KEYS | set(_TABLES), key, "known keys"), at=join_key("", key)))
            c.meant.update(difflib.get_close_matches(key, sorted(_TOP_KEYS | set(_TABLES)), n=1, cutoff=0.6))
    tables: dict[str, Mapping[str, Any]] = {}
    for table, keys in _TABLES.items():
        sub = data.get(table, {})
        if not isinstance(sub, dict):
            c.note(c.fail(table, f"must be a table ([{table}]), not {type_name(sub)}"))
            sub = {}
        tables[table] = sub
        for key in sub:
            if key not in keys:
                why = _unknown(keys, key, f"known keys in [{table}]")
                c.note(c.fail(f"{table}.{key}", why, at=join_key(table, key)))
                c.meant.update(f"{table}.{k}" for k in difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6))
    return tables


def _build(
    data: dict[str, Any],
    source: Path | None,
    base: Path,
    ctx: _Ctx | None,
    policy: JobPolicy | None,
    *,
    resolve: bool = True,
) -> JobSpec:
    c = ctx or _Ctx(source, None)
    tables = _tables(c, data)
    name = c.attempt(lambda: _name(c, data), None)
    argv = c.attempt(lambda: _argv(c, data), None)
    user = c.attempt(lambda: _user(c, data, "user", required=True), None)
    group = c.attempt(lambda: _user(c, data, "group") or None, None)
    working_dir = c.attempt(lambda: _dir(c, data, "working_dir", base, required=True, resolve=resolve), None)
    checkpoint_dir = c.attempt(
        lambda: _dir(c, data, "checkpoint_dir", working_dir or base, required=True, resolve=resolve), None
    )
    launcher = c.attempt(lambda: _launcher(c, data), "plain")
    if launcher == "torchrun" and argv is not None and len(argv) < 2:
        c.note(c.fail("argv", "with launcher 'torchrun', argv is [PYTHON, SCRIPT, ARGS...]"))
    elif argv is not None and working_dir is not None:
        given, cwd = argv, working_dir
        argv = c.attempt(lambda: _resolve_program(c, given, cwd), None)
    env = _env(c, data)
    ranks = _ranks(c, tables["ranks"])
    need = c.attempt(lambda: _need(c, tables["need"]), None)
    hook = c.attempt(lambda: _hook(c, tables["hook"], policy.default_ack_timeout_s if policy else 300.0), None)
    runtime_s = c.attempt(lambda: _runtime(c, data), None)
    if hook is not None and hook.standby and launcher == "torchrun":
        c.note(
            c.fail(
                "hook.standby",
                "needs launcher 'plain': torchrun starts the script only after its own rendezvous, so its "
                "ranks cannot do their start-up before the move",
            )
        )

    if policy is not None:
        for key, d in (("working_dir", working_dir), ("checkpoint_dir", checkpoint_dir)):
            if d is not None and not _inside(d, policy.allowed_dirs):
                allowed = ", ".join(str(p) for p in policy.allowed_dirs) or "(none configured)"
                c.note(c.fail(key, f"{d} is outside the allowed directories: {allowed}"))
        if user is not None:
            c.attempt(lambda: _check_user(c, user, group), None)
        if argv is not None:
            shell = shell_reason(argv[0])  # by what the program resolves to; the launcher checks again
            if shell is not None:
                c.note(c.fail("argv", shell))

    c.raise_problems()
    assert name is not None and argv is not None and user is not None and ranks is not None
    assert working_dir is not None and checkpoint_dir is not None and need is not None and hook is not None
    return JobSpec(
        name=name,
        argv=argv,
        user=user,
        group=group,
        working_dir=working_dir,
        checkpoint_dir=checkpoint_dir,
        ranks_min=ranks[0],
        ranks_max=ranks[1],
        ranks_start=ranks[2],
        need=need,
        launcher="torchrun" if launcher == "torchrun" else "plain",
        hook=hook,
        env=env,
        source=source,
        runtime_s=runtime_s,
    )


def _runtime(c: _Ctx, data: Mapping[str, Any]) -> float | None:
    if "runtime_s" not in data:
        return None
    v = _num(c, data, "runtime_s", "runtime_s", 0.0)
    if not 0 < v <= _MAX_RUNTIME_S:
        raise c.fail("runtime_s", f"must be in (0, {_MAX_RUNTIME_S:.0f}] seconds, not {v:g}")
    return v


def _name(c: _Ctx, data: Mapping[str, Any]) -> str:
    name = _str(c, data, "name", required=True)
    if not _NAME.match(name):
        raise c.fail("name", f"{name!r} must be 1-64 letters, digits, '_', '.', '-', starting with a letter or digit")
    return name


def _user(c: _Ctx, data: Mapping[str, Any], key: str, *, required: bool = False) -> str:
    """``user`` or ``group``: a name as useradd allows it (empty when absent and not required)."""
    text = _str(c, data, key, required=required)
    if text and not _USER.match(text):
        raise c.fail(key, f"{text!r} is not a valid {key} name")
    return text


def _launcher(c: _Ctx, data: Mapping[str, Any]) -> str:
    launcher = _str(c, data, "launcher") or "plain"
    if launcher not in ("plain", "torchrun"):
        raise c.fail("launcher", f"{launcher!r} is not 'plain' or 'torchrun'")
    return launcher


def _ranks(c: _Ctx, ranks: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(min, max, start), each checked; their rules between them only once all three are integers."""
    rmin = c.attempt(lambda: _int(c, ranks, "ranks.min", "min", default=1), None)
    rmax = c.attempt(lambda: _int(c, ranks, "ranks.max", "max", default=rmin or 1), None)
    rstart = c.attempt(lambda: _int(c, ranks, "ranks.start", "start", default=rmin or 1), None)
    if rmin is None or rmax is None or rstart is None:
        return None
    before = len(c.problems)
    if rmin < 1:
        c.note(c.fail("ranks.min", f"must be at least 1, not {rmin}"))
    elif rmax < rmin:
        c.note(c.fail("ranks.max", f"{rmax} is less than ranks.min {rmin}"))
    if rmax > 64:
        c.note(c.fail("ranks.max", f"{rmax} ranks is more than a node of 8 GPUs x 7 instances can hold"))
    if rmin >= 1 and rmin <= rmax and not rmin <= rstart <= rmax:
        c.note(c.fail("ranks.start", f"{rstart} is outside ranks.min..ranks.max ({rmin}..{rmax})"))
    return (rmin, rmax, rstart) if len(c.problems) == before else None


def _str(c: _Ctx, data: Mapping[str, Any], key: str, required: bool = False) -> str:
    if key not in data:
        if required:
            raise (_Told if key in c.meant else c.fail)(key, "is required")
        return ""
    v = data[key]
    if not isinstance(v, str):
        raise c.fail(key, f"must be a string, not {type_name(v)}")
    if "\x00" in v or "\n" in v:
        raise c.fail(key, "must not contain NUL or newline characters")
    return v


def _int(c: _Ctx, table: Mapping[str, Any], dotted: str, key: str, default: int) -> int:
    v = table.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise c.fail(dotted, f"must be an integer, not {type_name(v)}")
    return v


def _num(c: _Ctx, table: Mapping[str, Any], dotted: str, key: str, default: float) -> float:
    v = table.get(key, default)
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise c.fail(dotted, f"must be a number, not {type_name(v)}")
    try:
        out = float(v)
    except OverflowError:  # an integer past the largest float: TOML allows it, no setting needs it
        raise c.fail(dotted, "is out of range") from None
    if not math.isfinite(out):
        raise c.fail(dotted, f"must be a finite number, not {out}")
    return out


def _argv(c: _Ctx, data: Mapping[str, Any]) -> tuple[str, ...]:
    if "argv" not in data:
        raise (_Told if "argv" in c.meant else c.fail)("argv", "is required")
    v = data["argv"]
    if isinstance(v, str):
        raise c.fail("argv", "must be a list of arguments, not a string: flexmig never runs a shell")
    if not isinstance(v, list) or not v:
        raise c.fail("argv", f"must be a non-empty list of strings, not {type_name(v)}")
    if len(v) > _MAX_ARGV:
        raise c.fail("argv", f"more than {_MAX_ARGV} arguments")
    for i, a in enumerate(v):
        if not isinstance(a, str):
            raise c.fail("argv", f"argument {i} must be a string, not {type_name(a)}")
        if "\x00" in a or len(a) > _MAX_ARG_LEN:
            raise c.fail("argv", f"argument {i} holds a NUL character or is longer than {_MAX_ARG_LEN}")
    prog = v[0]
    if not prog or any(ch in _SHELL_META for ch in prog):
        raise c.fail("argv", f"program {prog!r} contains shell metacharacters; give the program's path alone")
    if Path(prog).name in _SHELLS:
        raise c.fail("argv", f"program {prog!r} is a shell or a shell launcher; flexmig never runs a shell")
    return tuple(v)


def _resolve_program(c: _Ctx, argv: tuple[str, ...], working_dir: Path) -> tuple[str, ...]:
    """Make argv[0] absolute: relative paths against the working directory, bare names against a fixed PATH."""
    prog = argv[0]
    if "/" in prog:
        path = Path(prog) if Path(prog).is_absolute() else working_dir / prog
        return (os.path.normpath(path), *argv[1:])
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        cand = Path(d) / prog
        if cand.is_file() and os.access(cand, os.X_OK):
            return (str(cand), *argv[1:])
    raise c.fail("argv", f"program {prog!r} not found in /usr/local/bin, /usr/bin or /bin; give its path")


def _dir(
    c: _Ctx, data: Mapping[str, Any], key: str, base: Path, required: bool = False, *, resolve: bool = True
) -> Path:
    """A directory of the spec, absolute: resolved (``realpath``) when a spec is submitted, normalised only when it
    comes back from the journal (resolved then already; see :meth:`JobSpec.from_dict`)."""
    text = _str(c, data, key, required=required)
    p = Path(text)
    if not p.is_absolute():
        p = base / p
    return Path(os.path.realpath(p) if resolve else os.path.normpath(p))


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    for root in roots:
        r = Path(os.path.realpath(root))
        if path == r or r in path.parents:
            return True
    return False


def _env(c: _Ctx, data: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The ``env`` table; every variable with a problem is named (and left out)."""
    v = data.get("env", {})
    if not isinstance(v, dict):
        c.note(c.fail("env", f'must be a table of NAME = "value", not {type_name(v)}'))
        return ()
    out: list[tuple[str, str]] = []
    for k, val in v.items():
        if not _ENV_NAME.match(k):
            c.note(c.fail("env", f"variable name {k!r} is not a valid environment variable name"))
        elif k in RESERVED_ENV or k.startswith(("FLEXMIG_", "TORCHELASTIC_")):
            c.note(c.fail("env", f"{k} is set by flexmig and may not be overridden"))
        elif not isinstance(val, str):
            c.note(c.fail("env", f"{k} must be a string, not {type_name(val)}"))
        elif "\x00" in val:
            c.note(c.fail("env", f"{k} holds a NUL character"))
        else:
            out.append((k, val))
    return tuple(sorted(out))


def _need(c: _Ctx, need: Mapping[str, Any]) -> NeedSpec:
    profile = _str(c, need, "profile") or None
    mem = need.get("memory_gib")
    comp = need.get("compute_slices")
    if profile is None and mem is None and comp is None:
        if any(k.startswith("need.") for k in c.meant):
            raise _Told("need", "misspelt")
        raise c.fail("need", "give [need] profile, or memory_gib and/or compute_slices")
    if profile is not None and (mem is not None or comp is not None):
        raise c.fail("need.profile", "give either a profile or memory_gib/compute_slices, not both")
    if mem is not None:
        mem = _num(c, need, "need.memory_gib", "memory_gib", 0.0)
        if mem <= 0:
            raise c.fail("need.memory_gib", f"must be positive, not {mem:g}")
    if comp is not None:
        comp = _int(c, need, "need.compute_slices", "compute_slices", 1)
        if comp not in (1, 2, 3, 4, 7):
            raise c.fail("need.compute_slices", f"{comp} is not a MIG compute size (1, 2, 3, 4 or 7)")
    rn = NeedSpec(profile=profile, memory_gib=mem, compute_slices=comp)
    if profile is not None:
        if any(ch in _SHELL_META for ch in profile):
            raise c.fail("need.profile", f"{profile!r} is not a MIG profile name")
        names = sorted({p.name for m in MODELS for p in m.profiles})
        if profile.removeprefix("MIG ") not in names:
            raise c.fail("need.profile", f"{profile!r} is no MIG profile of any supported GPU; one of {names}")
    elif not rn.possible_anywhere():
        raise c.fail("need", f"no MIG profile of any supported GPU offers {rn.describe()}")
    return rn


def _hook(c: _Ctx, hook: Mapping[str, Any], default_ack_s: float) -> HookSettings:
    sig = signal.SIGUSR1
    if "signal" in hook:
        text = _str(c, hook, "signal")
        try:
            sig = parse_signal(text)
        except ValueError:
            allowed = ", ".join(s.name for s in ALLOWED_SIGNALS)
            raise c.fail("hook.signal", f"{text!r} is not one of {allowed}") from None
    ack = _num(c, hook, "hook.ack_timeout_s", "ack_timeout_s", default_ack_s)
    ext = _num(c, hook, "hook.exit_timeout_s", "exit_timeout_s", 30.0)
    if not 0 < ack <= 86400:
        raise c.fail("hook.ack_timeout_s", f"must be in (0, 86400] seconds, not {ack:g}")
    if not 0 < ext <= 3600:
        raise c.fail("hook.exit_timeout_s", f"must be in (0, 3600] seconds, not {ext:g}")
    standby = hook.get("standby", False)
    if not isinstance(standby, bool):
        raise c.fail("hook.standby", f"must be true or false, not {type_name(standby)}")
    ready = _num(c, hook, "hook.standby_timeout_s", "standby_timeout_s", 120.0)
    if not 0 < ready <= 86400:
        raise c.fail("hook.standby_timeout_s", f"must be in (0, 86400] seconds, not {ready:g}")
    keep = _int(c, hook, "hook.keep", "keep", 2)
    if not 0 <= keep <= 1000:
        raise c.fail("hook.keep", f"must be 0 (keep every checkpoint) to 1000, not {keep}")
    return HookSettings(
        signal=sig, ack_timeout_s=ack, exit_timeout_s=ext, standby=standby, standby_timeout_s=ready, keep=keep
    )


def _check_user(c: _Ctx, user: str, group: str | None) -> None:
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise c.fail("user", f"no such user {user!r} on this node") from None
    if group is not None:
        try:
            grp.getgrnam(group)
        except KeyError:
            raise c.fail("group", f"no such group {group!r} on this node") from None
    euid = os.geteuid()
    if euid not in (0, pw.pw_uid):
        raise c.fail("user", f"the daemon runs as uid {euid}, not root, so it can run jobs only as itself")
