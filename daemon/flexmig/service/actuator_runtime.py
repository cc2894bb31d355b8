"""The actuator's runtime in the running daemon, below the wiring's ``actuator`` component: what it holds from start
to close and what it answers, apart from opening and closing. The component (``flexmig.wiring.actuator``) is given
one :class:`ActuatorRuntime` and keeps it as its ``runtime``: its ``start`` and ``close`` open and close the actuator
and set what they opened here; everyone else who reads the actuator's state (the Slurm part, the MQTT commands, the
demo workload) is handed this object, not the component.

:class:`ActuatorRuntime` holds the mode (the one :class:`~flexmig.act.mode.RuntimeMode`), the action gate, the
open actuator and its service layer, and does what the daemon asks of them while it runs:

* **dispatch**: :meth:`ActuatorRuntime.dispatch` runs one control request line for the MQTT command listener,
  through the same operations and checks as the socket, whether or not ``[control]`` binds the socket;
* **plan_now**, **round**, **wake**, **refresh**: one look of the planner, one round, a round soon, the counts at
  each sweep;
* **reload** (SIGHUP): the new mode, planner settings and job policy at once (the switch to mode ``act`` takes the
  node's lock first, and stays where it was when it cannot);
* **drain** (SIGTERM): refuse new actions, let the one in flight finish or roll back for up to
  ``jobs.shutdown_grace_s``; past that the journal has the next start finish it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from flexmig.act.control import ControlServer
from flexmig.act.events import ActEvent
from flexmig.act.mode import RuntimeMode
from flexmig.act.service import Actuator
from flexmig.clocks import Ages
from flexmig.config import Config, Mode
from flexmig.errors import FlexmigError, PlanRejectedError
from flexmig.metrics.actions import ActionMetrics
from flexmig.mqtt.events import Event, EventFactory
from flexmig.mqtt.findings import FindingsPublisher
from flexmig.service.actuator_host import NODE_LOCK_DIR, ActuatorHost, ActuatorLocks, ActuatorPaths
from flexmig.service.assembly import apply_config, build_services
from flexmig.service.control import DaemonControl
from flexmig.service.first_step import FirstSteps
from flexmig.service.gate import ActionGate
from flexmig.service.plan_now import plan_now
from flexmig.service.planning_loop import PlanRound
from flexmig.service.privileges import act_privilege_warning
from flexmig.storage import LockSet

__all__ = ["ActuatorRuntime"]

log = logging.getLogger("flexmig.wiring.actuator")


class ActuatorRuntime:
    """The actuator's state and requests while the daemon runs (see the module docstring); the wiring's
    ``ActuatorComponent`` runs the lifecycle (open, serve, close) of one."""

    def __init__(
        self,
        host: ActuatorHost,
        *,
        findings: FindingsPublisher | None = None,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        locks: LockSet | None = None,
        node_lock_dir: Path = NODE_LOCK_DIR,
    ) -> None:
        self.host = host
        self.config = host.config
        self.findings = findings
        """Where fleet events go (the MQTT component's publisher; None without ``[mqtt]``)."""
        self.wall = wall
        self.held = ActuatorLocks(locks or LockSet(), node_lock_dir)
        self.runtime_mode = RuntimeMode(host.config.mode)
        """The daemon's mode: the one object every part reads (:mod:`flexmig.act.mode`)."""
        if findings is not None:
            self.runtime_mode.on_change(lambda _old, new: setattr(findings, "mode", new))
        self.gate = ActionGate()
        self.ages = Ages(wall, clock)
        """How long ago each job last moved and first started, on the monotonic clock (the journal's stamps are wall
        time)."""
        self.action_metrics = ActionMetrics()
        self.first_steps = FirstSteps(clock=clock)
        self.factory = EventFactory(host.config.node(lambda: host.hostname))
        self.paths: ActuatorPaths | None = None
        self.act: Actuator | None = None
        self.services: DaemonControl | None = None
        """The service layer on the open actuator (None until it started, or when it could not)."""
        self.control: ControlServer | None = None
        """The control socket's server, while it listens (``[control] enabled``)."""
        self.dispatcher: ControlServer | None = None
        """Runs control requests (the socket's, and MQTT commands') while the actuator runs, bound or not."""
        self.unavailable: str | None = None  # why the actuator could not start (observe/advise only)
        self.simulated = True
        """Whether the node is simulated (no node lock, no privilege warning); the component's start sets it once it
        knows the backend."""

    @property
    def mode(self) -> Mode:
        """The mode now."""
        return self.runtime_mode.value

    @property
    def action_lock(self) -> asyncio.Lock:
        """Held while a plan or a mutating request runs; whoever else changes the node takes it too, so that a stop
        (:meth:`drain`) waits for them the same way."""
        return self.gate.lock

    @property
    def stopping(self) -> bool:
        """True once a stop was asked: start nothing new."""
        return self.gate.stopping

    @property
    def workload_exclude(self) -> frozenset[tuple[int, int]]:
        """Instances the simulator's demo workload must leave alone (:class:`~flexmig.service.ActionSink`)."""
        return frozenset() if self.services is None else self.services.sink.workload_exclude

    def _fleet(self, event: Event) -> None:
        """Publish ``event`` to the fleet (nothing without ``[mqtt]``)."""
        if self.findings is not None:
            self.findings.emit(event)

    def request_dropped(self, op: str, why: str) -> None:
        """A control request dropped at its deadline (:mod:`flexmig.act.deadline`): the ``request_dropped`` event."""
        event = ActEvent(kind="request_dropped", time_s=self.wall(), reason=why, detail={"op": op})
        if self.services is not None:
            self.services.sink.emit(event)

    def give_up(self, why: str) -> None:
        """The actuator could not start: in mode act that stops the daemon (FlexmigError); in observe and advise the
        daemon samples on without it, and ``why`` is what requests are answered."""
        if self.mode == "act":
            raise FlexmigError(why)
        self.unavailable = why
        log.error("%s; in mode %s the daemon samples on without jobs and without the control socket", why, self.mode)

    def services_on(self, act: Actuator) -> DaemonControl:
        """Build the service layer on the open actuator ``act`` (:func:`flexmig.service.assembly.build_services`) and
        keep it as :attr:`services`."""
        self.services = build_services(
            act, mode=self.runtime_mode, gate=self.gate, config=lambda: self.config, latest=self.host.latest,
            plan_now=self._plan_now, metrics=self.action_metrics, first_steps=self.first_steps, factory=self.factory,
            fleet=self._fleet, wall=self.wall,
        )  # fmt: skip
        return self.services

    async def dispatch(self, line: bytes) -> dict[str, Any]:
        """Run one control request line (an MQTT command's) as the control socket would; never raises.

        Works with ``[control] enabled = false`` too (nothing is bound for it); while the actuator is not running
        (it could not start in observe/advise, or the daemon stopped) the answer is a PlanRejectedError.
        """
        dispatcher = self.dispatcher
        if dispatcher is None:
            why = self.unavailable or ("the daemon is stopping" if self.gate.stopping else "not started yet")
            return {"ok": False, "error": f"the actuator is not running: {why}", "type": "PlanRejectedError"}
        return await dispatcher.dispatch(line)

    async def _plan_now(self, source: str, requests: tuple[str, ...]) -> PlanRound:
        act = self.act
        if act is None:
            raise PlanRejectedError(self.unavailable or "the actuator is not running")
        return await plan_now(
            act, self.config.planner, mode=self.mode, ages=self.ages, wall=self.wall, source=source, requests=requests
        )

    async def plan_now(self, *, source: str, requests: tuple[str, ...] = ()) -> PlanRound:
        """What the planner would do now (:func:`flexmig.service.plan_now.plan_now`); changes nothing."""
        return await self._plan_now(source, requests)

    async def round(self) -> PlanRound:
        """One planning round now (:meth:`flexmig.service.planning_loop.PlanningLoop.round`)."""
        if self.services is None:
            raise PlanRejectedError(self.unavailable or "the actuator is not running")
        return await self.services.loop.round()

    def wake(self) -> None:
        """Plan soon (a job was queued, or one ended and freed instances)."""
        if self.services is not None:
            self.services.loop.wake()

    def refresh(self) -> None:
        """Job counts for the metrics, and the instances the demo workload must leave alone (at every sweep)."""
        if self.services is not None:
            self.services.sink.refresh()

    def reload(self, config: Config) -> None:
        """Apply a reloaded configuration: mode, planner settings, job policy (socket and state paths: at restart)."""
        old = self.mode
        if config.mode == "act" and old != "act" and self.act is not None and not self.simulated:
            try:
                self.held.take_node(self.host.latest())
            except FlexmigError as exc:
                log.error("configuration reload: mode stays %s, not act: %s", old, exc)
                config = replace(config, mode=old)
        self.config = config
        self.runtime_mode.set(config.mode)
        if self.act is not None:
            apply_config(self.act, config)
        if self.dispatcher is not None:
            self.dispatcher.max_wait_s = config.control.max_wait_s
        if old != config.mode:
            log.info("mode %s -> %s", old, config.mode)
            self.check_privileges()
            self.wake()

    def check_privileges(self) -> None:
        """In mode act on a real node, warn once per start or switch when act's capabilities are missing."""
        if self.mode != "act" or self.simulated:
            return
        warning = act_privilege_warning()
        if warning is not None:
            log.warning("%s", warning)

    async def drain(self) -> None:
        """SIGTERM: no new actions; the one in flight may finish (or roll back) for ``jobs.shutdown_grace_s``."""
        self.gate.stopping = True
        if self.act is not None:
            self.act.begin_stop()
        self.wake()
        grace = self.config.jobs.shutdown_grace_s
        if self.gate.lock.locked():
            log.info("stopping: waiting up to %.0f s for the action in flight", grace)
        try:
            async with asyncio.timeout(grace):
                await self.gate.lock.acquire()
        except TimeoutError:
            log.warning(
                "stopping: an action is still running after %.0f s; the journal has the next start finish or "
                "roll it back (jobs keep running)",
                grace,
            )

    def unknown_rank_count(self) -> int | None:
        """How many ranks of no journalled job run on this node (None while the actuator has not looked)."""
        return None if self.services is None else self.services.strays.count()
