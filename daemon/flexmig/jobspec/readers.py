"""The readers of a job spec's keys: each checks one key (or table) and returns its value, or raises the problem
through the :class:`~flexmig.jobspec.context.SpecContext` (file, key, line) for :mod:`flexmig.jobspec.spec` to
collect.
"""

from __future__ import annotations

import grp
import math
import os
import pwd
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flexmig.config.problems import type_name
from flexmig.hook.protocol import ALLOWED_SIGNALS, parse_signal
from flexmig.jobspec.context import SpecContext
from flexmig.jobspec.types import HookSettings, NeedSpec
from flexmig.mig.catalogue import MODELS

__all__ = [
    "RESERVED_ENV",
    "check_user",
    "inside",
    "read_argv",
    "read_directory",
    "read_env",
    "read_hook",
    "read_integer",
    "read_launcher",
    "read_name",
    "read_need",
    "read_number",
    "read_ranks",
    "read_runtime",
    "read_string",
    "read_user",
    "resolve_program",
]

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
_MAX_RUNTIME_S = 366 * 86400.0


def read_runtime(c: SpecContext, data: Mapping[str, Any]) -> float | None:
    """``runtime_s``: the expected run time in seconds, bounded; None when the spec leaves it out."""
    if "runtime_s" not in data:
        return None
    v = read_number(c, data, "runtime_s", "runtime_s", 0.0)
    if not 0 < v <= _MAX_RUNTIME_S:
        raise c.fail("runtime_s", f"must be in (0, {_MAX_RUNTIME_S:.0f}] seconds, not {v:g}")
    return v


def read_name(c: SpecContext, data: Mapping[str, Any]) -> str:
    """``name``: the job's name, letters, digits, ``_``, ``.`` and ``-`` only (it names files and topics)."""
    name = read_string(c, data, "name", required=True)
    if not _NAME.match(name):
        raise c.fail("name", f"{name!r} must be 1-64 letters, digits, '_', '.', '-', starting with a letter or digit")
    return name


def read_user(c: SpecContext, data: Mapping[str, Any], key: str, *, required: bool = False) -> str:
    """``user`` or ``group``: a name as useradd allows it (empty when absent and not required)."""
    text = read_string(c, data, key, required=required)
    if text and not _USER.match(text):
        raise c.fail(key, f"{text!r} is not a valid {key} name")
    return text


def read_launcher(c: SpecContext, data: Mapping[str, Any]) -> str:
    """``launcher``: ``plain`` or ``torchrun``."""
    launcher = read_string(c, data, "launcher") or "plain"
    if launcher not in ("plain", "torchrun"):
        raise c.fail("launcher", f"{launcher!r} is not 'plain' or 'torchrun'")
    return launcher


def read_ranks(c: SpecContext, ranks: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(min, max, start), each checked; their rules between them only once all three are integers."""
    rmin = c.attempt(lambda: read_integer(c, ranks, "ranks.min", "min", default=1), None)
    rmax = c.attempt(lambda: read_integer(c, ranks, "ranks.max", "max", default=rmin or 1), None)
    rstart = c.attempt(lambda: read_integer(c, ranks, "ranks.start", "start", default=rmin or 1), None)
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


def read_string(c: SpecContext, data: Mapping[str, Any], key: str, required: bool = False) -> str:
    """A string key, refused when of another type or missing while ``required``."""
    if key not in data:
        if required:
            raise c.missing(key)
        return ""
    v = data[key]
    if not isinstance(v, str):
        raise c.fail(key, f"must be a string, not {type_name(v)}")
    if "\x00" in v or "\n" in v:
        raise c.fail(key, "must not contain NUL or newline characters")
    return v


def read_integer(c: SpecContext, table: Mapping[str, Any], dotted: str, key: str, default: int) -> int:
    """An integer key of a table (``dotted`` names it in messages), ``default`` when absent."""
    v = table.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise c.fail(dotted, f"must be an integer, not {type_name(v)}")
    return v


def read_number(c: SpecContext, table: Mapping[str, Any], dotted: str, key: str, default: float) -> float:
    """A finite number key of a table (``dotted`` names it in messages), ``default`` when absent."""
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


def read_argv(c: SpecContext, data: Mapping[str, Any]) -> tuple[str, ...]:
    """``argv``: a list of strings, never a shell string or a shell, bounded in count and length."""
    if "argv" not in data:
        raise c.missing("argv")
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


def resolve_program(c: SpecContext, argv: tuple[str, ...], working_dir: Path) -> tuple[str, ...]:
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


def read_directory(
    c: SpecContext, data: Mapping[str, Any], key: str, base: Path, required: bool = False, *, resolve: bool = True
) -> Path:
    """A directory of the spec, absolute: resolved (``realpath``) when a spec is submitted, normalised only when it
    comes back from the journal (resolved then already; see :meth:`JobSpec.from_dict`)."""
    text = read_string(c, data, key, required=required)
    p = Path(text)
    if not p.is_absolute():
        p = base / p
    return Path(os.path.realpath(p) if resolve else os.path.normpath(p))


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """True when ``path`` lies inside one of ``roots``."""
    for root in roots:
        r = Path(os.path.realpath(root))
        if path == r or r in path.parents:
            return True
    return False


def read_env(c: SpecContext, data: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
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


def read_need(c: SpecContext, need: Mapping[str, Any]) -> NeedSpec:
    """The ``[need]`` table: a profile, or memory and compute slices that some GPU model can satisfy."""
    profile = read_string(c, need, "profile") or None
    mem = need.get("memory_gib")
    comp = need.get("compute_slices")
    if profile is None and mem is None and comp is None:
        if any(k.startswith("need.") for k in c.meant):
            raise c.told("need", "misspelt")
        raise c.fail("need", "give [need] profile, or memory_gib and/or compute_slices")
    if profile is not None and (mem is not None or comp is not None):
        raise c.fail("need.profile", "give either a profile or memory_gib/compute_slices, not both")
    if mem is not None:
        mem = read_number(c, need, "need.memory_gib", "memory_gib", 0.0)
        if mem <= 0:
            raise c.fail("need.memory_gib", f"must be positive, not {mem:g}")
    if comp is not None:
        comp = read_integer(c, need, "need.compute_slices", "compute_slices", 1)
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


def read_hook(c: SpecContext, hook: Mapping[str, Any], default_ack_s: float) -> HookSettings:
    """The ``[hook]`` table: signal, timeouts, standby and how many checkpoints to keep."""
    sig = signal.SIGUSR1
    if "signal" in hook:
        text = read_string(c, hook, "signal")
        try:
            sig = parse_signal(text)
        except ValueError:
            allowed = ", ".join(s.name for s in ALLOWED_SIGNALS)
            raise c.fail("hook.signal", f"{text!r} is not one of {allowed}") from None
    ack = read_number(c, hook, "hook.ack_timeout_s", "ack_timeout_s", default_ack_s)
    ext = read_number(c, hook, "hook.exit_timeout_s", "exit_timeout_s", 30.0)
    if not 0 < ack <= 86400:
        raise c.fail("hook.ack_timeout_s", f"must be in (0, 86400] seconds, not {ack:g}")
    if not 0 < ext <= 3600:
        raise c.fail("hook.exit_timeout_s", f"must be in (0, 3600] seconds, not {ext:g}")
    standby = hook.get("standby", False)
    if not isinstance(standby, bool):
        raise c.fail("hook.standby", f"must be true or false, not {type_name(standby)}")
    ready = read_number(c, hook, "hook.standby_timeout_s", "standby_timeout_s", 120.0)
    if not 0 < ready <= 86400:
        raise c.fail("hook.standby_timeout_s", f"must be in (0, 86400] seconds, not {ready:g}")
    keep = read_integer(c, hook, "hook.keep", "keep", 2)
    if not 0 <= keep <= 1000:
        raise c.fail("hook.keep", f"must be 0 (keep every checkpoint) to 1000, not {keep}")
    return HookSettings(
        signal=sig, ack_timeout_s=ack, exit_timeout_s=ext, standby=standby, standby_timeout_s=ready, keep=keep
    )


def check_user(c: SpecContext, user: str, group: str | None) -> None:
    """The user (and group) must exist on this node, and the user must not be root."""
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
