"""What the actuator component needs of the daemon it runs in, where it keeps its files, and the locks it holds.

:class:`ActuatorHost` is what the component reads of the daemon (``flexmig.daemon.Daemon`` has it);
:class:`ActuatorPaths` decides the journal, logs and control socket paths, a private directory for a simulated node
included; :class:`ActuatorLocks` holds the state directories and, in mode ``act``, the GPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flexmig.config import Config, ControlConfig, StateConfig
from flexmig.errors import JournalError, StorageError
from flexmig.nvml.worker import NvmlWorker
from flexmig.service.simdirs import make_private_dir, remove_stale_private_dirs
from flexmig.storage import LockSet, prepare_dir
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["NODE_LOCK_DIR", "ActuatorHost", "ActuatorLocks", "ActuatorPaths"]

NODE_LOCK_DIR = Path("/run/flexmig")
"""Where a real node's GPU locks live (the systemd unit's RuntimeDirectory)."""


class ActuatorHost(Protocol):
    """What the component needs of the daemon it runs in (``flexmig.daemon.Daemon`` has it): the configuration it
    started with, its host name, the snapshot hub and the NVML worker thread. The node itself is the ``nvml``
    component's (:class:`flexmig.wiring.backend.NodeComponent`)."""

    config: Config
    hostname: str
    hub: SnapshotHub
    worker: NvmlWorker

    def latest(self) -> Snapshot | None:
        """The last published snapshot."""
        ...


@dataclass(frozen=True, slots=True)
class ActuatorPaths:
    """Where the actuator keeps its journal, the ranks' logs and its control socket.

    ``private`` is a directory the daemon made for a simulated node that was not given its own ``[state]`` and
    ``[control]`` paths: a simulated node's jobs must never mix with the real node's journal in
    ``/var/lib/flexmig``, and two simulated daemons must not fight over ``/run/flexmig/control.sock``.
    """

    journal: Path
    logs: Path
    socket: Path
    private: Path | None = None

    @classmethod
    def of(cls, config: Config, *, simulated: bool, tmp: Path | None = None) -> ActuatorPaths:
        """The paths of ``config``; for a simulated node, defaults replaced by a fresh private directory under
        ``tmp`` (the temporary directory by default), after removing those of simulated daemons that are gone
        (:mod:`flexmig.service.simdirs`: a SIGKILL leaves them behind)."""
        state, control = config.state, config.control
        default_state = state == StateConfig()
        default_socket = control.socket == ControlConfig().socket
        private = None
        if simulated and (default_state or default_socket):
            remove_stale_private_dirs(tmp)
            private = make_private_dir(tmp)
        journal = state.journal if not (simulated and default_state) or private is None else private / "journal.sqlite3"
        logs = (state.directory if not (simulated and default_state) or private is None else private) / "logs"
        socket = control.socket if not (simulated and default_socket) or private is None else private / "control.sock"
        return cls(journal, logs, socket, private)


@dataclass
class ActuatorLocks:
    """The locks one actuator holds: its state directories, and in mode ``act`` every GPU of a real node."""

    locks: LockSet
    node_lock_dir: Path = NODE_LOCK_DIR
    _state: list[Path] = field(default_factory=list)
    _node: list[Path] = field(default_factory=list)

    def take_state(self, paths: ActuatorPaths) -> None:
        """Hold the journal's directory and the state directory (made first if missing, and checked) for as long as
        the actuator runs: a second daemon on them is refused, naming this one's pid."""
        dirs = [paths.journal.parent] if paths.private is not None else [paths.journal.parent, paths.logs.parent]
        for d in dict.fromkeys(Path(os.path.normpath(x.absolute())) for x in dirs):
            try:
                prepare_dir(d, "state directory")
            except StorageError as exc:
                raise JournalError(str(exc)) from None
            self._state.append(self.locks.take_dir(d, "state directory"))

    def take_node(self, snap: Snapshot | None) -> None:
        """Mode ``act`` on a real node: hold every GPU of ``snap`` (``gpu-<UUID>.lock`` in the node lock directory),
        so two daemons never reconfigure one GPU (a simulated node is held through its state file instead,
        :func:`flexmig.wiring.backend.open_backend`)."""
        if snap is None or self._node:
            return
        prepare_dir(self.node_lock_dir, "lock directory", mode=0o755)
        for gpu in snap.gpus:
            self._node.append(self.locks.take(self.node_lock_dir / f"gpu-{gpu.uuid}.lock", f"GPU {gpu.uuid}"))

    def release(self) -> None:
        """Let go of every lock held."""
        for key in [*self._node, *self._state]:
            self.locks.drop(key)
        self._node, self._state = [], []
