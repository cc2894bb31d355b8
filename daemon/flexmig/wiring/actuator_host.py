"""What the actuator component needs of the daemon it runs in, and where it keeps its files.

:class:`ActuatorHost` is what the component reads of the daemon (``flexmig.daemon.Daemon`` has it);
:class:`ActuatorPaths` decides the journal, logs and control socket paths, a private directory for a simulated node
included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from flexmig.config import Config, ControlConfig, StateConfig
from flexmig.nvml.worker import NvmlWorker
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.simdirs import make_private_dir, remove_stale_private_dirs

__all__ = ["ActuatorHost", "ActuatorPaths"]


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
        (:mod:`flexmig.wiring.simdirs`: a SIGKILL leaves them behind)."""
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
