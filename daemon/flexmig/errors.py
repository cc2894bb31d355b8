"""The one error hierarchy of flexmig.

Every foreign error (pynvml, sqlite, aiomqtt, OSError from a config file) is converted at the border of the
layer that meets it, with ``raise ... from``, so callers only ever catch these. Each message names the culprit
(file, key, line, topic, GPU) because operators read them in a journal, far from the code. The modules that raise
one re-export it (``flexmig.act.journal.JournalError`` is this module's), so either import works.

Defined elsewhere, each for a reason of its layer:

- ``flexmig.config.ConfigFileError``, a :class:`ConfigError`: it carries the configuration package's
  ``ConfigProblem`` records, which this module, below every layer, cannot import.
- ``flexmig_hook.AckError`` and ``flexmig_hook.HandoverError``, ``ValueError``s: the hook is a distribution of its
  own that job scripts use without flexmig; the actuator catches the first where it reads an acknowledgement, the
  second only guards what it writes to a standby rank.
- ``flexmig_hook.boundedjson.JsonBoundsError``, a ``ValueError``, for the same reason: the bounded JSON reader lives
  in the hook so that acknowledgements are read with it on both sides; each reader converts it at its border.
- ``flexmig.act.steps.StepFailed`` and ``Refused``: the step runner's control flow within one action (the Slurm
  re-registration's steps raise them too); the executor records them as the action's outcome, so they never reach
  a caller outside the action.
- Signals that never leave their module: ``flexmig.nvml.calls.GpuLost`` (abandon one GPU, keep walking the
  others), ``flexmig.sim.state.NvmlReturn`` (an NVML return code on its way to the simulated C functions, which
  return it as an int), ``flexmig.cli.shipped_files.ShippedFilesMissing`` (``flexmig install-files`` turns it into
  its message), and the private ones whose names start with ``_``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BackgroundTaskError",
    "BrokerAclError",
    "CommandRefusedError",
    "ConfigError",
    "ControlError",
    "ControlRequestError",
    "DcgmError",
    "FlexmigError",
    "JobSpecError",
    "JournalError",
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
    "RequestError",
    "RequestExpiredError",
    "SimError",
    "SlurmError",
    "StateInUseError",
    "StorageError",
    "TraceError",
    "UnsafePathError",
    "UserPathError",
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


class JournalError(StorageError):
    """The journal cannot be opened, read or written, or holds what no flexmig wrote; one line per problem, naming
    the journal (and the row and field)."""


class UserPathError(FlexmigError):
    """A path a job's user can change is not what it must be (a symlink on the way, not a directory, outside its
    root): raised by :mod:`flexmig.act.userpaths`; the message names the path and why, and nothing was changed."""


class UnsafePathError(FlexmigError):
    """A directory on the way to a file can be changed by someone the daemon does not trust (or a symlink loops).

    ``path`` is the path as given, ``directory`` the culprit; the message names both and the fix."""

    def __init__(self, path: Path, directory: Path, why: str) -> None:
        super().__init__(f"{path}: refused: {why}")
        self.path = path
        self.directory = directory
        self.why = why


class TraceError(FlexmigError, ValueError):
    """A trace file for replay is unreadable or malformed; the message names the file, the line and the column."""


class PlanRejectedError(FlexmigError):
    """A plan was refused: it would break a safety rule or the current mode forbids acting."""


class SlurmError(FlexmigError):
    """Slurm could not be asked or told something (a command failed, timed out, or answered garbage).

    The message names the command and what it said, so one log line is enough to act on.
    """


class DcgmError(FlexmigError):
    """A dcgm-exporter scrape failed (connection, HTTP status, size, time or parse); the message says which."""


class RequestError(FlexmigError, ValueError):
    """A control request is malformed (not JSON, unknown operation, bad argument)."""


class RequestExpiredError(FlexmigError):
    """A control request could not begin within its client's deadline; it was dropped and nothing was done."""


class ControlError(FlexmigError):
    """The daemon refused or failed a request; the message is the daemon's."""


class ControlRequestError(ControlError, ValueError):
    """The daemon found the request itself bad (a job spec, an argument)."""


class BrokerAclError(ConfigError):
    """The MQTT broker lets someone other than an operator publish commands to this node (an anonymous client, or
    the node's own account where no ACL applies): commands stay off; the message says who could publish where."""


class CommandRefusedError(FlexmigError, ValueError):
    """A command payload or topic was refused before anything ran; the message says which field and why."""

    def __init__(self, why: str, command_id: str | None = None) -> None:
        super().__init__(why)
        self.command_id = command_id
