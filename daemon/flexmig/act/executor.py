"""The executor: carries out a Plan on the node, one journalled step at a time, and recovers after a crash.

A migration (and a re-split, which is a migration to another number of instances) runs these steps, each written
to the journal before it runs (:mod:`flexmig.act.steps`):

[``standby``] → ``clear_ack`` → ``request`` (checkpoint signal) → ``await_ack`` → ``await_exit``
(:mod:`flexmig.act.checkpoint`) → ``layout`` (which instances to destroy and create, decided once) →
``destroy:G@S``… → ``create:G@S``… → ``launch`` (new generation, with ``FLEXMIG_RESUME``).

``standby`` runs for jobs with ``[hook] standby = true`` whose move has targets that exist before it (not the
job's own instances): the next generation's ranks start there and do the job's start-up while the current one
still trains; the step ends when they say they are ready (or after ``standby_timeout_s``). ``launch`` then hands
them the acknowledged checkpoint and the world over their channel instead of starting them, and starts the rest
(targets the move created in place of the job's own) as usual. A standby rank that exits before it is ready
cancels the move (the job's next start-up fails: the running generation is not stopped for it); a move cancelled
or failed later drops its standby ranks. After a crash no channel survives: standby ranks of a previous daemon
end on their own and are killed if found, and a ``launch`` that may have handed some over is run again as a
fresh generation started cold, so no generation runs twice.

Safety rules enforced here and in :mod:`flexmig.act.preconditions`, not by callers:

* ``observe`` and ``advise`` never act: :meth:`Executor.execute` refuses before writing anything;
* an instance that runs a process of no registered job is never destroyed;
* a job is stopped only after its checkpoint is acknowledged: no acknowledgement within the timeout cancels
  the move and the job keeps running;
* NVML errors (IN_USE, INSUFFICIENT_RESOURCES, GPU_IS_LOST, ...) after the checkpoint roll the move back:
  instances created by the action are destroyed, destroyed ones re-created, and the job relaunched where it was
  from the acknowledged checkpoint; if even that fails the job is marked ``failed`` with its checkpoint kept.

Each action's payload is typed (:mod:`flexmig.act.encoding`); rank exits outside any action are settled by
:mod:`flexmig.act.settling`. Recovery: every step is idempotent given what NVML and the process table show, so
:meth:`Executor.reconcile` re-runs each unfinished action from its first step not ``done``, then finishes the rest
of its plan.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, Literal

from flexmig.act import deadline
from flexmig.act.checkpoint import Checkpointer
from flexmig.act.devices import DeviceProcessTable
from flexmig.act.durable import Durable
from flexmig.act.encoding import (
    ACTION_KINDS,
    CreateInstancePayload,
    DestroyInstancePayload,
    EncodedAction,
    MigratePayload,
    Payload,
    ResplitPayload,
    RestartPayload,
    StartPayload,
    StopPayload,
    encode,
    encode_action,
    is_undo,
    payload_of,
    reason_of,
)
from flexmig.act.events import ActEvent, EventSink
from flexmig.act.generations import Generations
from flexmig.act.instances import Instances
from flexmig.act.journal import ActionRow, Journal, JournalError
from flexmig.act.migops import MigOps, Offload
from flexmig.act.mode import RuntimeMode
from flexmig.act.nodeview import NodeView
from flexmig.act.preconditions import (
    check_destroy,
    check_movable,
    check_move_targets,
    check_start_targets,
    check_startable,
)
from flexmig.act.procs import ProcessScanner
from flexmig.act.records import JobRecord, Slot
from flexmig.act.results import ActionResult, PlanResult, action_result
from flexmig.act.settling import Settler
from flexmig.act.steps import ActionRun, Refused, StepFailed
from flexmig.act.supervisor import Supervisor
from flexmig.config import Mode
from flexmig.errors import JobSpecError, PlanRejectedError
from flexmig.hook.protocol import Ack
from flexmig.jobspec.spec import JobPolicy, recheck_spec
from flexmig.plan.types import Plan

__all__ = ["ActionRunner", "Executor", "new_job_uid"]

ActionRunner = Callable[[ActionRun], Awaitable[None]]
"""Runs one journalled action of a kind that lives outside ``act/`` (``slurm_reregister``), given its step runner
(whose ``row`` holds the payload)."""

_NOT_AFTER_STOP = frozenset({"start", "migrate", "resplit", "create_instance"})
"""Actions a plan does not begin once the daemon is stopping: they would start ranks (or make room for some) after
it said it stops. The rest (destroying what a finished move left, a stop, a restart in place) still run."""

log = logging.getLogger(__name__)


def outside_runners(runners: Mapping[str, ActionRunner] | None) -> Mapping[str, ActionRunner]:
    """The runners of action kinds that live outside ``act/``, by kind, fixed when the executor is built so that
    they are there before :func:`flexmig.act.recovery.reconcile` finishes such an action a crash cut short;
    ValueError for a kind of the executor's own."""
    own = sorted(set(runners or {}) & ACTION_KINDS)
    if own:
        raise ValueError(f"action kind {own[0]!r} is the executor's own")
    return MappingProxyType(dict(runners or {}))


class Executor:
    """Executes plans and the control API's job actions; one action at a time, each fully journalled."""

    def __init__(
        self,
        *,
        mode: Mode | RuntimeMode,
        mig: MigOps,
        supervisor: Supervisor,
        journal: Journal,
        events: EventSink,
        scanner: ProcessScanner,
        devices: DeviceProcessTable,
        offload: Offload,
        wall: Callable[[], float] = time.time,
        poll_s: float = 0.005,
        resend_s: float = 1.0,
        term_grace_s: float = 10.0,
        runners: Mapping[str, ActionRunner] | None = None,
    ) -> None:
        self.runtime_mode = mode if isinstance(mode, RuntimeMode) else RuntimeMode(mode)
        """The daemon's mode (shared with whoever else reads it: :mod:`flexmig.act.mode`)."""
        self.mig = mig
        self.supervisor = supervisor
        self.journal = journal
        self.events = events
        self.scanner = scanner
        self.devices = devices
        self.offload = offload
        self.wall = wall
        self.term_grace_s = term_grace_s
        self.device_uuids_unique = True
        """MIG device UUIDs name this node's instances alone (real hardware). A simulated node's derive from its
        seed and repeat across simulated daemons, so there only NVML's process lists tie a process to the node."""
        self.policy: JobPolicy | None = None
        """What job specs may do now (``[jobs]``); every job is checked against it again before each launch, since
        its spec comes back from the journal, not from a file just checked (None: no check, for tests of steps)."""
        self._lock = asyncio.Lock()
        self._busy: set[str] = set()
        self.durable = Durable(journal.path, wall=wall)
        """Journal writes of actions in flight wait out a full disk (:mod:`flexmig.act.durable`)."""
        self.running: ActionRun | None = None
        """The action running now, for the control API's view of its job."""
        self.stopping = False
        """The daemon is stopping (SIGTERM): the action in flight finishes (or rolls back), but no action of a plan
        that would start ranks (:data:`_NOT_AFTER_STOP`) is begun; it and the rest of its plan are skipped, saying
        so (instances the plan made are destroyed again), and the next start plans afresh."""
        # The MIG instance steps (flexmig.act.instances) and the launch steps (flexmig.act.generations).
        self.instances = Instances(mig=mig, devices=devices, offload=offload, journal=journal, supervisor=supervisor)
        self.generations = Generations(
            supervisor=supervisor, journal=journal, events=events, scanner=scanner, instances=self.instances,
            durable=self.durable, policy_problem=self.policy_problem, wall=wall, term_grace_s=term_grace_s,
        )  # fmt: skip
        self.checkpointer = Checkpointer(
            supervisor=supervisor, events=events, wall=wall, poll_s=poll_s, resend_s=resend_s, term_grace_s=term_grace_s
        )
        self.settler = Settler(
            journal=journal, supervisor=supervisor, events=events, lock=self._lock, busy=self._busy,
            restart=self._restart_in_place, wall=wall, term_grace_s=term_grace_s, durable=self.durable,
        )  # fmt: skip
        supervisor.on_exit = self.settler.on_exit
        self.handlers = outside_runners(runners)
        """Runners of action kinds that live outside ``act/`` (``slurm_reregister``), given at construction."""

    @property
    def mode(self) -> Mode:
        """The mode now."""
        return self.runtime_mode.value

    @mode.setter
    def mode(self, mode: Mode) -> None:
        self.runtime_mode.set(mode)

    # ------------------------------------------------------------------------------------------ entry
    def require_act(self) -> None:
        """Raise PlanRejectedError unless the mode is ``act``."""
        if self.mode != "act":
            raise PlanRejectedError(f"mode is {self.mode!r}: flexmig changes nothing outside mode 'act'")

    async def execute(self, plan: Plan, origin: str = "planner") -> PlanResult:
        """Journal ``plan`` and run its actions in order; stops at the first action that fails or is cancelled."""
        self.require_act()
        encoded = [encode_action(a) for a in plan.actions]
        return await self.execute_encoded(encoded, origin, plan.notes)

    async def execute_encoded(
        self, actions: Sequence[EncodedAction], origin: str, notes: Sequence[str] = ()
    ) -> PlanResult:
        """Like :meth:`execute` for already encoded actions (the control API's ``stop`` is not a plan action)."""
        self.require_act()
        # A request (not the planner's next round) cuts short what the action in flight waits for at will.
        async with self.durable.hold(self._lock, f"plan from {origin}", contends=origin != "planner"):
            deadline.begin()  # a control request that waited here past its client's deadline is dropped now
            plan_id, _ = self.journal.begin_plan(origin, actions, notes)
            return await self._run_plan(plan_id)

    async def _run_plan(self, plan_id: int) -> PlanResult:
        """Run a plan's pending actions in order. When one fails or is cancelled, the rest are skipped and the
        instances the plan created up front (still free) are destroyed again by appended ``undo`` actions."""
        results: list[ActionResult] = []
        stop = False
        rows = self.journal.actions(plan_id)
        undo_added = any(is_undo(r) for r in rows)
        i = 0
        while True:
            if i >= len(rows):
                if stop and not undo_added:
                    undo_added = True
                    undo = self._undo_actions(self.journal.actions(plan_id))
                    if undo:
                        write = partial(self.journal.append_actions, plan_id, undo)
                        await self.durable.write(f"undo actions of plan {plan_id}", write)
                        rows = self.journal.actions(plan_id)
                        continue
                break
            row = rows[i]
            i += 1
            undoing = is_undo(row)
            if row.state in ("done", "failed", "cancelled", "skipped"):
                results.append(self._result(row))
                stop = stop or (row.state != "done" and not undoing)
                continue
            held_back = self.stopping and row.kind in _NOT_AFTER_STOP and row.state == "pending"
            if (stop or held_back) and not undoing:
                why = "the daemon is stopping" if held_back else "an earlier action of the plan did not complete"
                stop = True
                await self.durable.write(
                    f"end of action {row.id}", partial(self.journal.finish_action, row.id, "skipped", why)
                )
                res = self._result(self.journal.action(row.id))
                self._emit("action_skipped", row, res)
                results.append(res)
                continue
            res = await self._run_action(row)
            results.append(res)
            if not undoing:
                stop = stop or res.outcome != "completed"
        end = "failed" if stop else "done"
        await self.durable.write(f"end of plan {plan_id}", lambda: self.journal.finish_plan(plan_id, end))
        return PlanResult(plan_id, tuple(results))

    def _undo_actions(self, rows: Sequence[ActionRow]) -> list[EncodedAction]:
        """Destroy actions for the instances this plan's CreateInstance actions made and no job holds."""
        held = self.held()
        out: list[EncodedAction] = []
        for row in reversed(rows):
            if row.kind != CreateInstancePayload.KIND or row.state != "done":
                continue
            p = payload_of(row)
            if isinstance(p, CreateInstancePayload) and p.slot.key not in held:
                reason = f"undo action {row.id}: its plan stopped before using the instance"
                out.append(encode(DestroyInstancePayload(p.slot, reason, undo=True)))
        return out

    def _result(self, row: ActionRow) -> ActionResult:
        return action_result(row, self.journal.steps(row.id), self.wall())

    def _emit(self, kind: str, row: ActionRow, res: ActionResult | None = None, **detail: Any) -> None:
        self.events.emit(
            ActEvent(
                kind=kind,
                time_s=self.wall(),
                action=row.kind,
                action_id=row.id,
                job=row.job,
                reason=reason_of(row),
                error=res.error if res else None,
                duration_s=res.duration_s if res else None,
                steps=res.steps if res else (),
                detail=detail,
            )
        )

    async def _run_action(self, row: ActionRow) -> ActionResult:
        run = ActionRun(self.journal, row, self.durable)
        self.running = run
        try:
            return await self._run_action_as(run)
        finally:
            self.running = None

    async def _run_action_as(self, run: ActionRun) -> ActionResult:
        row = run.row
        await run.write("start", lambda: self.journal.start_action(row.id))
        self._emit("action_started", row, resumed=run.resumed)
        state: Literal["done", "failed", "cancelled"] = "done"
        error: str | None = None
        try:
            extra = self.handlers.get(row.kind)
            if extra is not None:
                await extra(run)
            elif row.kind not in ACTION_KINDS:
                raise Refused(f"unknown action kind {row.kind!r}")
            else:
                await self._dispatch(run, payload_of(row))
        except Refused as exc:
            state, error = "failed", f"refused: {exc}"
        except StepFailed as exc:
            state = "cancelled" if exc.outcome == "cancelled" else "failed"
            error = str(exc)
        except JournalError as exc:  # a row that does not decode: one line, no traceback
            log.error("action %d (%s): %s", row.id, row.kind, exc)
            state, error = "failed", str(exc)
        except Exception as exc:  # a bug must not leave the action 'running' forever
            log.exception("action %d (%s) crashed", row.id, row.kind)
            state, error = "failed", f"internal error: {exc!r}"
        await run.write("end", lambda: self.journal.finish_action(row.id, state, error))
        res = self._result(self.journal.action(row.id))
        kind = {"done": "action_completed", "failed": "action_failed", "cancelled": "action_cancelled"}[state]
        self._emit(kind, row, res)
        return res

    async def _dispatch(self, run: ActionRun, payload: Payload) -> None:
        if isinstance(payload, CreateInstancePayload):
            await self._create_instance(run, payload)
        elif isinstance(payload, DestroyInstancePayload):
            await self._destroy_instance(run, payload)
        elif isinstance(payload, StartPayload):
            await self._start(run, payload)
        elif isinstance(payload, MigratePayload | ResplitPayload):
            await self._move(run, payload)
        elif isinstance(payload, StopPayload):
            await self._stop(run, payload)
        else:
            await self._restart(run)

    # ------------------------------------------------------------------------------------ node helpers
    # ------------------------------------------------------------------------------------ node helpers
    async def view(self) -> NodeView:
        """A fresh view of the node (:meth:`flexmig.act.instances.Instances.view`)."""
        return await self.instances.view()

    def held(self, exclude: str | None = None) -> dict[tuple[int, int], str]:
        """Instances held by running jobs: ``(gpu, start) -> job``."""
        return self.instances.held(exclude)

    async def _destroy_idle(self, slot: Slot) -> dict[str, Any]:
        """The idempotent destroy step (:meth:`flexmig.act.instances.Instances.destroy_idle`)."""
        return await self.instances.destroy_idle(slot)

    async def _create_at(self, slot: Slot) -> dict[str, Any]:
        """The idempotent create step (:meth:`flexmig.act.instances.Instances.create_at`)."""
        return await self.instances.create_at(slot)

    def record_ranks(self, rec: JobRecord) -> None:
        """Journal which processes are the running ranks of ``rec``'s generation
        (:meth:`flexmig.act.generations.Generations.record_ranks`)."""
        self.generations.record_ranks(rec)

    def policy_problem(self, rec: JobRecord) -> str | None:
        """Why the current policy would refuse ``rec``'s spec were it submitted now (one line naming the journal
        row and the field), or None."""
        if self.policy is None:
            return None
        try:
            recheck_spec(rec.spec, self.policy, f"{self.journal.path}: jobs row {rec.name!r}: spec")
        except JobSpecError as exc:
            return str(exc)
        return None

    # ------------------------------------------------------------------------------- standalone actions
    async def _create_instance(self, run: ActionRun, p: CreateInstancePayload) -> None:
        slot = p.slot
        await run.step(f"create:{slot.gpu}@{slot.start}", slot.to_json(), lambda: self.instances.create_at(slot))

    async def _destroy_instance(self, run: ActionRun, p: DestroyInstancePayload) -> None:
        slot = p.slot
        if not run.resumed:
            check_destroy(slot, self.held())
        await run.step(f"destroy:{slot.gpu}@{slot.start}", slot.to_json(), lambda: self.instances.destroy_idle(slot))

    # ------------------------------------------------------------------------------------ job actions
    async def _start(self, run: ActionRun, p: StartPayload) -> None:
        rec = run.job(run.row.job)
        if not run.resumed:
            check_startable(rec)
            check_start_targets(rec, p.to, await self.view(), self.held(exclude=rec.name))
        self._busy.add(rec.name)
        try:
            placed = await self.instances.with_uuids(p.to)
            await self.generations.launch(run, "launch", rec, placed, rec.last_ack)
        finally:
            self._busy.discard(rec.name)

    async def _restart(self, run: ActionRun) -> None:
        """Relaunch a job in place from its newest checkpoint (it acknowledged after a move was cancelled)."""
        rec = run.job(run.row.job)
        self._busy.add(rec.name)
        try:
            placed = await self.instances.with_uuids(rec.slots)
            await self.generations.launch(run, "launch", rec, placed, rec.last_ack)
        finally:
            self._busy.discard(rec.name)

    async def _restart_in_place(self, job: str) -> None:
        """The settler found a checkpoint acknowledged after its move was cancelled: in mode ``act``, run a
        ``restart`` action for ``job`` (the caller holds the lock)."""
        if self.mode == "act":  # the job's ranks have exited: this plan must be recorded, however long it takes
            plan_id, _ = await self.durable.write(
                f"restart plan of job {job}",
                lambda: self.journal.begin_plan("restart", [encode(RestartPayload("late acknowledgement"), job)]),
            )
            await self._run_plan(plan_id)

    async def _move(self, run: ActionRun, p: MigratePayload | ResplitPayload) -> None:
        """Migrate or re-split: checkpoint, stop, reconfigure, relaunch; roll back on failure after the ack."""
        rec = run.job(run.row.job)
        src, dst = p.sources, p.to
        if not run.resumed:
            problem = self.policy_problem(rec)
            if problem is not None:  # it would be relaunched from the journal's spec: leave it where it runs
                raise Refused(f"not moved: {problem}")
            check_movable(rec, src, dst, alive=len(self.supervisor.alive(rec.name)))
            view = await self.view()
            check_move_targets(rec, src, dst, view, self.held(exclude=rec.name), mine=self.supervisor.pids(rec.name))
        self._busy.add(rec.name)
        try:
            if rec.spec.hook.standby:
                await self.generations.start_standby(run, rec, src, dst)
            try:
                ack = await self.checkpointer.checkpoint(run, rec)
            except StepFailed:
                await self.generations.drop_standby(run, rec)
                raise
            rec = run.job(rec.name)
            try:
                placed = await self.instances.reconfigure(run, src, dst)
                await self.generations.launch(run, "launch", rec, placed, ack)
            except StepFailed as exc:
                await self.supervisor.drop_standby(rec.name, self.term_grace_s)
                await self._roll_back(run, rec, src, ack, exc)
                raise
        finally:
            await self.supervisor.drop_standby(rec.name, self.term_grace_s)  # none left after a handover
            self._busy.discard(rec.name)

    async def _stop(self, run: ActionRun, p: StopPayload) -> None:
        """Stop a job: after an acknowledged checkpoint, or (``force``) by SIGTERM/SIGKILL."""
        rec = run.job(run.row.job)
        if rec.state != "running" and not run.resumed:
            raise Refused(f"job {rec.name} is {rec.state}, not running")
        self._busy.add(rec.name)
        try:
            if p.force:

                async def kill() -> dict[str, Any]:
                    await self.supervisor.terminate(rec.name, self.term_grace_s)
                    return {}

                await run.step("terminate", {}, kill)
            else:
                await self.checkpointer.checkpoint(run, rec)
            latest = run.job(rec.name)

            async def nothing() -> dict[str, Any]:
                return {}

            await run.step("stopped", {}, nothing, job_before=latest.with_(state="stopped", error=None))
        finally:
            self._busy.discard(rec.name)

    # ------------------------------------------------------------------------------------ move phases
    async def _roll_back(
        self, run: ActionRun, rec: JobRecord, src: Sequence[Slot], ack: Ack, cause: StepFailed
    ) -> None:
        """Undo a failed move after its checkpoint: remove what it created, restore what it destroyed, relaunch."""
        try:
            await self.supervisor.terminate(rec.name, self.term_grace_s)
            for name in reversed(run.names("create:")):
                s = Slot.from_json(run.prior[name].args)
                await run.step(f"undo_{name}", s.to_json(), lambda s=s: self.instances.destroy_idle(s))  # type: ignore[misc]
            for name in run.names("destroy:"):
                s = Slot.from_json(run.prior[name].args)
                await run.step(f"undo_{name}", s.to_json(), lambda s=s: self.instances.create_at(s))  # type: ignore[misc]
            placed = await self.instances.with_uuids(src)
            await self.generations.launch(run, "relaunch", run.job(rec.name), placed, ack)
        except StepFailed as exc:
            msg = f"{cause}; roll-back failed too: {exc}; job stopped with checkpoint step {ack.step} kept"
            failed = run.job(rec.name).with_(state="failed", error=msg, last_ack=ack)
            await run.write("failure of the roll-back", lambda: self.journal.put_job(failed))
            self.events.emit(ActEvent(kind="job_failed", time_s=self.wall(), job=rec.name, error=msg))
            raise StepFailed(msg, code=cause.code) from exc
        raise StepFailed(f"{cause}; rolled back: job relaunched on its instances from step {ack.step}", code=cause.code)

    # --------------------------------------------------------------------------------------- recovery
    async def run_unfinished_plan(self, plan_id: int) -> PlanResult:
        """Finish (or roll back) one plan the journal holds unfinished; the caller holds the action lock."""
        return await self._run_plan(plan_id)

    @property
    def busy(self) -> set[str]:
        """The jobs an action is working on now (their ranks' exits are the action's to judge, not the settler's)."""
        return self._busy

    @property
    def action_lock(self) -> asyncio.Lock:
        """Held while a plan runs or the journal is reconciled."""
        return self._lock

    async def close(self) -> None:
        """Cancel pending settle tasks."""
        await self.settler.close()


def new_job_uid() -> str:
    """A fresh job ID (travels in every rank's environment)."""
    return uuidlib.uuid4().hex
