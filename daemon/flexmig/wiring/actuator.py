"""The actuator in the running daemon: the ``actuator`` component (:mod:`flexmig.wiring.component`), a lifecycle
adapter over the service layer (:mod:`flexmig.service`).

* **start** (before READY, after the first sweep): open the :class:`~flexmig.act.service.Actuator` on the daemon's
  NVML worker thread (every NVML call of the actuator goes through ``worker.call``), build the services on it, bind
  the control socket (``[control]``) and reconcile the journal with NVML and the process table (in every mode: ranks
  still running are adopted; unfinished actions are finished or rolled back only in mode ``act``). In mode ``act`` a
  state directory or socket that cannot be used stops the start; in ``observe`` and ``advise`` it is logged and the
  daemon samples on without jobs, ``flexmig status`` or ``flexmig plan``;
* **dispatch**: :meth:`ActuatorComponent.dispatch` runs one control request line for the MQTT command listener,
  through the same operations and checks as the socket, whether or not ``[control]`` binds the socket;
* **loop** ``actuator``: serve the control socket, plan (:class:`~flexmig.service.planning_loop.PlanningLoop`) and
  look for ranks of no job (:class:`~flexmig.service.strays.StrayWatch`);
* **drain** (SIGTERM): refuse new actions, let the one in flight finish or roll back for up to
  ``jobs.shutdown_grace_s``; past that the journal has the next start finish it;
* **close**: the control socket, the journal, the locks (and a simulated node's private directory);
* **reload** (SIGHUP): the new mode (the one :class:`~flexmig.act.mode.RuntimeMode`), planner settings and job
  policy at once;
* **metrics**: actions and plans (:mod:`flexmig.metrics.actions`), the journal's writes, ranks of no job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from flexmig.act.control import ControlServer
from flexmig.act.events import ActEvent, Relay
from flexmig.act.mode import RuntimeMode
from flexmig.act.service import Actuator
from flexmig.clocks import Ages
from flexmig.config import Config, Mode
from flexmig.errors import FlexmigError, PlanRejectedError, StateInUseError
from flexmig.metrics.actions import ActionMetrics
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.metrics.runtime import JournalWriteMetrics
from flexmig.mqtt.events import Event, EventFactory
from flexmig.service import ActionGate, DaemonControl, PlanRound
from flexmig.service.actuator_host import NODE_LOCK_DIR, ActuatorHost, ActuatorLocks, ActuatorPaths
from flexmig.service.assembly import apply_config, build_services, job_policy, submit_refusal
from flexmig.service.first_step import FirstSteps
from flexmig.service.plan_now import plan_now
from flexmig.service.privileges import act_privilege_warning
from flexmig.storage import LockSet
from flexmig.wiring.backend import NodeComponent
from flexmig.wiring.mqtt import MqttComponent

__all__ = ["NODE_LOCK_DIR", "ActuatorComponent", "PlanRound"]

log = logging.getLogger(__name__)


class ActuatorComponent:
    """The actuator, control socket and planner of one daemon (see the module docstring)."""

    name = "actuator"
    restart = False  # its journal and the jobs it watches: a restart of the whole daemon reconciles them

    def __init__(
        self,
        host: ActuatorHost,
        node: NodeComponent,
        *,
        mqtt: MqttComponent | None = None,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        locks: LockSet | None = None,
        node_lock_dir: Path = NODE_LOCK_DIR,
    ) -> None:
        self.host = host
        self.node = node
        self.config = host.config
        self.mqtt = mqtt
        self.wall = wall
        self.held = ActuatorLocks(locks or LockSet(), node_lock_dir)
        self.runtime_mode = RuntimeMode(host.config.mode)
        """The daemon's mode: the one object every part reads (:mod:`flexmig.act.mode`)."""
        if mqtt is not None:
            self.runtime_mode.on_change(lambda _old, new: setattr(mqtt.findings, "mode", new))
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
        self._simulated = True  # until start() knows the backend
        self._built: list[Callable[[Actuator], None]] = []

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

    def on_built(self, hook: Callable[[Actuator], None]) -> None:
        """Call ``hook`` with the actuator once it is built, before the journal is reconciled (the Slurm component
        adds its action runner so: ``wiring/slurm.py``'s ``attach``, the one seam kept)."""
        self._built.append(hook)

    def _fleet(self, event: Event) -> None:
        """Publish ``event`` to the fleet (nothing without ``[mqtt]``)."""
        if self.mqtt is not None:
            self.mqtt.findings.emit(event)

    # ------------------------------------------------------------------------------------------ start
    async def start(self) -> None:
        """Open the actuator, build the services on it, serve and reconcile (see the module docstring)."""
        self.host.hub.subscribe(lambda _snapshot: self.refresh())
        backend = self.node.backend
        if backend is None:
            raise FlexmigError("the actuator needs an open NVML session")
        self._simulated = backend.simulated
        self._check_privileges()
        relay = Relay()
        try:
            act = self._open(relay)
        except StateInUseError:
            self.held.release()
            raise  # in every mode: a second daemon on the same state or node must not run at all
        except (FlexmigError, OSError) as exc:
            self.held.release()
            self._give_up(f"cannot open the actuator's state: {exc}")
            return
        self.act = act
        try:
            for hook in self._built:  # before reconciling: a hook may add the runner of actions in the journal
                hook(act)
            services = self._services(act)
            relay.connect(services.sink)
            await self._serve(act, services)
        except (FlexmigError, OSError) as exc:
            await self.close()
            self._give_up(f"actuator start-up failed: {exc}")

    def _open(self, events: Relay) -> Actuator:
        """Take the locks and open the actuator's journal and parts (no job is touched yet)."""
        backend = self.node.backend
        assert backend is not None
        cfg = self.config
        self.paths = paths = ActuatorPaths.of(cfg, simulated=backend.simulated)
        if paths.private is not None:
            log.info("simulated node: journal, rank logs and control socket under %s", paths.private)
        self.held.take_state(paths)
        if self.mode == "act" and not backend.simulated:
            self.held.take_node(self.host.latest())
        act = Actuator.build(
            mode=self.runtime_mode, nvml=backend.nvml, offload=self.host.worker.call, devices=backend.devices,
            journal_path=paths.journal, logs_dir=paths.logs, policy=job_policy(cfg), events=events,
            ack_dir=cfg.jobs.ack_dir,
        )  # fmt: skip
        apply_config(act, cfg)
        act.serve_daemon(real_node=not backend.simulated, refuse_submit=submit_refusal(cfg))
        return act

    def _services(self, act: Actuator) -> DaemonControl:
        """The service layer on ``act`` (:func:`flexmig.service.assembly.build_services`)."""
        self.services = build_services(
            act, mode=self.runtime_mode, gate=self.gate, config=lambda: self.config, latest=self.host.latest,
            plan_now=self._plan_now, metrics=self.action_metrics, first_steps=self.first_steps, factory=self.factory,
            fleet=self._fleet, wall=self.wall,
        )  # fmt: skip
        return self.services

    async def _serve(self, act: Actuator, services: DaemonControl) -> None:
        """Answer control requests (bound to the socket when ``[control] enabled``) and reconcile the journal.

        The dispatcher exists whether or not the socket is served: MQTT commands go through it too. It answers while
        the journal is reconciled (finishing a Slurm re-registration can take a while); requests that change
        anything wait for the reconciliation (it holds the action lock)."""
        cfg = self.config
        services.sink.remember_running()
        self.refresh()
        assert self.paths is not None
        control = ControlServer(
            self.paths.socket, services.handlers(), mode=cfg.control.socket_mode, max_wait_s=cfg.control.max_wait_s,
            on_dropped=self._dropped,
        )  # fmt: skip
        async with self.gate.lock:
            self.dispatcher = control
            if cfg.control.enabled:
                await control.start()
                self.control = control
                log.info("control socket at %s (mode %o)", self.paths.socket, cfg.control.socket_mode)
            summary = await act.start()
        services.strays.unknown_ranks = list(summary.get("unknown_ranks", []))
        log.info("journal reconciled (mode %s): %s", self.mode, json.dumps(summary, default=str))

    def _dropped(self, op: str, why: str) -> None:
        """A control request dropped at its deadline (:mod:`flexmig.act.deadline`): the ``request_dropped`` event."""
        event = ActEvent(kind="request_dropped", time_s=self.wall(), reason=why, detail={"op": op})
        if self.services is not None:
            self.services.sink.emit(event)

    def _give_up(self, why: str) -> None:
        if self.mode == "act":
            raise FlexmigError(why)
        self.unavailable = why
        log.error("%s; in mode %s the daemon samples on without jobs and without the control socket", why, self.mode)

    # ------------------------------------------------------------------------------------------ requests
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

    # ------------------------------------------------------------------------------------------ running
    async def run(self) -> None:
        """The planning loop and the watch for ranks of no job, until cancelled. The socket and journal are closed
        by :meth:`close` once every loop has ended: whether this one ran at all does not matter."""
        services = self.services
        if services is None:
            await asyncio.Event().wait()
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(services.loop.run())
            tg.create_task(services.strays.run())

    # ------------------------------------------------------------------------------------------ reload, stop
    def reload(self, config: Config) -> None:
        """Apply a reloaded configuration: mode, planner settings, job policy (socket and state paths: at restart)."""
        old = self.mode
        if config.mode == "act" and old != "act" and self.act is not None and not self._simulated:
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
            self._check_privileges()
            self.wake()

    def _check_privileges(self) -> None:
        """In mode act on a real node, warn once per start or switch when act's capabilities are missing."""
        if self.mode != "act" or self._simulated:
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

    async def close(self) -> None:
        """Close the control socket and the journal (ranks keep running), let go of the locks, and remove a simulated
        node's private directory when no job is left in it."""
        self.dispatcher = None
        self.services = None
        control, self.control = self.control, None
        if control is not None:
            await control.close()
        act, self.act = self.act, None
        if act is not None:
            running = act.holds_jobs()
            await act.close()
            paths = self.paths
            if paths is not None and paths.private is not None and not running:
                shutil.rmtree(paths.private, ignore_errors=True)
        self.held.release()

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """Actions, plans and jobs; the journal's writes; ranks of no journalled job."""
        return (
            self.action_metrics,
            JournalWriteMetrics(lambda: self.act.durable if self.act is not None else None),
            LossMetrics(unknown_ranks=self.unknown_rank_count),
        )

    def unknown_rank_count(self) -> int | None:
        """How many ranks of no journalled job run on this node (None while the actuator has not looked)."""
        return None if self.services is None else self.services.strays.count()
