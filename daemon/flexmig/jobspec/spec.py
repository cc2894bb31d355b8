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
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from flexmig.config.keys import join_key
from flexmig.config.problems import ConfigFileError, type_name
from flexmig.config.trusted import read_trusted_text
from flexmig.errors import JobSpecError
from flexmig.jobspec import readers
from flexmig.jobspec.context import SpecContext, unknown_key
from flexmig.jobspec.programs import shell_reason
from flexmig.jobspec.readers import RESERVED_ENV
from flexmig.jobspec.types import HookSettings, NeedSpec

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

#: How a job's ranks are started: ``plain`` runs argv once per rank, ``torchrun`` through torch elastic.
LauncherKind = Literal["plain", "torchrun"]

_MAX_SPEC_BYTES = 64 * 1024

_TOP_KEYS = frozenset(
    {"name", "argv", "user", "group", "working_dir", "checkpoint_dir", "launcher", "env", "runtime_s"}
)
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
    hook: HookSettings = HookSettings()  # noqa: RUF009  (frozen, so one shared default is safe)
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
    ctx = SpecContext(source, text)
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
    checked = _build(spec.to_dict(), None, Path("/"), SpecContext(None, None, where), policy, resolve=False)
    return replace(checked, source=spec.source)


def _tables(c: SpecContext, data: dict[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The spec's tables (an empty one for each absent or malformed one), noting every unknown key and what it may
    have meant."""
    for key in data:
        if key not in _TOP_KEYS and key not in _TABLES:
            c.note(c.fail(key, unknown_key(_TOP_KEYS | set(_TABLES), key, "known keys"), at=join_key("", key)))
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
                why = unknown_key(keys, key, f"known keys in [{table}]")
                c.note(c.fail(f"{table}.{key}", why, at=join_key(table, key)))
                c.meant.update(f"{table}.{k}" for k in difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6))
    return tables


def _build(
    data: dict[str, Any],
    source: Path | None,
    base: Path,
    ctx: SpecContext | None,
    policy: JobPolicy | None,
    *,
    resolve: bool = True,
) -> JobSpec:
    """The spec that ``data`` describes, every key read and checked (against ``policy`` where given); one
    JobSpecError naming every problem otherwise."""
    c = ctx or SpecContext(source, None)
    tables = _tables(c, data)
    name = c.attempt(lambda: readers.read_name(c, data), None)
    given = c.attempt(lambda: readers.read_argv(c, data), None)
    user = c.attempt(lambda: readers.read_user(c, data, "user", required=True), None)
    group = c.attempt(lambda: readers.read_user(c, data, "group") or None, None)
    working_dir, checkpoint_dir = _dirs(c, data, base, resolve=resolve)
    launcher = c.attempt(lambda: readers.read_launcher(c, data), "plain")
    argv = _command(c, given, launcher, working_dir)
    env = readers.read_env(c, data)
    ranks = readers.read_ranks(c, tables["ranks"])
    need = c.attempt(lambda: readers.read_need(c, tables["need"]), None)
    ack_s = policy.default_ack_timeout_s if policy else 300.0
    hook = c.attempt(lambda: readers.read_hook(c, tables["hook"], ack_s), None)
    runtime_s = c.attempt(lambda: readers.read_runtime(c, data), None)
    if hook is not None and hook.standby and launcher == "torchrun":
        c.note(
            c.fail(
                "hook.standby",
                "needs launcher 'plain': torchrun starts the script only after its own rendezvous, so its "
                "ranks cannot do their start-up before the move",
            )
        )
    if policy is not None:
        _check_policy(c, policy, dirs=(working_dir, checkpoint_dir), user=user, group=group, argv=argv)

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


def _dirs(c: SpecContext, data: Mapping[str, Any], base: Path, *, resolve: bool) -> tuple[Path | None, Path | None]:
    """The working directory (relative to ``base``) and the checkpoint directory (relative to the working one)."""
    working_dir = c.attempt(
        lambda: readers.read_directory(c, data, "working_dir", base, required=True, resolve=resolve), None
    )
    checkpoint_dir = c.attempt(
        lambda: readers.read_directory(c, data, "checkpoint_dir", working_dir or base, required=True, resolve=resolve),
        None,
    )
    return working_dir, checkpoint_dir


def _command(
    c: SpecContext, argv: tuple[str, ...] | None, launcher: str, working_dir: Path | None
) -> tuple[str, ...] | None:
    """``argv`` (None when it was refused), its program resolved in the working directory (torchrun's: PYTHON
    SCRIPT ARGS...)."""
    if launcher == "torchrun" and argv is not None and len(argv) < 2:
        c.note(c.fail("argv", "with launcher 'torchrun', argv is [PYTHON, SCRIPT, ARGS...]"))
    elif argv is not None and working_dir is not None:
        given, cwd = argv, working_dir
        argv = c.attempt(lambda: readers.resolve_program(c, given, cwd), None)
    return argv


def _check_policy(
    c: SpecContext,
    policy: JobPolicy,
    *,
    dirs: tuple[Path | None, Path | None],
    user: str | None,
    group: str | None,
    argv: tuple[str, ...] | None,
) -> None:
    """What the operator's policy adds: directories inside the allowed ones, a user of this node, no shell."""
    for key, d in zip(("working_dir", "checkpoint_dir"), dirs, strict=True):
        if d is not None and not readers.inside(d, policy.allowed_dirs):
            allowed = ", ".join(str(p) for p in policy.allowed_dirs) or "(none configured)"
            c.note(c.fail(key, f"{d} is outside the allowed directories: {allowed}"))
    if user is not None:
        c.attempt(lambda: readers.check_user(c, user, group), None)
    if argv is not None:
        shell = shell_reason(argv[0])  # by what the program resolves to; the launcher checks again
        if shell is not None:
            c.note(c.fail("argv", shell))
