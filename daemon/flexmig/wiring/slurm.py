"""flexmig's Slurm agent in the running daemon (``[slurm] enabled = true``): loop ``slurm``, metrics, events.

:class:`SlurmComponent` is the daemon's ``slurm`` component (:mod:`flexmig.wiring.component`), on the actuator's:

* **built** (:meth:`~flexmig.wiring.actuator.ActuatorComponent.on_built`): the agent is made on the actuator's
  executor and adds the runner of ``slurm_reregister`` actions before the journal is reconciled, so a
  re-registration cut short by a crash is finished at start (in mode ``act``; in the other modes the node stays as
  the crash left it, and the log says so);
* **loop** ``slurm``: every ``[slurm] probe_s`` a cheap look (``sdiag``'s job counters, slurmd's pid file), and a
  :meth:`~flexmig.slurm.agent.SlurmAgent.round` when it shows a change (a job submitted, started or ended; slurmd
  crashed) or every ``[slurm] interval_s``, under the actuator's action lock (a stop waits for a re-registration
  in flight as for any action, then the journal finishes it). A Slurm that cannot be read is one WARNING line when
  it starts failing (and when the error changes), one INFO line when it answers again, and an event each time;
  sampling and detection go on, and nothing is changed meanwhile;
* **metrics**: :class:`~flexmig.metrics.slurm.SlurmMetrics`; **events**: ``slurm_unreachable``,
  ``slurm_reachable``, ``slurm_plan`` (each new decision), ``slurm_job_signalled``/``requeued``/``released``,
  ``slurm_node`` (slurmd restarted, a change waiting or abandoned, an acknowledgement missed, the node left alone); the
  re-registrations themselves are actions, with the actuator's action events and metrics.

On a simulated node the demo workload is off: the node runs Slurm's jobs, and synthetic processes would make the
actuator refuse to touch the instances they sit on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from flexmig.act.service import Actuator
from flexmig.config import Config, SlurmConfig
from flexmig.errors import FlexmigError, SlurmError
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.mqtt.events import Event, EventFactory
from flexmig.mqtt.slurm_events import (
    job_event,
    node_event,
    plan_changes,
    plan_event,
    reachable_event,
    unreachable_event,
)
from flexmig.slurm.agent import SlurmAgent, SlurmRound, describe_error
from flexmig.slurm.settings import SlurmSettings
from flexmig.wiring.actuator import ActuatorComponent
from flexmig.wiring.mqtt import MqttComponent
from flexmig.wiring.planning import planner_settings

__all__ = ["SlurmComponent", "slurm_settings"]

log = logging.getLogger(__name__)


class SlurmHost(Protocol):
    """What the component needs of the daemon (``flexmig.daemon.Daemon`` has it)."""

    config: Config
    hostname: str


def slurm_settings(cfg: SlurmConfig) -> SlurmSettings:
    """The ``[slurm]`` table as the agent's settings (the one place this mapping lives)."""
    return SlurmSettings(
        node=cfg.node,
        partitions=tuple(cfg.partitions),
        interval_s=cfg.interval_s,
        conf=cfg.conf,
        bin_dir=cfg.bin_dir,
        command_timeout_s=cfg.command_timeout_s,
        gres_conf=cfg.gres_conf,
        gres_map=cfg.gres_map,
        dev_dir=cfg.dev_dir,
        mig_minors=cfg.mig_minors,
        slurmd_pid_file=cfg.slurmd_pid_file,
        slurmd_conf=tuple(cfg.slurmd_conf.split()),
        slurmd_env=cfg.slurmd_env,
        slurmd_control=cfg.slurmd_control,
        slurmd_unit=cfg.slurmd_unit,
        slurmd_hook=tuple(cfg.slurmd_hook),
        hook_token=cfg.hook_token,
        hook_settle_s=cfg.hook_settle_s,
        checkpoint_dir=cfg.checkpoint_dir,
        checkpoint_signal=cfg.checkpoint_signal,
        ack_wait_s=cfg.ack_wait_s,
        ack_timeout_s=cfg.ack_timeout_s,
        drain_timeout_s=cfg.drain_timeout_s,
        register_timeout_s=cfg.register_timeout_s,
        reregister_s=cfg.reregister_s,
        min_interval_s=cfg.min_interval_s,
        max_wait_s=cfg.max_wait_s,
        probe_s=cfg.probe_s,
        max_closed_nodes=cfg.max_closed_nodes,
    )


class SlurmComponent:
    """The Slurm agent of one daemon, on its actuator (:meth:`attach` is the actuator's ``on_built`` hook)."""

    name = "slurm"
    restart = False

    def __init__(
        self,
        host: SlurmHost,
        actuator: ActuatorComponent,
        *,
        mqtt: MqttComponent | None = None,
        simulated: Callable[[], bool] = lambda: False,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.config = host.config
        self.actuator = actuator
        self.mqtt = mqtt
        self.simulated = simulated
        self.wall = wall
        self.clock = clock
        self.slurm_metrics = SlurmMetrics()
        self.node = host.config.slurm.node or host.config.node(lambda: host.hostname)
        self.factory = EventFactory(host.config.node(lambda: host.hostname))
        self.agent: SlurmAgent | None = None
        self.last: SlurmRound | None = None
        self._failing: str | None = None
        self._failing_since = 0.0
        self._last_decision: str | None = None
        self._last_note = ""
        self._last_node_event: tuple[str, str] | None = None
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------------------------------ wiring
    def attach(self, act: Actuator) -> None:
        """Make the agent on the actuator's executor (before the journal is reconciled)."""
        cfg = self.config
        settings = slurm_settings(cfg.slurm)
        self.agent = SlurmAgent(
            settings,
            self.node,
            executor=act.executor,
            planner=planner_settings(cfg.planner),
            simulated=self.simulated(),
            wall=self.wall,
            clock=self.clock,
            on_event=self._job_event,
        )
        log.info(
            "Slurm: node %s, %s, gres.conf block in %s, GRES map %s",
            self.node,
            f"partitions {', '.join(settings.partitions)}" if settings.partitions else "the node's own partitions",
            settings.gres_conf,
            settings.gres_map,
        )
        if cfg.mode != "act":
            pending = [
                p
                for p in act.journal.unfinished_plans()
                for a in act.journal.actions(p)
                if a.kind == "slurm_reregister"
            ]
            if pending:
                log.warning(
                    "a re-registration of node %s was cut short (plan %s); mode %s leaves it as it is: the node may "
                    "stay drained or unregistered until flexmigd runs in mode act",
                    self.node,
                    pending[0],
                    cfg.mode,
                )

    def reload(self, config: Config) -> None:
        """New mode, planner settings and the reloadable ``[slurm]`` keys (the rest need a restart)."""
        self.config = config
        agent = self.agent
        if agent is not None:
            agent.planner_settings = planner_settings(config.planner)
            fresh = slurm_settings(config.slurm)
            agent.settings = fresh
            agent.cost = agent.registration_cost(fresh)
        self._last_decision = None
        self._wake.set()

    # ------------------------------------------------------------------------------------------ component
    async def start(self) -> None:
        """Nothing to open: the agent is made when the actuator is built (:meth:`attach`)."""

    async def drain(self) -> None:
        """A round in flight holds the actuator's action lock: the actuator's drain waits for it."""

    async def close(self) -> None:
        """Nothing held: the agent's actions are in the actuator's journal."""

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """``flexmig_slurm_*``."""
        return (self.slurm_metrics,)

    # ------------------------------------------------------------------------------------------ loop
    async def run(self) -> None:
        """A cheap probe every ``[slurm] probe_s``; a round when it saw something move, or every ``interval_s``."""
        loop = asyncio.get_running_loop()
        last_round = -float("inf")
        counters: tuple[int, ...] | None = None
        while True:
            woke = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.slurm.probe_s):
                    await self._wake.wait()
                    woke = True
            self._wake.clear()
            agent = self.agent
            if agent is None or self.actuator.act is None or self.actuator.stopping:
                continue
            due = woke or loop.time() - last_round >= self.config.slurm.interval_s
            if not due:
                try:
                    seen = await agent.client.counters()
                    due = seen != counters or await agent.slurmd.state() == "crashed"
                    counters = seen
                except SlurmError:
                    due = loop.time() - last_round >= self.config.slurm.interval_s
                except Exception:  # a probe is a hint only; the timed round still comes
                    log.debug("Slurm probe failed", exc_info=True)
            if not due:
                continue
            last_round = loop.time()
            try:
                await self.round()
            except Exception:  # a bug must not end the daemon; logged with its traceback
                log.exception("Slurm round failed")

    def wake(self) -> None:
        """Run a round soon."""
        self._wake.set()

    async def round(self) -> SlurmRound | None:
        """One round under the action lock; None when Slurm could not be read (logged once, nothing changed)."""
        agent = self.agent
        if agent is None:
            return None
        async with self.actuator.action_lock:
            if self.actuator.stopping:
                return None
            mode = self.config.mode
            try:
                rnd = await agent.round(mode)
            except SlurmError as exc:
                self._unreachable(exc)
                return None
            except FlexmigError as exc:
                log.warning("Slurm round: %s", exc)
                return None
        self._reachable()
        self.last = rnd
        self._account(rnd, mode)
        return rnd

    # ------------------------------------------------------------------------------------------ reporting
    def _unreachable(self, exc: SlurmError) -> None:
        self.slurm_metrics.read_failed()
        text = str(exc)
        if self._failing != text:
            if self._failing is None:
                self._failing_since = self.clock()
            self._failing = text
            log.warning("%s", describe_error(exc))
            self._publish(unreachable_event(self.factory, self.node, text))

    def _reachable(self) -> None:
        if self._failing is None:
            return
        down = max(0.0, self.clock() - self._failing_since)
        self._failing = None
        log.info("Slurm answers again (after %.0f s)", down)
        self._publish(reachable_event(self.factory, self.node, down))

    def _account(self, rnd: SlurmRound, mode: str) -> None:
        read = rnd.read
        if read is not None:
            d = read.demand
            self.slurm_metrics.read_ok(
                pending=len(d.pending_jobs),
                running=len(d.running),
                movable=len(d.movable),
                in_sync=read.in_sync,
                registered=read.registered_as,
            )
        if rnd.note and rnd.note != self._last_note:
            log.info("Slurm: %s", rnd.note)
        self._last_note = rnd.note

        if rnd.result is not None:
            for a in rnd.result.results:
                waited = dict(a.steps).get("await_idle")
                if waited is not None:
                    self.slurm_metrics.drained(waited)
                log.info(
                    "slurm_reregister #%d %s in %.2f s%s",
                    a.action_id,
                    a.outcome,
                    a.duration_s,
                    f": {a.error}" if a.error else "",
                )
        v = rnd.verdict
        if v is None or read is None:
            return
        self.slurm_metrics.decided(drain_s=v.drain_s, gain=v.gain, cost=v.cost, go=v.go)
        changes = plan_changes(rnd.plan)
        if not changes:
            return
        signature = json.dumps([v.go, changes, list(v.newly_served)])
        if signature == self._last_decision and rnd.result is None:
            return
        self._last_decision = signature
        log.info("Slurm plan (%s): %s; changes: %s", mode, v.reason, ", ".join(changes))
        movable = [r.job.job_id for r in read.demand.movable]
        self._publish(plan_event(self.factory, self.node, mode, v, rnd.plan, checkpoint=movable))

    def _job_event(self, kind: str, detail: dict[str, Any]) -> None:
        """From the agent: a Slurm job signalled, requeued or released, or (``slurm_node:WHAT``) a node event."""
        if kind.startswith("slurm_node:"):
            self._node_event(kind.split(":", 1)[1], detail)
            return
        action = kind.removeprefix("slurm_job_")
        self.slurm_metrics.job_action(action)
        step = detail.get("step")
        log.info("Slurm job %s %s%s", detail.get("slurm_job"), action, f" (checkpoint step {step})" if step else "")
        self._publish(job_event(self.factory, self.node, kind, detail))

    def _node_event(self, what: str, detail: dict[str, Any]) -> None:
        """A ``slurm_node`` event (the same one twice in a row is published once: a node left alone stays so)."""
        key = (what, str(detail.get("reason", "")))
        if key == self._last_node_event and what in ("left_alone", "refused"):
            return
        self._last_node_event = key
        if what == "slurmd_restarted":
            self.slurm_metrics.slurmd_restarted()
        log.info("Slurm node %s: %s: %s", self.node, what, detail.get("reason", ""))
        self._publish(node_event(self.factory, self.node, what, detail))

    def _publish(self, event: Event) -> None:
        if self.mqtt is not None:
            self.mqtt.findings.emit(event)
