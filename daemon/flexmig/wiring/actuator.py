"""The actuator and the planner in the running daemon: journal, control socket, planning rounds, action metrics.

:class:`ActuatorComponent` is the daemon's ``actuator`` component (:mod:`flexmig.wiring.component`):

* **start** (before READY, after the first sweep): build the :class:`~flexmig.act.service.Actuator` on the
  daemon's NVML worker thread (every NVML call of the actuator goes through ``worker.call``), reconcile the journal
  with NVML and the process table (in every mode: ranks still running are adopted; unfinished actions are finished
  or rolled back only in mode ``act``, the executor refuses otherwise), and bind the control socket
  (``[control]``). In mode ``act`` a state directory or socket that cannot be used stops the start; in ``observe``
  and ``advise`` it is logged and the daemon samples on without jobs, ``flexmig status`` or ``flexmig plan``;
* **dispatch**: :meth:`ActuatorComponent.dispatch` runs one control request line for the MQTT command listener,
  through the same operations and checks as the socket, whether or not ``[control]`` binds the socket;
* **loop** ``actuator``: serve the control socket (every row of :data:`flexmig.act.operation_table.OPERATIONS`:
  ``jobs.*`` from the actuator, ``status``, ``plan`` and ``standdown`` from here; the acting ones one at a time under
  the action lock, refused while stopping) and plan every ``planner.interval_s``: ``observe`` never plans;
  ``advise`` plans and publishes each new plan (``plan_proposed`` event, ``flexmig_planned_actions``), changing
  nothing; ``act`` also executes it;
* **drain** (SIGTERM): refuse new actions, let the one in flight finish or roll back for up to
  ``jobs.shutdown_grace_s``; past that the journal has the next start finish it;
* **close**: the control socket, the journal, the locks (and a simulated node's private directory);
* **reload** (SIGHUP): the new mode (``Actuator.set_mode``), planner settings and job policy at once;
* **metrics**: actions and plans (:mod:`flexmig.metrics.actions`), the journal's writes, ranks of no job.

Actions and plans reach the fleet as events (:mod:`flexmig.mqtt.action_events`, through the MQTT publisher
when ``[mqtt]`` is on) and Prometheus as :mod:`flexmig.metrics.actions`. Every action is also one log line.

The simulated node's demo workload (``flexmigd --sim``) never runs on an instance that a job holds or that an
action has touched since start (see :attr:`ActuatorComponent.workload_exclude`): its synthetic processes belong
to no registered job, so on those instances they would stop the actuator (it never destroys or moves onto an
instance running a process it cannot account for).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from flexmig.act import recovery
from flexmig.act.control import ControlServer, Handler
from flexmig.act.events import ActEvent
from flexmig.act.journal import JournalError
from flexmig.act.operation_table import DAEMON_OPERATIONS, Operation, bind
from flexmig.act.ranklogs import RankLogs
from flexmig.act.service import Actuator
from flexmig.clocks import Ages
from flexmig.config import Config, Mode
from flexmig.errors import FlexmigError, PlanRejectedError, StateInUseError, StorageError
from flexmig.jobspec.spec import JobPolicy
from flexmig.metrics.actions import ActionMetrics
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.metrics.runtime import JournalWriteMetrics
from flexmig.mqtt.action_events import ActionEventTranslator, ActionFacts, plan_actions, plan_event, plan_summary
from flexmig.mqtt.events import EventFactory
from flexmig.plan.types import Plan
from flexmig.storage import LockSet, prepare_dir
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.action_record import (
    action_facts,
    action_row,
    log_event,
    move_downtime,
    reconciled_nothing,
    slots_of,
)
from flexmig.wiring.actuator_host import ActuatorHost, ActuatorPaths
from flexmig.wiring.backend import NodeComponent
from flexmig.wiring.daemon_status import daemon_status
from flexmig.wiring.first_step import FirstSteps
from flexmig.wiring.mqtt import MqttComponent
from flexmig.wiring.plan_now import PlanRound, plan_now
from flexmig.wiring.planning import planner_settings
from flexmig.wiring.privileges import act_privilege_warning
from flexmig.wiring.standdown_request import standdown_request

__all__ = ["NODE_LOCK_DIR", "ActuatorComponent", "PlanRound"]

NODE_LOCK_DIR = Path("/run/flexmig")
"""Where a real node's GPU locks live (the systemd unit's RuntimeDirectory)."""

log = logging.getLogger(__name__)

_MIN_ROUND_GAP_S = 1.0  # planning rounds woken by events never come closer than this


def _submit_refusal(config: Config) -> str | None:
    """Why ``jobs.submit`` is refused under ``config``: a node whose jobs come from Slurm takes none of its own."""
    if not config.slurm.enabled:
        return None
    return "this node's jobs come from Slurm ([slurm] enabled = true): submit them with sbatch, not flexmig jobs submit"


def _rank_logs(cfg: Config) -> RankLogs:
    return RankLogs(max_bytes=cfg.jobs.rank_log_max_bytes, keep=cfg.jobs.rank_log_keep)


class ActuatorComponent:
    """The actuator, control socket and planner of one daemon. Also the actuator's event sink."""

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
        self.locks = locks or LockSet()
        self.node_lock_dir = node_lock_dir
        self._state_locks: list[Path] = []
        self._node_locks: list[Path] = []
        self.config = host.config
        self.mode: Mode = host.config.mode
        self.mqtt = mqtt
        self.wall = wall
        self.ages = Ages(wall, clock)
        """How long ago each job last moved and first started, on the monotonic clock (the journal's stamps are wall
        time)."""
        self.action_metrics = ActionMetrics()
        self.first_steps = FirstSteps(clock=clock)
        """Moves whose job has yet to report its first step (the job's own downtime)."""
        self.paths: ActuatorPaths | None = None
        self.act: Actuator | None = None
        self.control: ControlServer | None = None
        """The control socket's server, while it listens (``[control] enabled``)."""
        self.dispatcher: ControlServer | None = None
        """Runs control requests (the socket's, and MQTT commands') while the actuator runs, bound or not."""
        self.unavailable: str | None = None  # why the actuator could not start (observe/advise only)
        self.unknown_ranks: list[dict[str, Any]] | None = None
        """Ranks with flexmig's markers on this node that no journalled job knows (None until the actuator ran)."""
        self.workload_exclude: frozenset[tuple[int, int]] = frozenset()
        """Instances the simulator's demo workload must leave alone: held by a job or touched by an action."""
        self._touched: set[tuple[int, int]] = set()
        self._refreshed_at: tuple[int, int] | None = None  # the journal's stamp at the last refresh
        self._refreshed_touched: set[tuple[int, int]] = set()
        self._busy = asyncio.Lock()
        self._stopping = False
        self._simulated = True  # until start() knows the backend
        self._wake = asyncio.Event()
        self._rescan = asyncio.Event()  # set after each stop and move: look for unknown ranks again now
        self._last_signature: tuple[str, ...] | None = None
        self._translate = ActionEventTranslator(EventFactory(host.config.node(lambda: host.hostname)), self._facts)
        self._built: list[Callable[[Actuator], None]] = []

    # ------------------------------------------------------------------------------------------ start
    async def start(self) -> None:
        """Build the actuator, reconcile the journal, bind the control socket (see the module docstring)."""
        self.host.hub.subscribe(lambda _snapshot: self.refresh())
        backend = self.node.backend
        if backend is None:
            raise FlexmigError("the actuator needs an open NVML session")
        cfg = self.config
        self._simulated = backend.simulated
        self._check_privileges()
        try:
            self.paths = paths = ActuatorPaths.of(cfg, simulated=backend.simulated)
            if paths.private is not None:
                log.info("simulated node: journal, rank logs and control socket under %s", paths.private)
            self._lock_state(paths)
            if self.mode == "act":
                self._lock_node()
            act = Actuator.build(
                mode=self.mode,
                nvml=backend.nvml,
                offload=self.host.worker.call,
                devices=backend.devices,
                journal_path=paths.journal,
                logs_dir=paths.logs,
                policy=self._policy(cfg),
                events=self,
                settings=planner_settings(cfg.planner),
                ack_dir=cfg.jobs.ack_dir,
                rank_logs=_rank_logs(cfg),
            )
        except StateInUseError:
            self._unlock()
            raise  # in every mode: a second daemon on the same state or node must not run at all
        except (FlexmigError, OSError) as exc:
            self._unlock()
            self._give_up(f"cannot open the actuator's state: {exc}")
            return
        act.jobs.queue_when_full = True
        act.jobs.max_pending = cfg.jobs.max_pending
        act.executor.device_uuids_unique = not backend.simulated
        self.act = act
        try:
            for hook in self._built:  # before reconciling: a hook may add the runner of actions in the journal
                hook(act)
            for rec in act.journal.jobs():
                if rec.state == "running":
                    self._touched.update(s.key for s in rec.slots)
            self.refresh()
            # The dispatcher exists whether or not the socket is served: MQTT commands go through it too. It answers
            # while the journal is reconciled (finishing a Slurm re-registration can take a while); requests that
            # change anything wait for the reconciliation (it holds the action lock).
            act.jobs.refuse_submit = _submit_refusal(cfg)
            control = ControlServer(
                paths.socket,
                self._handlers(act),
                mode=cfg.control.socket_mode,
                max_wait_s=cfg.control.max_wait_s,
                on_dropped=self._dropped,
            )
            async with self._busy:
                self.dispatcher = control
                if cfg.control.enabled:
                    await control.start()
                    self.control = control
                    log.info("control socket at %s (mode %o)", paths.socket, cfg.control.socket_mode)
                summary = await act.start()
            self.unknown_ranks = list(summary.get("unknown_ranks", []))
            log.info("journal reconciled (mode %s): %s", self.mode, json.dumps(summary, default=str))
        except (FlexmigError, OSError) as exc:
            await self.close()
            self._give_up(f"actuator start-up failed: {exc}")

    def _dropped(self, op: str, why: str) -> None:
        """A control request dropped at its deadline (:mod:`flexmig.act.deadline`): the ``request_dropped`` event."""
        self.emit(ActEvent(kind="request_dropped", time_s=self.wall(), reason=why, detail={"op": op}))

    def on_built(self, hook: Callable[[Actuator], None]) -> None:
        """Call ``hook`` with the actuator once it is built, before the journal is reconciled (to add action
        handlers, :meth:`flexmig.act.executor.Executor.add_handler`)."""
        self._built.append(hook)

    @property
    def action_lock(self) -> asyncio.Lock:
        """Held while a plan or a mutating request runs; whoever else changes the node takes it too, so that a stop
        (:meth:`drain`) waits for them the same way."""
        return self._busy

    @property
    def stopping(self) -> bool:
        """True once a stop was asked: start nothing new."""
        return self._stopping

    async def dispatch(self, line: bytes) -> dict[str, Any]:
        """Run one control request line (an MQTT command's) as the control socket would; never raises.

        Works with ``[control] enabled = false`` too (nothing is bound for it); while the actuator is not running
        (it could not start in observe/advise, or the daemon stopped) the answer is a PlanRejectedError.
        """
        dispatcher = self.dispatcher
        if dispatcher is None:
            why = self.unavailable or ("the daemon is stopping" if self._stopping else "not started yet")
            return {"ok": False, "error": f"the actuator is not running: {why}", "type": "PlanRejectedError"}
        return await dispatcher.dispatch(line)

    def _lock_state(self, paths: ActuatorPaths) -> None:
        """Hold the journal's directory and the state directory (made first if missing, and checked) for as long as
        the actuator runs: a second daemon on them is refused, naming this one's pid."""
        dirs = [paths.journal.parent] if paths.private is not None else [paths.journal.parent, paths.logs.parent]
        for d in dict.fromkeys(Path(os.path.normpath(x.absolute())) for x in dirs):
            try:
                prepare_dir(d, "state directory")
            except StorageError as exc:
                raise JournalError(str(exc)) from None
            self._state_locks.append(self.locks.take_dir(d, "state directory"))

    def _lock_node(self) -> None:
        """Mode ``act``: hold every GPU of a real node (``gpu-<UUID>.lock`` in the node lock directory), so two
        daemons never reconfigure one GPU. A simulated node is held through its state file instead
        (:func:`flexmig.wiring.backend.open_backend`); one without a state file is this process's alone."""
        backend = self.node.backend
        snap = self.host.latest()
        if backend is None or backend.simulated or snap is None or self._node_locks:
            return
        prepare_dir(self.node_lock_dir, "lock directory", mode=0o755)
        for gpu in snap.gpus:
            self._node_locks.append(self.locks.take(self.node_lock_dir / f"gpu-{gpu.uuid}.lock", f"GPU {gpu.uuid}"))

    def _unlock(self, *, node_only: bool = False) -> None:
        held = self._node_locks if node_only else [*self._node_locks, *self._state_locks]
        for key in held:
            self.locks.drop(key)
        self._node_locks = []
        if not node_only:
            self._state_locks = []

    def _give_up(self, why: str) -> None:
        if self.mode == "act":
            raise FlexmigError(why)
        self.unavailable = why
        log.error("%s; in mode %s the daemon samples on without jobs and without the control socket", why, self.mode)

    @staticmethod
    def _policy(cfg: Config) -> JobPolicy:
        return JobPolicy(tuple(cfg.jobs.allowed_dirs), default_ack_timeout_s=cfg.jobs.ack_timeout_s)

    # ------------------------------------------------------------------------------------------ running
    async def run(self) -> None:
        """The planning loop (modes advise and act) until cancelled. The socket and journal are closed by :meth:`close`
        once every loop has ended: whether this one ran at all does not matter."""
        if self.act is None:
            await asyncio.Event().wait()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._plan_loop())
            tg.create_task(self._unknown_loop())

    async def _unknown_loop(self) -> None:
        """Look for unknown ranks again every planning interval, and at once after each stop and move: a process
        that escaped its job can appear at any time, not only while some are already known."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.planner.interval_s):
                    await self._rescan.wait()
            self._rescan.clear()
            if self.act is None or self._stopping:
                continue
            try:
                async with self.act.executor.action_lock:  # between actions: a move's two generations are no strays
                    self.unknown_ranks = await recovery.unknown_ranks(self.act.executor)
            except Exception as exc:  # a report only
                log.warning("could not look for ranks of no journalled job again: %s", exc)

    async def _plan_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last = -_MIN_ROUND_GAP_S
        while True:
            interval = self.config.planner.interval_s
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that arrives as the event is
            # set (drain() sets it just before the daemon cancels this task), and the loop would never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, last + interval - loop.time())):
                    await self._wake.wait()
            self._wake.clear()
            gap = last + _MIN_ROUND_GAP_S - loop.time()
            if gap > 0:
                await asyncio.sleep(gap)
            last = loop.time()
            if self._stopping:  # wait for the daemon to cancel us: closing now would cut the action in flight
                await asyncio.Event().wait()
            if self.mode == "observe":
                continue
            try:
                await self.round()
            except StorageError as exc:  # the journal's trouble (a bad row, a failing disk): one line, no traceback
                self.action_metrics.record_plan_failure()
                log.error("planning round failed: %s", exc)
            except Exception:  # a planner bug must not end the daemon; counted and logged
                self.action_metrics.record_plan_failure()
                log.exception("planning round failed")

    def wake(self) -> None:
        """Plan soon (a job was queued, or one ended and freed instances)."""
        self._wake.set()

    async def round(self) -> PlanRound:
        """One planning round in the current mode: plan; publish a new plan; in mode ``act`` execute it.

        The plan is worked out off the event loop and outside the action lock (:meth:`plan_now`), so a long queue
        keeps no control request waiting; the lock is taken to execute only. A plan worked out while something else
        changed the journal (a move, a start, a job's exit: anything but a newly queued job) is not executed: the
        round wakes the loop to plan again from what is true now.
        """
        if self._stopping:
            return PlanRound(Plan(), {}, "stopping")
        act = self.act
        revision = act.journal.revision if act is not None else None
        result = await self.plan_now(source="daemon")
        if result.error is not None:
            self.action_metrics.record_plan_failure()
            log.warning("planning round: %s", result.error)
            return result
        plan = result.plan
        async with self._busy:
            mode = self.mode
            if self._stopping:
                return PlanRound(Plan(), {}, "stopping")
            if plan and mode == "act" and (self.act is None or self.act.journal.revision != revision):
                log.debug("planning round: the journal changed while the plan was worked out; planning again")
                self.wake()
                return PlanRound(Plan(), result.document, "stale")
            self.action_metrics.record_plan([a["action"] for a in plan_actions(plan)], plan.cost_s)
            if not plan:
                self._last_signature = None
                return result
            signature = tuple(json.dumps(a, sort_keys=True) for a in plan_actions(plan))
            if signature != self._last_signature or mode == "act":
                self._last_signature = signature
                self._publish_plan(plan, mode)
            if mode == "act" and self.act is not None:
                if self._stopping:  # SIGTERM came while this plan was being made: start nothing new
                    log.info("planner: plan not executed: the daemon is stopping")
                    return PlanRound(plan, result.document, "stopping")
                began = time.monotonic()
                try:
                    res = await self.act.execute(plan, origin="planner")
                except PlanRejectedError as exc:  # the journal cannot be written now, or the daemon stops
                    self.action_metrics.record_plan_failure()
                    log.warning("planning round: %s", exc)
                    return PlanRound(plan, result.document, str(exc))
                log.info(
                    "plan %d %s in %.1f s (estimated %.1f s)",
                    res.plan_id,
                    "completed" if res.ok else "did not complete",
                    time.monotonic() - began,
                    plan.cost_s,
                )
            return result

    def _publish_plan(self, plan: Plan, mode: str) -> None:
        what = "executing" if mode == "act" else "proposing (advise: nothing is changed)"
        log.info("planner %s: %s", what, plan_summary(plan))
        for item in plan_actions(plan):
            log.info("  %s %s: %s (~%.1f s)", item["action"], item["target"], item["reason"], item["cost_s"])
        for note in plan.notes:
            log.info("  note: %s", note)
        if self.mqtt is not None:
            self.mqtt.findings.emit(plan_event(self._translate.factory, plan, mode, self.wall()))

    async def plan_now(self, *, source: str, requests: tuple[str, ...] = ()) -> PlanRound:
        """What the planner would do now (:func:`flexmig.wiring.plan_now.plan_now`); changes nothing."""
        act = self.act
        if act is None:
            raise PlanRejectedError(self.unavailable or "the actuator is not running")
        return await plan_now(
            act, self.config.planner, mode=self.mode, ages=self.ages, wall=self.wall, source=source,
            requests=requests,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------ control ops
    def _handlers(self, act: Actuator) -> dict[str, Handler]:
        """Every operation of the table: the jobs API's and this component's, the acting ones serialized."""

        def serialize(op: Operation[Any], handler: Handler) -> Handler:
            return self._serialized(handler) if op.acting else handler

        return {**act.jobs.handlers(serialize), **bind(DAEMON_OPERATIONS, self, serialize)}

    def _serialized(self, handler: Handler) -> Handler:
        """``handler`` (an acting operation's) run under the action lock (no plan runs meanwhile), refused while
        stopping; the planner is woken for a job it queued."""

        async def run(args: Mapping[str, Any]) -> Any:
            act = self.act
            if act is None:
                raise PlanRejectedError(self.unavailable or "the actuator is not running")
            # A journal write that waits for space (an action in flight, a job's exit record) refuses this at once
            # instead of letting it hang behind the write.
            async with act.executor.durable.hold(self._busy, "the request"):
                if self._stopping:
                    raise PlanRejectedError("the daemon is stopping; try again after it restarts")
                result = await handler(args)
            self.refresh()
            if isinstance(result, dict) and result.get("queued"):
                self.wake()
            return result

        return run

    async def status_request(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The ``status`` operation: served from the latest snapshot and the journal (no NVML call)."""
        snap = self.host.latest()
        if snap is None:
            raise PlanRejectedError("no sweep published yet")
        return self.status(snap)

    def status(self, snap: Snapshot) -> dict[str, Any]:
        """The status document of ``snap`` with this daemon's jobs, mode and recent actions."""
        return daemon_status(
            snap, self.act, mode=self.mode, in_progress=self.action_metrics.in_progress(),
            unavailable=self.unavailable, unknown_ranks=self.unknown_ranks,
        )  # fmt: skip

    def unknown_rank_count(self) -> int | None:
        """How many ranks of no journalled job run on this node (None while the actuator has not looked)."""
        return None if self.unknown_ranks is None else len(self.unknown_ranks)

    async def plan_request(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The ``plan`` operation: what the planner would do now, with ``requests`` (``[Nx]PROFILE``) queued too."""
        result = await self.plan_now(source="daemon", requests=tuple(args["requests"]))
        return result.document

    async def standdown_request(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The ``standdown`` operation (:mod:`flexmig.wiring.standdown_request`), under the action lock."""
        return await standdown_request(self, args)

    def set_mode(self, mode: Mode, why: str) -> None:
        """Switch the running daemon to ``mode`` (a stand-down does: no more planning); the file's mode returns at
        the next reload or restart."""
        old = self.mode
        self.mode = mode
        if self.act is not None:
            self.act.set_mode(mode)
        if self.mqtt is not None:
            self.mqtt.findings.mode = mode
        if old != mode:
            log.info("mode %s -> %s (%s)", old, mode, why)
            self._last_signature = None

    # ------------------------------------------------------------------------------------------ events
    def emit(self, event: ActEvent) -> None:
        """The actuator's event sink: metrics, the demo workload's exclusions, a log line, the fleet event."""
        act = self.act
        row = None if self.act is None else action_row(self.act.journal, event.action_id)
        if event.kind == "action_started" and row is not None:
            self._touched.update(slots_of(row))
        downtime = None
        moved = event.kind in ("action_completed", "action_failed") and row is not None
        if moved and row is not None and row.kind in ("stop", "migrate", "resplit", "restart"):
            self._rescan.set()
        if moved and row is not None and row.kind in ("migrate", "resplit"):
            downtime = None if self.act is None else move_downtime(self.act.journal, event.action_id)
            if event.kind == "action_completed" and row.job is not None and event.action_id is not None:
                self._expect_first_step(row.job, row.kind, event.action_id, downtime)
        self.action_metrics.record(event, downtime)
        if act is not None:
            self.refresh()
        fleet = self._translate(event, mode=self.mode)
        if fleet is not None:
            log_event(fleet)
            if self.mqtt is not None and not reconciled_nothing(event):
                self.mqtt.findings.emit(fleet)
        if event.kind in ("job_failed",) or (event.kind == "job_exited" and event.detail.get("state") == "done"):
            self.wake()
        if event.kind == "action_completed" and event.action == "stop":
            self.wake()

    def _expect_first_step(self, job: str, action: str, action_id: int, pause_s: float | None) -> None:
        """After a completed move: wait for the job's first-step report, if its acknowledgement said when its last
        step before the move ended (a hook that says nothing gets no job-side figure)."""
        if self.first_steps.waiting():
            # The job's report of its previous move may be there already (a move right after a move, before the
            # next sweep read it): take it before this move's wait replaces that one.
            self._report_first_steps()
        act = self.act
        rec = None if act is None else act.journal.get_job(job)
        if act is None or rec is None or rec.state != "running" or rec.last_ack is None:
            return
        if rec.last_ack.step_done_s is None:
            self.first_steps.forget(job)
            return
        self.first_steps.expect(
            job,
            action=action,
            action_id=action_id,
            generation=rec.generation,
            step_done_s=rec.last_ack.step_done_s,
            pause_s=pause_s,
            ack_path=act.supervisor.acks.path(rec),
        )

    def _report_first_steps(self) -> None:
        """The moved jobs that reported their first step: their own downtime, exported and logged beside
        flexmig's share."""
        for r in self.first_steps.poll():
            self.action_metrics.record_job_downtime(r.action, r.downtime_s)
            share = "unknown" if r.pause_s is None else f"{r.pause_s:.2f} s"
            log.info(
                "job_resumed job %s generation %d after %s #%d: job downtime %.2f s (its last step before the "
                "checkpoint to its first step after the move; flexmig's share %s)",
                r.job, r.generation, r.action, r.action_id, r.downtime_s, share,
            )  # fmt: skip

    def _facts(self, action_id: int) -> ActionFacts:
        """What the fleet event of ``action_id`` says beyond the actuator's event (plan, origin, target, downtime)."""
        return ActionFacts() if self.act is None else action_facts(self.act.journal, action_id)

    def refresh(self) -> None:
        """Job counts for the metrics, and the instances the demo workload must leave alone."""
        if self.act is None:
            return
        if self.first_steps.waiting():
            self._report_first_steps()
        journal = self.act.journal  # runs at every sweep: read again only when the journal may have changed
        stamp = journal.stamp()
        if stamp == self._refreshed_at and self._touched == self._refreshed_touched:
            return
        self.action_metrics.set_jobs(journal.job_counts())
        held = {s.key for rec in journal.jobs_in("running") for s in rec.slots}
        self.workload_exclude = frozenset(self._touched | held)
        self._refreshed_at, self._refreshed_touched = stamp, set(self._touched)

    # ------------------------------------------------------------------------------------------ reload, stop
    def reload(self, config: Config) -> None:
        """Apply a reloaded configuration: mode, planner settings, job policy (socket and state paths: at restart)."""
        old = self.mode
        if config.mode == "act" and old != "act" and self.act is not None:
            try:
                self._lock_node()
            except FlexmigError as exc:
                log.error("configuration reload: mode stays %s, not act: %s", old, exc)
                config = replace(config, mode=old)
        self.config = config
        self.mode = config.mode
        if self.act is not None:
            self.act.set_mode(config.mode)
            self.act.set_policy(self._policy(config))
            self.act.jobs.settings = planner_settings(config.planner)
            self.act.supervisor.rank_logs = _rank_logs(config)
            self.act.jobs.max_pending = config.jobs.max_pending
        if self.dispatcher is not None:
            self.dispatcher.max_wait_s = config.control.max_wait_s
        if self.mqtt is not None:
            self.mqtt.findings.mode = config.mode
        if old != config.mode:
            log.info("mode %s -> %s", old, config.mode)
            self._last_signature = None
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
        self._stopping = True
        if self.act is not None:  # a plan already running starts none of its actions not yet begun
            self.act.executor.stopping = True
        self._wake.set()
        grace = self.config.jobs.shutdown_grace_s
        if self._busy.locked():
            log.info("stopping: waiting up to %.0f s for the action in flight", grace)
        try:
            async with asyncio.timeout(grace):
                await self._busy.acquire()
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
        control, self.control = self.control, None
        if control is not None:
            await control.close()
        act, self.act = self.act, None
        if act is not None:
            running = any(rec.state in ("running", "pending") for rec in act.journal.jobs())
            await act.close()
            paths = self.paths
            if paths is not None and paths.private is not None and not running:
                shutil.rmtree(paths.private, ignore_errors=True)
        self._unlock()

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """Actions, plans and jobs; the journal's writes; ranks of no journalled job."""
        return (
            self.action_metrics,
            JournalWriteMetrics(lambda: self.act.executor.durable if self.act is not None else None),
            LossMetrics(unknown_ranks=self.unknown_rank_count),
        )
