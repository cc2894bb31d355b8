"""The hook protocol's shared vocabulary: environment variable names, the acknowledgement, the signals.

Both sides use this module: the training script (through :mod:`flexmig_hook`) and the daemon (``flexmig.act``).
Standard library only. The names and the acknowledgement's JSON shape are a stable interface (docs/jobs.md,
"Checkpoint hook protocol"); change them only with a new protocol version.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flexmig_hook.boundedjson import JsonBoundsError
from flexmig_hook.boundedjson import loads as bounded_loads

__all__ = [
    "ACK_MAX_BYTES",
    "ACK_MAX_PATH",
    "ACK_MAX_STEP",
    "ALLOWED_SIGNALS",
    "ENV_ACK_PATH",
    "ENV_ACK_WAIT",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_KEEP",
    "ENV_CHECKPOINT_SIGNAL",
    "ENV_DIST_BACKEND",
    "ENV_GENERATION",
    "ENV_JOB",
    "ENV_JOB_ID",
    "ENV_RESUME",
    "ENV_RESUME_STEP",
    "ENV_SLOT",
    "ENV_STANDBY_FD",
    "HANDOVER_KEYS",
    "HANDOVER_MAX_BYTES",
    "READY_LINE",
    "Ack",
    "AckError",
    "FirstStep",
    "HandoverError",
    "decode_handover",
    "encode_handover",
    "first_step_path",
    "parse_signal",
    "read_ack",
    "read_first_step",
]

ENV_JOB = "FLEXMIG_JOB"
ENV_CHECKPOINT_DIR = "FLEXMIG_CHECKPOINT_DIR"
ENV_ACK_PATH = "FLEXMIG_ACK_PATH"
ENV_RESUME = "FLEXMIG_RESUME"
ENV_RESUME_STEP = "FLEXMIG_RESUME_STEP"
ENV_CHECKPOINT_SIGNAL = "FLEXMIG_CHECKPOINT_SIGNAL"
#: How many checkpoints of the acknowledged one's series to keep (``[hook] keep``; 0: all): rank 0 removes older
#: ones after acknowledging (:mod:`flexmig_hook.prune`).
ENV_CHECKPOINT_KEEP = "FLEXMIG_CHECKPOINT_KEEP"
#: Set by flexmig's Slurm TaskProlog: after acknowledging, wait this many seconds to be requeued instead of
#: returning (a batch job that exits on its own completes, and a completed job can no longer be requeued).
ENV_ACK_WAIT = "FLEXMIG_ACK_WAIT_S"
#: The collective backend the launcher recommends: ranks on MIG instances have no CUDA P2P between them and
#: NCCL's multi-rank-per-GPU mode is experimental (NCCL_MULTI_RANK_GPU_ENABLE, NCCL 2.30), so flexmig says ``gloo``.
ENV_DIST_BACKEND = "FLEXMIG_DIST_BACKEND"
#: Set only in a standby rank (a rank of the next generation started before the current one checkpoints): the file
#: descriptor of its channel to the daemon, a Unix stream socket. :func:`flexmig_hook.install` writes
#: :data:`READY_LINE` on it once the job's start-up is done, then blocks until the daemon writes the handover (one
#: JSON line, :func:`decode_handover`) or closes the channel (the move was cancelled, or the daemon went away).
ENV_STANDBY_FD = "FLEXMIG_STANDBY_FD"
# Reserved for the daemon: how it recognises its ranks after a restart. Jobs must not rely on them.
ENV_JOB_ID = "FLEXMIG_JOB_ID"
ENV_GENERATION = "FLEXMIG_GENERATION"
ENV_SLOT = "FLEXMIG_SLOT"

#: Signals a job may choose for checkpoint requests. SIGTERM and SIGKILL stay the daemon's for stopping.
ALLOWED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT)

#: An acknowledgement is one short JSON object; anything longer is refused unread.
ACK_MAX_BYTES = 64 * 1024
#: The largest step an acknowledgement may name (a 64-bit signed integer; ``FLEXMIG_RESUME_STEP`` carries it).
ACK_MAX_STEP = 2**63 - 1
#: The longest checkpoint path an acknowledgement may name (PATH_MAX on Linux).
ACK_MAX_PATH = 4096

#: What a standby rank writes on its channel when it is ready to be handed the new world.
READY_LINE = b"ready\n"
#: A handover is one short JSON line; anything longer is refused.
HANDOVER_MAX_BYTES = 64 * 1024
#: The variables a handover may set: the new world and the checkpoint to resume from. Nothing else (no
#: ``LD_PRELOAD``, no ``PATH``) can reach a job this way.
HANDOVER_KEYS = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        ENV_RESUME,
        ENV_RESUME_STEP,
    }
)


class AckError(ValueError):
    """An acknowledgement file exists but is not a valid acknowledgement; the message says what is wrong."""


class HandoverError(ValueError):
    """A handover line is not a valid handover; the message says what is wrong."""


def encode_handover(env: Mapping[str, str]) -> bytes:
    """The handover the daemon writes to a standby rank: ``{"env": {...}}`` and a newline."""
    data = json.dumps({"env": dict(env)}, sort_keys=True).encode() + b"\n"
    decode_handover(data)  # the daemon never writes what a job would refuse
    return data


def decode_handover(data: bytes) -> dict[str, str]:
    """The variables of a handover line; HandoverError names what is wrong (size, JSON, key, value)."""
    if len(data) > HANDOVER_MAX_BYTES:
        raise HandoverError(f"handover larger than {HANDOVER_MAX_BYTES} bytes")
    try:
        decoded = bounded_loads(data, max_bytes=HANDOVER_MAX_BYTES, max_depth=4)
    except JsonBoundsError as exc:
        raise HandoverError(f"handover is not JSON: {str(exc).removeprefix('not JSON: ')}") from None
    env = decoded.get("env") if isinstance(decoded, dict) else None
    if not isinstance(env, dict):
        raise HandoverError("handover is not a JSON object with an 'env' object")
    out: dict[str, str] = {}
    for key, value in env.items():
        if key not in HANDOVER_KEYS:
            raise HandoverError(f"handover sets {str(key)[:64]!r}, which it may not")
        if not isinstance(value, str) or "\x00" in value or len(value) > 4096:
            raise HandoverError(f"handover value of {key} must be a string of at most 4096 characters")
        out[key] = value
    return out


def parse_signal(text: str) -> signal.Signals:
    """``"SIGUSR1"``, ``"USR1"`` or ``"10"`` -> the signal, if it is one a job may use for checkpoints."""
    name = text.strip().upper()
    sig: signal.Signals | None = None
    if name.isdigit():
        try:
            sig = signal.Signals(int(name))
        except ValueError:
            sig = None
    else:
        full = name if name.startswith("SIG") else f"SIG{name}"
        sig = getattr(signal.Signals, full, None)
    if sig is None or sig not in ALLOWED_SIGNALS:
        allowed = ", ".join(s.name for s in ALLOWED_SIGNALS)
        raise ValueError(f"checkpoint signal {text!r} is not one of {allowed}")
    return sig


#: The latest wall-clock time a report may carry (year 2318): anything later is no time of this machine's.
_MAX_TIME_S = 2.0**33


def _time_or_none(data: dict[str, object], key: str, error: type[ValueError]) -> float | None:
    """``data[key]`` as a wall-clock time (seconds since the epoch), None when absent; ``error`` when it is not one."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < _MAX_TIME_S:
        raise error(f"'{key}' must be a time in seconds since the epoch, not {_short(value)}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Ack:
    """What rank 0 writes to ``FLEXMIG_ACK_PATH``: the last step the checkpoint holds, and where it is.

    ``step_done_s`` (optional): when that step ended (wall clock, ``time.time()``), the hook's last step boundary
    before the acknowledgement; the job's own downtime in a move is counted from it."""

    step: int
    checkpoint: str
    step_done_s: float | None = None

    def to_json(self) -> dict[str, object]:
        """The acknowledgement as written on disk."""
        out: dict[str, object] = {"step": self.step, "checkpoint": self.checkpoint}
        if self.step_done_s is not None:
            out["step_done_s"] = self.step_done_s
        return out

    @classmethod
    def from_json(cls, data: object) -> Ack:
        """Validate a decoded acknowledgement; AckError names the bad field."""
        if not isinstance(data, dict):
            raise AckError("acknowledgement is not a JSON object")
        step = data.get("step")
        ckpt = data.get("checkpoint")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= ACK_MAX_STEP:
            bound = f"a non-negative integer up to {ACK_MAX_STEP}"
            raise AckError(f"acknowledgement 'step' must be {bound}, not {_short(step)}")
        if not isinstance(ckpt, str) or not ckpt or "\x00" in ckpt or len(ckpt) > ACK_MAX_PATH:
            raise AckError(
                f"acknowledgement 'checkpoint' must be a non-empty path of at most {ACK_MAX_PATH} characters, "
                f"not {_short(ckpt)}"
            )
        done = _time_or_none(data, "step_done_s", AckError)
        return cls(step=step, checkpoint=ckpt, step_done_s=done)


def first_step_path(ack_path: Path) -> Path:
    """Where rank 0 of a resumed generation reports its first step (:class:`FirstStep`): beside the
    acknowledgement, so it goes wherever the acknowledgement goes and needs no channel of its own."""
    return ack_path.with_name(ack_path.name + ".first-step")


@dataclass(frozen=True, slots=True)
class FirstStep:
    """What rank 0 of a resumed generation writes once its first step is done: its generation
    (``FLEXMIG_GENERATION``) and when that step ended (wall clock). With the acknowledgement's ``step_done_s`` it
    gives the job's own downtime in the move: its last step before the checkpoint to its first step after it."""

    generation: int
    step_done_s: float

    def to_json(self) -> dict[str, object]:
        """The report as written on disk."""
        return {"generation": self.generation, "step_done_s": self.step_done_s}

    @classmethod
    def from_json(cls, data: object) -> FirstStep:
        """Validate a decoded report; AckError names the bad field."""
        if not isinstance(data, dict):
            raise AckError("first-step report is not a JSON object")
        gen = data.get("generation")
        if not isinstance(gen, int) or isinstance(gen, bool) or not 0 <= gen <= ACK_MAX_STEP:
            raise AckError(f"first-step report 'generation' must be a non-negative integer, not {_short(gen)}")
        done = _time_or_none(data, "step_done_s", AckError)
        if done is None:
            raise AckError("first-step report has no 'step_done_s'")
        return cls(generation=gen, step_done_s=done)


def _short(value: object) -> str:
    """``repr(value)``, cut to 80 characters: a message never carries a job's whole input."""
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 80 else f"{text[:77]}..."


def read_ack(path: Path, *, dir_fd: int | None = None) -> Ack | None:
    """The acknowledgement at ``path``, or None when there is none yet.

    The daemon may run as root while the job's user owns the directory, so the file is opened without following
    a symlink (relative to ``dir_fd``, a directory the caller opened safely, when given: ``path`` is then a name in
    it), must be a regular file of at most ``ACK_MAX_BYTES``, and is decoded within bounds (nesting, integer size:
    :mod:`flexmig_hook.boundedjson`). Whatever else is wrong with it (a directory, a FIFO, a step of 5,000 digits,
    JSON nested 100,000 deep, an I/O error) raises AckError, never anything else.
    """
    decoded = _read_bounded(path, dir_fd, "acknowledgement")
    return None if decoded is _ABSENT else Ack.from_json(decoded)


def read_first_step(path: Path, *, dir_fd: int | None = None) -> FirstStep | None:
    """The first-step report at ``path`` (:func:`first_step_path`), or None when there is none; read as
    :func:`read_ack` reads an acknowledgement, with the same refusals (AckError)."""
    decoded = _read_bounded(path, dir_fd, "first-step report")
    return None if decoded is _ABSENT else FirstStep.from_json(decoded)


_ABSENT = object()


def _read_bounded(path: Path, dir_fd: int | None, what: str) -> object:
    """The JSON at ``path``, decoded within bounds, ``_ABSENT`` when there is no file; AckError otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return _ABSENT
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AckError(f"{path}: {what} is a symbolic link; refused") from None
        raise AckError(f"{path}: cannot open {what}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise AckError(f"{path}: {what} is {kind}; refused")
        if st.st_size > ACK_MAX_BYTES:
            raise AckError(f"{path}: {what} larger than {ACK_MAX_BYTES} bytes")
        data = os.read(fd, ACK_MAX_BYTES + 1)
    except OSError as exc:
        raise AckError(f"{path}: cannot read {what}: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return bounded_loads(data, max_bytes=ACK_MAX_BYTES, max_depth=4)
    except JsonBoundsError as exc:
        raise AckError(f"{path}: {what} is not valid: {exc}") from None
