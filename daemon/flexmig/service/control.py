"""The running daemon's control operations: the :class:`~flexmig.act.operation_table.DaemonOps` family (``status``,
``plan``, ``standdown``) and the handlers of every row, the acting ones serialized under the action gate.

A control request (the socket's or an MQTT command's) goes :class:`flexmig.act.control.ControlServer` →
:meth:`DaemonControl.handlers` (each handler behind its row's checks, :func:`flexmig.act.operation_table.bind`) →
:meth:`DaemonControl.serialized` for the acting ones (the action lock held, refused while stopping) → the method
the row's ``handler`` picks: :class:`flexmig.act.operations.JobsApi`'s for the ``jobs.*`` rows, this class's for
the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from flexmig.act.control import Handler
from flexmig.act.mode import RuntimeMode
from flexmig.act.operation_table import DAEMON_OPERATIONS, Operation, bind
from flexmig.act.service import Actuator
from flexmig.config import Config, Mode
from flexmig.errors import PlanRejectedError
from flexmig.metrics.actions import ActionMetrics
from flexmig.service.action_sink import ActionSink
from flexmig.service.daemon_status import daemon_status
from flexmig.service.gate import ActionGate
from flexmig.service.planning_loop import PlanningLoop
from flexmig.service.standdown import standdown_request
from flexmig.service.strays import StrayWatch
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["DaemonControl"]

log = logging.getLogger(__name__)


class DaemonControl:
    """Serves the control operations on one actuator (the rows of both families; see the module docstring)."""

    def __init__(
        self,
        act: Actuator,
        *,
        mode: RuntimeMode,
        gate: ActionGate,
        config: Callable[[], Config],
        latest: Callable[[], Snapshot | None],
        loop: PlanningLoop,
        sink: ActionSink,
        strays: StrayWatch,
        metrics: ActionMetrics,
    ) -> None:
        self.act = act
        self.runtime_mode = mode
        self.gate = gate
        self._config = config
        self.latest = latest
        self.loop = loop
        self.sink = sink
        self.strays = strays
        self.metrics = metrics
        self.unavailable: str | None = None  # it runs: nothing is unavailable

    @property
    def config(self) -> Config:
        """The configuration now (a reload replaces it)."""
        return self._config()

    @property
    def mode(self) -> Mode:
        """The mode now."""
        return self.runtime_mode.value

    def handlers(self) -> dict[str, Handler]:
        """Every operation of the table: the jobs API's and this object's, the acting ones serialized."""

        def serialize(op: Operation[Any], handler: Handler) -> Handler:
            return self.serialized(handler) if op.acting else handler

        return {**self.act.jobs.handlers(serialize), **bind(DAEMON_OPERATIONS, self, serialize)}

    def serialized(self, handler: Handler) -> Handler:
        """``handler`` (an acting operation's) run under the action lock (no plan runs meanwhile), refused while
        stopping; the planner is woken for a job it queued."""

        async def run(args: Mapping[str, Any]) -> Any:
            # A journal write that waits for space (an action in flight, a job's exit record) refuses this at once
            # instead of letting it hang behind the write.
            async with self.act.executor.durable.hold(self.gate.lock, "the request"):
                if self.gate.stopping:
                    raise PlanRejectedError("the daemon is stopping; try again after it restarts")
                result = await handler(args)
            self.sink.refresh()
            if isinstance(result, dict) and result.get("queued"):
                self.loop.wake()
            return result

        return run

    async def status_request(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The ``status`` operation: served from the latest snapshot and the journal (no NVML call)."""
        snap = self.latest()
        if snap is None:
            raise PlanRejectedError("no sweep published yet")
        return self.status(snap)

    def status(self, snap: Snapshot) -> dict[str, Any]:
        """The status document of ``snap`` with this daemon's jobs, mode and recent actions."""
        return daemon_status(
            snap, self.act, mode=self.mode, in_progress=self.metrics.in_progress(), unavailable=None,
            unknown_ranks=self.strays.unknown_ranks,
        )  # fmt: skip

    async def plan_request(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The ``plan`` operation: what the planner would do now, with ``requests`` (``[Nx]PROFILE``) queued too."""
        result = await self.loop.plan_now("daemon", tuple(args["requests"]))
        return result.document

    async def standdown_request(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The ``standdown`` operation (:mod:`flexmig.service.standdown`), under the action lock."""
        return await standdown_request(self, args)

    def set_mode(self, mode: Mode, why: str) -> None:
        """Switch the running daemon to ``mode`` (a stand-down does: no more planning); the file's mode returns at
        the next reload or restart."""
        old = self.runtime_mode.set(mode)
        if old != mode:
            log.info("mode %s -> %s (%s)", old, mode, why)
