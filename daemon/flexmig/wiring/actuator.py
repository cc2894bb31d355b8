"""The actuator in the running daemon: the ``actuator`` component (:mod:`flexmig.wiring.component`), a lifecycle
adapter over the service layer (:mod:`flexmig.service`).

* **start** (before READY, after the first sweep): open the :class:`~flexmig.act.service.Actuator` on the daemon's
  NVML worker thread (every NVML call of the actuator goes through ``worker.call``), build the services on it, bind
  the control socket (``[control]``) and reconcile the journal with NVML and the process table (in every mode: ranks
  still running are adopted; unfinished actions are finished or rolled back only in mode ``act``). In mode ``act`` a
  state directory or socket that cannot be used stops the start; in ``observe`` and ``advise`` it is logged and the
  daemon samples on without jobs, ``flexmig status`` or ``flexmig plan``;
* **loop** ``actuator``: serve the control socket, plan (:class:`~flexmig.service.planning_loop.PlanningLoop`) and
  look for ranks of no job (:class:`~flexmig.service.strays.StrayWatch`);
* **dispatch**, **reload** (SIGHUP), **drain** (SIGTERM): the service layer's
  :class:`~flexmig.service.actuator_runtime.ActuatorRuntime`;
* **close**: the control socket, the journal, the locks (and a simulated node's private directory);
* **metrics**: actions and plans (:mod:`flexmig.metrics.actions`), the journal's writes, ranks of no job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from flexmig.act.control import ControlServer
from flexmig.act.events import Relay
from flexmig.act.executor import ActionRunner
from flexmig.act.service import Actuator
from flexmig.errors import FlexmigError, StateInUseError
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.metrics.runtime import JournalWriteMetrics
from flexmig.service import DaemonControl, PlanRound
from flexmig.service.actuator_host import NODE_LOCK_DIR, ActuatorHost, ActuatorPaths
from flexmig.service.actuator_runtime import ActuatorRuntime
from flexmig.service.assembly import apply_config, build_services, job_policy, submit_refusal
from flexmig.storage import LockSet
from flexmig.wiring.backend import NodeComponent
from flexmig.wiring.mqtt import MqttComponent

__all__ = ["NODE_LOCK_DIR", "ActuatorComponent", "PlanRound"]

log = logging.getLogger(__name__)


class ActuatorComponent(ActuatorRuntime):
    """The actuator, control socket and planner of one daemon (see the module docstring): the lifecycle over the
    service layer's :class:`~flexmig.service.actuator_runtime.ActuatorRuntime`."""

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
        runners: Mapping[str, ActionRunner] | None = None,
    ) -> None:
        """``runners``: the runners of journalled action kinds that live outside ``act/`` (the Slurm part's
        ``slurm_reregister``), given to the executor when :meth:`start` builds it, before the journal is
        reconciled."""
        findings = None if mqtt is None else mqtt.findings
        super().__init__(host, findings=findings, wall=wall, clock=clock, locks=locks, node_lock_dir=node_lock_dir)
        self.node = node
        self.runners: Mapping[str, ActionRunner] = MappingProxyType(dict(runners or {}))

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
            ack_dir=cfg.jobs.ack_dir, runners=self.runners,
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
