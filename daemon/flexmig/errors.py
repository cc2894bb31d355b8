"""The one error hierarchy of flexmig.

Every foreign error (pynvml, sqlite, aiomqtt, OSError from a config file) is converted at the border of the
layer that meets it, with ``raise ... from``, so callers only ever catch these. Each message names the culprit
(file, key, line, topic, GPU) because operators read them in a journal, far from the code.
"""

from __future__ import annotations

__all__ = [
    "BackgroundTaskError",
    "ConfigError",
    "FlexmigError",
    "JobSpecError",
    "LayoutError",
    "NodeSpecError",
    "NvmlCallError",
    "NvmlGpuLostError",
    "NvmlInUseError",
    "NvmlInsufficientResourcesError",
    "NvmlNoPermissionError",
    "NvmlNotFoundError",
    "NvmlUnavailableError",
    "OutboxError",
    "PlanRejectedError",
    "SimError",
    "SlurmError",
    "StateInUseError",
    "StorageError",
    "TraceError",
]


class FlexmigError(Exception):
    """Root of every error flexmig raises on purpose."""


class BackgroundTaskError(FlexmigError):
    """A background task of the daemon died (or kept failing past its restarts): the daemon stops, exit status 1,
    with this one line naming the task and its error."""


class NodeSpecError(FlexmigError, ValueError):
    """A simulated-node spec (``h200x8:3g.71gb@0``) is malformed; the message points at the bad item."""


class LayoutError(FlexmigError, ValueError):
    """A MIG layout breaks a placement rule (overlap, a start the profile does not allow, too many instances)."""


class ConfigError(FlexmigError, ValueError):
    """A configuration file is invalid; the message names the file, the key and the line."""


class JobSpecError(FlexmigError, ValueError):
    """A job spec is invalid or unsafe; the message names the file and the key."""


class NvmlUnavailableError(FlexmigError):
    """No NVML library or driver could be loaded (no GPU, no driver, and no ``--sim``)."""


class NvmlCallError(FlexmigError):
    """An NVML call failed. Carries the NVML return code and the call's name, never the pynvml class."""

    def __init__(self, call: str, code: int, name: str, target: str = "") -> None:
        where = f" on {target}" if target else ""
        super().__init__(f"NVML {call}{where} failed: {name} (code {code})")
        self.call = call
        self.code = code
        self.name = name
        self.target = target


class NvmlInUseError(NvmlCallError):
    """NVML said IN_USE: the instance still has compute instances or processes (destroy them first)."""


class NvmlInsufficientResourcesError(NvmlCallError):
    """NVML said INSUFFICIENT_RESOURCES: the placement overlaps, is not allowed, or the GPU is full."""


class NvmlNotFoundError(NvmlCallError):
    """NVML said NOT_FOUND: no such GPU instance, compute instance or MIG device (any more)."""


class NvmlNoPermissionError(NvmlCallError):
    """NVML said NO_PERMISSION: MIG changes need root, CAP_SYS_ADMIN or the MIG config capability."""


class NvmlGpuLostError(NvmlCallError):
    """NVML said GPU_IS_LOST: the GPU fell off the bus; stop touching it and alert."""


class SimError(FlexmigError, ValueError):
    """A request to the simulated node cannot be met (unknown UUID, pid in use, memory too large, bad state file)."""


class StorageError(FlexmigError):
    """A file or directory of the daemon's own state (state directory, journal, outbox, lock) is unsafe, broken or
    unusable: not ours, writable by others, a symlink, empty, corrupt. The message names the path and the fix."""


class StateInUseError(StorageError):
    """Another process holds the lock on a state directory or a node: two daemons must never share one."""


class OutboxError(StorageError):
    """The persistent event outbox (SQLite) cannot be opened, read or written; the message names the file."""


class TraceError(FlexmigError, ValueError):
    """A trace file for replay is unreadable or malformed; the message names the file, the line and the column."""


class PlanRejectedError(FlexmigError):
    """A plan was refused: it would break a safety rule or the current mode forbids acting."""


class SlurmError(FlexmigError):
    """Slurm could not be asked or told something (a command failed, timed out, or answered garbage).

    The message names the command and what it said, so one log line is enough to act on.
    """
