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
* **reload** (SIGHUP), **drain** (SIGTERM): handed to :attr:`ActuatorComponent.runtime`, the service layer's
  :class:`~flexmig.service.actuator_runtime.ActuatorRuntime`, which the component is given and which holds the
  mode, the gate, the open actuator and its services, and answers what is asked while it runs (``dispatch``,
  ``plan_now``, ...);
* **close**: the control socket, the journal, the locks (and a simulated node's private directory);
* **metrics**: actions and plans (:mod:`flexmig.metrics.actions`), the journal's writes, ranks of no job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from flexmig.act.control import ControlServer
from flexmig.act.events import Relay
from flexmig.act.executor import ActionRunner
from flexmig.act.service import Actuator
from flexmig.config import Config
from flexmig.errors import FlexmigError, StateInUseError
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.metrics.runtime import JournalWriteMetrics
from flexmig.service import DaemonControl, PlanRound
from flexmig.service.actuator_host import NODE_LOCK_DIR, ActuatorPaths
from flexmig.service.actuator_runtime import ActuatorRuntime
from flexmig.service.assembly import apply_config, job_policy, submit_refusal
from flexmig.wiring.backend import NodeComponent

__all__ = ["NODE_LOCK_DIR", "ActuatorComponent", "PlanRound"]

log = logging.getLogger(__name__)


class ActuatorComponent:
    """The actuator, control socket and planner of one daemon (see the module docstring): the lifecycle of its
    :attr:`runtime`, the service layer's :class:`~flexmig.service.actuator_runtime.ActuatorRuntime`."""

    name = "actuator"
    restart = False  # its journal and the jobs it watches: a restart of the whole daemon reconciles them

    def __init__(
        self, runtime: ActuatorRuntime, node: NodeComponent, *, runners: Mapping[str, ActionRunner] | None = None
    ) -> None:
        """``runtime``: the actuator's state and requests while the daemon runs, built by :func:`flexmig.wiring.wire`
        (which hands the same one to the Slurm part and the MQTT commands). ``runners``: the runners of journalled
        action kinds that live outside ``act/`` (the Slurm part's ``slurm_reregister``), given to the executor when
        :meth:`start` builds it, before the journal is reconciled."""
        self.runtime: ActuatorRuntime = runtime
        """What this component opens, serves and closes; every reader of the actuator's state reads it there."""
        self.node = node
        self.runners: Mapping[str, ActionRunner] = MappingProxyType(dict(runners or {}))

    # ------------------------------------------------------------------------------------------ start
    async def start(self) -> None:
        """Open the actuator, build the services on it, serve and reconcile (see the module docstring)."""
        rt = self.runtime
        rt.host.hub.subscribe(lambda _snapshot: rt.refresh())
        backend = self.node.backend
        if backend is None:
            raise FlexmigError("the actuator needs an open NVML session")
        rt.simulated = backend.simulated
        rt.check_privileges()
        relay = Relay()
        try:
            act = self._open(relay)
        except StateInUseError:
            rt.held.release()
            raise  # in every mode: a second daemon on the same state or node must not run at all
        except (FlexmigError, OSError) as exc:
            rt.held.release()
            rt.give_up(f"cannot open the actuator's state: {exc}")
            return
        rt.act = act
        try:
            services = rt.services_on(act)
            relay.connect(services.sink)
            await self._serve(act, services)
        except (FlexmigError, OSError) as exc:
            await self.close()
            rt.give_up(f"actuator start-up failed: {exc}")

    def _open(self, events: Relay) -> Actuator:
        """Take the locks and open the actuator's journal and parts (no job is touched yet)."""
        rt = self.runtime
        backend = self.node.backend
        assert backend is not None
        cfg = rt.config
        rt.paths = paths = ActuatorPaths.of(cfg, simulated=backend.simulated)
        if paths.private is not None:
            log.info("simulated node: journal, rank logs and control socket under %s", paths.private)
        rt.held.take_state(paths)
        if rt.mode == "act" and not backend.simulated:
            rt.held.take_node(rt.host.latest())
        act = Actuator.build(
            mode=rt.runtime_mode, nvml=backend.nvml, offload=rt.host.worker.call, devices=backend.devices,
            journal_path=paths.journal, logs_dir=paths.logs, policy=job_policy(cfg), events=events,
            ack_dir=cfg.jobs.ack_dir, runners=self.runners,
        )  # fmt: skip
        apply_config(act, cfg)
        act.serve_daemon(real_node=not backend.simulated, refuse_submit=submit_refusal(cfg))
        return act

    async def _serve(self, act: Actuator, services: DaemonControl) -> None:
        """Answer control requests (bound to the socket when ``[control] enabled``) and reconcile the journal.

        The dispatcher exists whether or not the socket is served: MQTT commands go through it too. It answers while
        the journal is reconciled (finishing a Slurm re-registration can take a while); requests that change
        anything wait for the reconciliation (it holds the action lock)."""
        rt = self.runtime
        cfg = rt.config
        services.sink.remember_running()
        rt.refresh()
        assert rt.paths is not None
        control = ControlServer(
            rt.paths.socket, services.handlers(), mode=cfg.control.socket_mode, max_wait_s=cfg.control.max_wait_s,
            on_dropped=rt.request_dropped,
        )  # fmt: skip
        async with rt.gate.lock:
            rt.dispatcher = control
            if cfg.control.enabled:
                await control.start()
                rt.control = control
                log.info("control socket at %s (mode %o)", rt.paths.socket, cfg.control.socket_mode)
            summary = await act.start()
        services.strays.unknown_ranks = list(summary.get("unknown_ranks", []))
        log.info("journal reconciled (mode %s): %s", rt.mode, json.dumps(summary, default=str))

    # ------------------------------------------------------------------------------------------ running
    async def run(self) -> None:
        """The planning loop and the watch for ranks of no job, until cancelled. The socket and journal are closed
        by :meth:`close` once every loop has ended: whether this one ran at all does not matter."""
        services = self.runtime.services
        if services is None:
            await asyncio.Event().wait()
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(services.loop.run())
            tg.create_task(services.strays.run())

    async def drain(self) -> None:
        """SIGTERM: the runtime's drain (:meth:`~flexmig.service.actuator_runtime.ActuatorRuntime.drain`)."""
        await self.runtime.drain()

    def reload(self, config: Config) -> None:
        """SIGHUP: the runtime's reload (:meth:`~flexmig.service.actuator_runtime.ActuatorRuntime.reload`)."""
        self.runtime.reload(config)

    async def close(self) -> None:
        """Close the control socket and the journal (ranks keep running), let go of the locks, and remove a simulated
        node's private directory when no job is left in it."""
        rt = self.runtime
        rt.dispatcher = None
        rt.services = None
        control, rt.control = rt.control, None
        if control is not None:
            await control.close()
        act, rt.act = rt.act, None
        if act is not None:
            running = act.holds_jobs()
            await act.close()
            paths = rt.paths
            if paths is not None and paths.private is not None and not running:
                shutil.rmtree(paths.private, ignore_errors=True)
        rt.held.release()

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """Actions, plans and jobs; the journal's writes; ranks of no journalled job."""
        rt = self.runtime
        return (
            rt.action_metrics,
            JournalWriteMetrics(lambda: rt.act.durable if rt.act is not None else None),
            LossMetrics(unknown_ranks=rt.unknown_rank_count),
        )
