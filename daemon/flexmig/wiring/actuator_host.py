"""What the actuator component needs of the daemon it plugs into, and where it keeps its files.

:class:`ActuatorHost` is the daemon's side of the contract (``flexmig.daemon.Daemon`` has it); :class:`ActuatorPaths`
decides the journal, logs and control socket paths, a private directory for a simulated node included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flexmig.config import Config, ControlConfig, StateConfig
from flexmig.metrics.collector import Extension
from flexmig.nvml.worker import NvmlWorker
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.backend import Backend
from flexmig.wiring.simdirs import make_private_dir, remove_stale_private_dirs

__all__ = ["ActuatorHost", "ActuatorPaths"]


class ActuatorHost(Protocol):
    """What the component needs of the daemon (``flexmig.daemon.Daemon`` has it)."""

    config: Config
    hostname: str
    hub: SnapshotHub
    worker: NvmlWorker
    backend: Backend | None
    sim_spec: str | None

    def add_loop(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]], *, restart: bool = False) -> None:
        """Run ``factory()`` under the daemon's TaskGroup (``restart``: again if it fails, instead of stopping)."""
        ...

    def add_metrics(self, extension: Extension) -> None:
        """Export more families from each snapshot."""
        ...

    def on_reload(self, hook: Callable[[Config], None]) -> None:
        """Call ``hook`` after each accepted configuration reload."""
        ...

    def on_start(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` after the first sweep, before READY (an exception stops the start)."""
        ...

    def on_stop(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` on SIGTERM, before the loops are cancelled."""
        ...

    def on_close(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` after the loops have ended, however they ended (or if they never began)."""
        ...

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
