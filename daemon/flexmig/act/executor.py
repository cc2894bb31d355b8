"""The executor: carries out a Plan on the node, one journalled step at a time, and recovers after a crash.

A migration (and a re-split, which is a migration to another number of instances) runs these steps, each written
to the journal before it runs:

``clear_ack`` → ``request`` (checkpoint signal) → ``await_ack`` → ``await_exit`` → ``layout`` (which instances
to destroy and create, decided once) → ``destroy:G@S``… → ``create:G@S``… → ``launch`` (new generation, with
``FLEXMIG_RESUME``).

Safety rules enforced here, not by callers:

* ``observe`` and ``advise`` never act: :meth:`Executor.execute` refuses before writing anything;
* an instance that runs a process of no registered job is never destroyed;
* a job is stopped only after its checkpoint is acknowledged: no acknowledgement within the timeout cancels
  the move and the job keeps running;
* NVML errors (IN_USE, INSUFFICIENT_RESOURCES, GPU_IS_LOST, ...) after the checkpoint roll the move back:
  instances created by the action are destroyed, destroyed ones re-created, and the job relaunched where it was
  from the acknowledged checkpoint; if even that fails the job is marked ``failed`` with its checkpoint kept.

Recovery: every step is idempotent given what NVML and the process table show, so :meth:`Executor.reconcile`
re-runs each unfinished action from its first step not ``done``, then finishes the rest of its plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import signal
import stat
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flexmig.act.devices import DeviceProcessTable
from flexmig.act.events import Event, EventSink
from flexmig.act.journal import ActionRow, Journal, StepRow
from flexmig.act.migops import MigOps, Offload
from flexmig.act.nodeview import NodeView
from flexmig.act.procs import ProcessScanner
from flexmig.act.records import JobRecord, Slot
from flexmig.act.supervisor import Supervisor, free_port
from flexmig.errors import FlexmigError, LayoutError, NvmlCallError, PlanRejectedError
from flexmig.hook.protocol import Ack, AckError, read_ack
from flexmig.mig.catalogue import MODELS
from flexmig.plan.types import (
    Action,
    CreateInstance,
    DestroyInstance,
    Instance,
    MigrateJob,
    Plan,
    ResplitJob,
    StartJob,
)

__all__ = ["ActionResult", "Executor", "Mode", "PlanResult", "encode_action"]

log = logging.getLogger(__name__)

Mode = Literal["observe", "advise", "act"]
Outcome = Literal["completed", "failed", "cancelled", "skipped"]


# ----------------------------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class ActionResult:
    """How one action ended, with the duration of each of its steps (seconds)."""

    action_id: int
    kind: str
    job: str | None
    outcome: Outcome
    error: str | None
    duration_s: float
    steps: tuple[tuple[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form (control API answers)."""
        return {
            "action_id": self.action_id,
            "kind": self.kind,
            "job": self.job,
            "outcome": self.outcome,
            "error": self.error,
            "duration_s": round(self.duration_s, 6),
            "steps": [{"step": n, "duration_s": round(d, 6)} for n, d in self.steps],
        }


@dataclass(frozen=True, slots=True)
class PlanResult:
    """How a plan ended: one result per action, in order."""

    plan_id: int
    results: tuple[ActionResult, ...]

    @property
    def ok(self) -> bool:
        """True when every action completed."""
        return all(r.outcome == "completed" for r in self.results)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"plan_id": self.plan_id, "ok": self.ok, "actions": [r.to_json() for r in self.results]}


# -------------------------------------------------------------------------------------------- encoding
def _slot(i: Instance) -> dict[str, Any]:
    return Slot(i.gpu, i.start, i.profile.name).to_json()


def encode_action(a: Action) -> tuple[str, str | None, dict[str, Any]]:
    """A plan action as the journal keeps it: (kind, job, JSON payload)."""
    if isinstance(a, CreateInstance | DestroyInstance):
        kind = "create_instance" if isinstance(a, CreateInstance) else "destroy_instance"
        return kind, None, {"slot": Slot(a.gpu, a.start, a.profile.name).to_json(), "reason": a.reason}
    if isinstance(a, StartJob):
        return "start", a.job, {"to": [_slot(i) for i in a.instances], "reason": a.reason}
    if isinstance(a, MigrateJob):
        return (
            "migrate",
            a.job,
            {
                "from": [_slot(i) for i in a.from_instances],
                "to": [_slot(i) for i in a.to_instances],
                "reason": a.reason,
            },
        )
    if isinstance(a, ResplitJob):
        return (
            "resplit",
            a.job,
            {
                "from": [_slot(i) for i in a.from_instances],
                "to": [_slot(i) for i in a.to_instances],
                "ranks": a.ranks,
                "reason": a.reason,
            },
        )
    raise PlanRejectedError(f"unknown action {a!r}")


# ------------------------------------------------------------------------------------- step machinery
class StepFailed(FlexmigError):
    """A step could not be carried out; ``outcome`` says whether the action failed or was cancelled."""

    def __init__(self, message: str, *, outcome: Outcome = "failed", code: str | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.code = code


class _Rejected(FlexmigError):
    """An action's preconditions do not hold; nothing was done."""


class _Run:
    """One execution (or recovery) of one action: runs steps, skipping those the journal says are done."""

    def __init__(self, ex: Executor, row: ActionRow) -> None:
        self.ex = ex
        self.row = row
        prior = ex.journal.steps(row.id)
        self.prior: dict[str, StepRow] = {s.name: s for s in prior}
        self.resumed = bool(prior)

    def args_of(self, name: str) -> dict[str, Any] | None:
        """The arguments a previous run wrote for step ``name`` (None if it never started)."""
        s = self.prior.get(name)
        return s.args if s else None

    async def step(
        self,
        name: str,
        args: dict[str, Any],
        fn: Callable[[], Awaitable[dict[str, Any]]],
        *,
        job_before: JobRecord | None = None,
        job_after: Callable[[dict[str, Any]], JobRecord] | None = None,
        job_failed: JobRecord | None = None,
    ) -> dict[str, Any]:
        """Run step ``name`` unless already done: journal intent, run ``fn``, journal done (or failed)."""
        prior = self.prior.get(name)
        if prior is not None and prior.state == "done":
            return prior.result or {}
        if prior is not None and prior.state == "failed":
            res = prior.result or {}
            outcome = res.get("outcome", "failed")
            raise StepFailed(str(res.get("error", "failed")), outcome=outcome, code=res.get("code"))
        j = self.ex.journal
        step_id = j.step_intent(self.row.id, self.row.kind, name, args, job=job_before)
        try:
            result = await fn()
        except StepFailed as exc:
            j.step_failed_with(step_id, self.row.kind, str(exc), outcome=exc.outcome, code=exc.code, job=job_failed)
            self.prior[name] = j.step_row(step_id)
            raise
        j.step_done(step_id, self.row.kind, result, job=job_after(result) if job_after else None)
        self.prior[name] = j.step_row(step_id)
        return result

    def names(self, prefix: str) -> list[str]:
        """Names of the steps recorded so far that start with ``prefix``, in order."""
        return [s.name for s in self.ex.journal.steps(self.row.id) if s.name.startswith(prefix)]


def _overlap(a: Slot, b: Slot) -> bool:
    if a.gpu != b.gpu:
        return False
    sa, sb = _size(a.profile), _size(b.profile)
    return a.start < b.start + sb and b.start < a.start + sa


def _size(profile: str) -> int:
    for m in MODELS:
        for p in m.profiles:
            if p.name == profile:
                return p.memory_slices
    return 8  # unknown profile: assume it may overlap anything on its GPU


# --------------------------------------------------------------------------------------------- executor
class Executor:
    """Executes plans and the control API's job actions; one action at a time, each fully journalled."""

    def __init__(
        self,
        *,
        mode: Mode,
        mig: MigOps,
        supervisor: Supervisor,
        journal: Journal,
        events: EventSink,
        scanner: ProcessScanner,
        devices: DeviceProcessTable,
        offload: Offload,
        wall: Callable[[], float] = time.time,
        poll_s: float = 0.02,
        resend_s: float = 1.0,
        term_grace_s: float = 10.0,
    ) -> None:
        self.mode: Mode = mode
        self.mig = mig
        self.supervisor = supervisor
        self.journal = journal
        self.events = events
        self.scanner = scanner
        self.devices = devices
        self.offload = offload
        self.wall = wall
        self.poll_s = poll_s
        self.resend_s = resend_s
        self.term_grace_s = term_grace_s
        self._lock = asyncio.Lock()
        self._busy: set[str] = set()
        self._settling: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.handlers: dict[str, Callable[[_Run], Awaitable[None]]] = {}
        """Runners of action kinds the executor itself does not know (``slurm_reregister``): see :meth:`add_handler`."""
        supervisor.on_exit = self._on_exit

    def add_handler(self, kind: str, handler: Callable[[_Run], Awaitable[None]]) -> None:
        """Run journalled actions of ``kind`` with ``handler`` (given the action's step runner), also when the
        journal finishes them after a crash; add it before :meth:`reconcile`."""
        self.handlers[kind] = handler

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
        self, actions: Sequence[tuple[str, str | None, dict[str, Any]]], origin: str, notes: Sequence[str] = ()
    ) -> PlanResult:
        """Like :meth:`execute` for already encoded actions (the control API's ``stop`` is not a plan action)."""
        self.require_act()
        async with self._lock:
            plan_id, _ = self.journal.begin_plan(origin, actions, notes)
            return await self._run_plan(plan_id)

    async def _run_plan(self, plan_id: int) -> PlanResult:
        """Run a plan's pending actions in order. When one fails or is cancelled, the rest are skipped and the
        instances the plan created up front (still free) are destroyed again by appended ``undo`` actions."""
        results: list[ActionResult] = []
        stop = False
        rows = self.journal.actions(plan_id)
        undo_added = any(r.payload.get("undo") for r in rows)
        i = 0
        while True:
            if i >= len(rows):
                if stop and not undo_added:
                    undo_added = True
                    undo = self._undo_actions(self.journal.actions(plan_id))
                    if undo:
                        self.journal.append_actions(plan_id, undo)
                        rows = self.journal.actions(plan_id)
                        continue
                break
            row = rows[i]
            i += 1
            is_undo = bool(row.payload.get("undo"))
            if row.state in ("done", "failed", "cancelled", "skipped"):
                results.append(self._result(row))
                stop = stop or (row.state != "done" and not is_undo)
                continue
            if stop and not is_undo:
                self.journal.finish_action(row.id, "skipped", "an earlier action of the plan did not complete")
                res = self._result(self.journal.action(row.id))
                self._emit("action_skipped", row, res)
                results.append(res)
                continue
            res = await self._run_action(row)
            results.append(res)
            if not is_undo:
                stop = stop or res.outcome != "completed"
        self.journal.finish_plan(plan_id, "failed" if stop else "done")
        return PlanResult(plan_id, tuple(results))

    def _undo_actions(self, rows: Sequence[ActionRow]) -> list[tuple[str, str | None, dict[str, Any]]]:
        """Destroy actions for the instances this plan's CreateInstance actions made and no job holds."""
        held = self.held()
        out: list[tuple[str, str | None, dict[str, Any]]] = []
        for row in reversed(rows):
            if row.kind == "create_instance" and row.state == "done" and not row.payload.get("undo"):
                slot = Slot.from_json(row.payload["slot"])
                if slot.key not in held:
                    reason = f"undo action {row.id}: its plan stopped before using the instance"
                    out.append(("destroy_instance", None, {"slot": slot.to_json(), "reason": reason, "undo": True}))
        return out

    def _result(self, row: ActionRow) -> ActionResult:
        steps = tuple((s.name, (s.finished_s or s.started_s) - s.started_s) for s in self.journal.steps(row.id))
        outcome: Outcome = {"done": "completed", "failed": "failed", "cancelled": "cancelled"}.get(row.state, "skipped")  # type: ignore[assignment]
        dur = (row.finished_s or self.wall()) - (row.started_s or row.finished_s or self.wall())
        return ActionResult(row.id, row.kind, row.job, outcome, row.error, dur, steps)

    def _emit(self, kind: str, row: ActionRow, res: ActionResult | None = None, **detail: Any) -> None:
        self.events.emit(
            Event(
                kind=kind,
                time_s=self.wall(),
                action=row.kind,
                action_id=row.id,
                job=row.job,
                reason=str(row.payload.get("reason", "")),
                error=res.error if res else None,
                duration_s=res.duration_s if res else None,
                steps=res.steps if res else (),
                detail=detail,
            )
        )

    async def _run_action(self, row: ActionRow) -> ActionResult:
        run = _Run(self, row)
        self.journal.start_action(row.id)
        self._emit("action_started", row, resumed=run.resumed)
        handler = {
            "create_instance": self._create_instance,
            "destroy_instance": self._destroy_instance,
            "start": self._start,
            "migrate": self._move,
            "resplit": self._move,
            "stop": self._stop,
            "restart": self._restart,
        }.get(row.kind) or self.handlers.get(row.kind)
        state: Literal["done", "failed", "cancelled"] = "done"
        error: str | None = None
        try:
            if handler is None:
                raise _Rejected(f"unknown action kind {row.kind!r}")
            await handler(run)
        except _Rejected as exc:
            state, error = "failed", f"refused: {exc}"
        except StepFailed as exc:
            state = "cancelled" if exc.outcome == "cancelled" else "failed"
            error = str(exc)
        except Exception as exc:  # a bug must not leave the action 'running' forever
            log.exception("action %d (%s) crashed", row.id, row.kind)
            state, error = "failed", f"internal error: {exc!r}"
        self.journal.finish_action(row.id, state, error)
        res = self._result(self.journal.action(row.id))
        kind = {"done": "action_completed", "failed": "action_failed", "cancelled": "action_cancelled"}[state]
        self._emit(kind, row, res)
        return res

    # ------------------------------------------------------------------------------------ node helpers
    async def view(self) -> NodeView:
        """A fresh view of the node (after dropping exited processes from a simulated process table)."""
        with contextlib.suppress(Exception):
            await self.offload(self.devices.prune)
        return NodeView.of(await self.mig.inventory())

    def held(self, exclude: str | None = None) -> dict[tuple[int, int], str]:
        """Instances held by running jobs: ``(gpu, start) -> job``."""
        out: dict[tuple[int, int], str] = {}
        for rec in self.journal.jobs():
            if rec.state == "running" and rec.name != exclude:
                for s in rec.slots:
                    out[s.key] = rec.name
        return out

    def _foreign(self, pids: Iterable[int], job: str | None) -> set[int]:
        mine = self.supervisor.pids(job) if job else set()
        return set(pids) - mine

    async def _destroy_idle(self, slot: Slot) -> dict[str, Any]:
        """Destroy the instance at ``slot`` if it exists, has the expected profile and runs no process."""
        view = await self.view()
        if slot.gpu in view.lost:
            raise StepFailed(f"GPU {slot.gpu} is lost (GPU_IS_LOST)", code="GPU_IS_LOST")
        inst = view.instance(slot.gpu, slot.start)
        if inst is None:
            return {"absent": True}
        if inst.profile != slot.profile:
            raise StepFailed(f"{inst.spec()} is not the expected {slot.profile}; not destroyed")
        if inst.pids is None and inst.uuid is not None:
            raise StepFailed(f"NVML does not list the processes of {inst.spec()}; not destroyed")
        if inst.pids:  # a GI without compute instance (no MIG device) runs nothing and may go
            owner = {p: n for n in self._job_names() for p in self.supervisor.pids(n)}
            who = ", ".join(f"{p} ({owner.get(p, 'no registered job')})" for p in sorted(inst.pids))
            raise StepFailed(f"{inst.spec()} still runs processes {who}; not destroyed", code="IN_USE")
        try:
            await self.mig.destroy(slot.gpu, inst.gi_id)
        except NvmlCallError as exc:
            raise StepFailed(str(exc), code=exc.name) from exc
        return {"gi_id": inst.gi_id}

    def _job_names(self) -> list[str]:
        return [r.name for r in self.journal.jobs()]

    async def _create_at(self, slot: Slot) -> dict[str, Any]:
        """Create ``slot``'s instance unless an identical one already sits there; returns its UUID."""
        view = await self.view()
        if slot.gpu in view.lost:
            raise StepFailed(f"GPU {slot.gpu} is lost (GPU_IS_LOST)", code="GPU_IS_LOST")
        inst = view.instance(slot.gpu, slot.start)
        if inst is not None:
            if inst.profile == slot.profile and inst.uuid:
                return {"uuid": inst.uuid, "gi_id": inst.gi_id}
            if inst.profile != slot.profile or inst.uuid is not None:
                raise StepFailed(f"memory slice {slot.start} of GPU {slot.gpu} is held by {inst.spec()}")
            # A GPU instance without its compute instance: a destroy that failed half-way (NVML destroys the
            # compute instances first). Nothing can run on it; remove it and create the pair afresh.
            try:
                await self.mig.destroy(slot.gpu, inst.gi_id)
            except NvmlCallError as exc:
                raise StepFailed(str(exc), code=exc.name) from exc
        try:
            dev = await self.mig.create(slot.gpu, slot.profile, slot.start)
        except (NvmlCallError, LayoutError) as exc:
            raise StepFailed(str(exc), code=getattr(exc, "name", None)) from exc
        return {"uuid": dev.uuid, "gi_id": dev.gpu_instance_id}

    async def _with_uuids(self, slots: Sequence[Slot]) -> list[Slot]:
        view = await self.view()
        out = []
        for s in slots:
            inst = view.instance(s.gpu, s.start)
            if inst is None or inst.profile != s.profile or not inst.uuid:
                raise StepFailed(f"instance {s.spec()} does not exist (any more)")
            out.append(Slot(s.gpu, s.start, s.profile, inst.uuid))
        return out

    # ------------------------------------------------------------------------------- standalone actions
    async def _create_instance(self, run: _Run) -> None:
        slot = Slot.from_json(run.row.payload["slot"])
        await run.step(f"create:{slot.gpu}@{slot.start}", slot.to_json(), lambda: self._create_at(slot))

    async def _destroy_instance(self, run: _Run) -> None:
        slot = Slot.from_json(run.row.payload["slot"])
        holder = self.held().get(slot.key)
        if holder is not None and not run.resumed:
            raise _Rejected(f"{slot.spec()} is held by job {holder}")
        await run.step(f"destroy:{slot.gpu}@{slot.start}", slot.to_json(), lambda: self._destroy_idle(slot))

    # ------------------------------------------------------------------------------------ job actions
    def _job(self, name: str | None) -> JobRecord:
        rec = self.journal.get_job(name or "")
        if rec is None:
            raise _Rejected(f"no job named {name!r}")
        return rec

    async def _start(self, run: _Run) -> None:
        rec = self._job(run.row.job)
        dst = [Slot.from_json(d) for d in run.row.payload["to"]]
        if not run.resumed:
            if rec.state == "running":
                raise _Rejected(f"job {rec.name} is already running")
            await self._check_free(rec, dst, own=frozenset())
        self._busy.add(rec.name)
        try:
            placed = await self._with_uuids(dst)
            await self._launch(run, "launch", rec, placed, rec.last_ack)
        finally:
            self._busy.discard(rec.name)

    async def _restart(self, run: _Run) -> None:
        """Relaunch a job in place from its newest checkpoint (it acknowledged after a move was cancelled)."""
        rec = self._job(run.row.job)
        self._busy.add(rec.name)
        try:
            placed = await self._with_uuids(rec.slots)
            await self._launch(run, "launch", rec, placed, rec.last_ack)
        finally:
            self._busy.discard(rec.name)

    async def _check_free(self, rec: JobRecord, dst: Sequence[Slot], own: frozenset[tuple[int, int]]) -> None:
        """Every target exists with its profile, is held by no other job and runs no foreign process."""
        view = await self.view()
        held = self.held(exclude=rec.name)
        for d in dst:
            if d.gpu in view.lost:
                raise _Rejected(f"GPU {d.gpu} is lost")
            inst = view.instance(d.gpu, d.start)
            if inst is None or inst.profile != d.profile:
                raise _Rejected(f"target {d.spec()} does not exist")
            if d.key in held:
                raise _Rejected(f"target {d.spec()} is held by job {held[d.key]}")
            if inst.pids is None or self._foreign(inst.pids, rec.name if d.key in own else None):
                raise _Rejected(f"target {d.spec()} runs processes of no registered job: {sorted(inst.pids or [])}")

    async def _check_move(self, rec: JobRecord, src: Sequence[Slot], dst: Sequence[Slot]) -> None:
        if rec.state != "running":
            raise _Rejected(f"job {rec.name} is {rec.state}, not running")
        if {s.key for s in rec.slots} != {s.key for s in src}:
            have = ", ".join(s.spec() for s in rec.slots)
            raise _Rejected(f"job {rec.name} runs on {have}, not on the plan's source instances")
        if len(self.supervisor.alive(rec.name)) != len(rec.slots):
            raise _Rejected(f"job {rec.name} does not have all its ranks running")
        if not dst:
            raise _Rejected("no target instances")
        view = await self.view()
        for s in src:
            inst = view.instance(s.gpu, s.start)
            if inst is None:
                raise _Rejected(f"source {s.spec()} does not exist")
            foreign = self._foreign(inst.pids or (), rec.name)
            if inst.pids is None or foreign:
                raise _Rejected(f"{inst.spec()} runs processes of no registered job: {sorted(foreign)}")
        own = frozenset(s.key for s in src)
        held = self.held(exclude=rec.name)
        missing: list[Slot] = []
        for d in dst:
            if d.gpu in view.lost:
                raise _Rejected(f"GPU {d.gpu} is lost")
            if d.key in held:
                raise _Rejected(f"target {d.spec()} is held by job {held[d.key]}")
            inst = view.instance(d.gpu, d.start)
            if inst is not None and inst.profile == d.profile:
                if inst.pids is None or self._foreign(inst.pids, rec.name if d.key in own else None):
                    raise _Rejected(f"target {d.spec()} runs processes of no registered job")
                continue
            if inst is not None and inst.key not in own:
                raise _Rejected(f"target {d.spec()} is occupied by {inst.spec()}")
            missing.append(d)
        # The missing targets must fit once the job's own overlapping sources are gone.
        for gpu in {d.gpu for d in missing}:
            gone = frozenset(s.key for s in src if any(_overlap(s, d) for d in missing))
            layout = view.layout(gpu, without=gone)
            model = view.model(gpu)
            if layout is None or model is None:
                raise _Rejected(f"GPU {gpu}: unknown model or layout")
            for d in (d for d in missing if d.gpu == gpu):
                try:
                    prof = model.profile(d.profile)
                except KeyError as exc:
                    raise _Rejected(str(exc.args[0])) from None
                why = layout.why_not(prof, d.start)
                if why:
                    raise _Rejected(f"cannot create {d.spec()}: {why}")
                layout = layout.place(prof, d.start)

    async def _move(self, run: _Run) -> None:
        """Migrate or re-split: checkpoint, stop, reconfigure, relaunch; roll back on failure after the ack."""
        rec = self._job(run.row.job)
        src = [Slot.from_json(d) for d in run.row.payload["from"]]
        dst = [Slot.from_json(d) for d in run.row.payload["to"]]
        if not run.resumed:
            await self._check_move(rec, src, dst)
        self._busy.add(rec.name)
        try:
            ack = await self._checkpoint(run, rec)
            rec = self._job(rec.name)
            try:
                placed = await self._reconfigure(run, src, dst)
                await self._launch(run, "launch", rec, placed, ack)
            except StepFailed as exc:
                await self._roll_back(run, rec, src, ack, exc)
                raise
        finally:
            self._busy.discard(rec.name)

    async def _stop(self, run: _Run) -> None:
        """Stop a job: after an acknowledged checkpoint, or (``force``) by SIGTERM/SIGKILL."""
        rec = self._job(run.row.job)
        if rec.state != "running" and not run.resumed:
            raise _Rejected(f"job {rec.name} is {rec.state}, not running")
        self._busy.add(rec.name)
        try:
            if run.row.payload.get("force"):

                async def kill() -> dict[str, Any]:
                    await self.supervisor.terminate(rec.name, self.term_grace_s)
                    return {}

                await run.step("terminate", {}, kill)
            else:
                await self._checkpoint(run, rec)
            latest = self._job(rec.name)

            async def nothing() -> dict[str, Any]:
                return {}

            await run.step("stopped", {}, nothing, job_before=latest.with_(state="stopped", error=None))
        finally:
            self._busy.discard(rec.name)

    # ------------------------------------------------------------------------------------ move phases
    async def _checkpoint(self, run: _Run, rec: JobRecord) -> Ack:
        """Request a checkpoint, wait for the acknowledgement, then for every rank to exit."""
        spec = rec.spec
        name = rec.name
        ack_path = self.supervisor.acks.path(rec)

        async def clear_ack() -> dict[str, Any]:
            with contextlib.suppress(FileNotFoundError):
                ack_path.unlink()
            return {}

        async def request() -> dict[str, Any]:
            return {"pids": self.supervisor.signal_workers(name, int(spec.hook.signal))}

        async def await_ack() -> dict[str, Any]:
            return {"ack": (await self._wait_ack(rec)).to_json()}

        await run.step("clear_ack", {"path": str(ack_path)}, clear_ack)
        await run.step("request", {"signal": spec.hook.signal.name}, request)
        try:
            res = await run.step(
                "await_ack",
                {"timeout_s": spec.hook.ack_timeout_s},
                await_ack,
                job_after=lambda r: self._job(name).with_(last_ack=Ack.from_json(r["ack"])),
            )
        except StepFailed as exc:
            if exc.outcome == "failed":
                await self.supervisor.terminate(name, self.term_grace_s)
                self.journal.put_job(self._job(name).with_(state="failed", error=str(exc)))
                self.events.emit(Event(kind="job_failed", time_s=self.wall(), job=name, error=str(exc)))
            raise
        ack = Ack.from_json(res["ack"])

        async def await_exit() -> dict[str, Any]:
            forced = False
            if not await self.supervisor.wait_exited(name, spec.hook.exit_timeout_s):
                forced = True
                await self.supervisor.terminate(name, self.term_grace_s)
            codes = {str(h.slot): h.proc.returncode for h in self.supervisor.ranks(name)}
            return {"exit_codes": codes, "forced": forced}

        await run.step("await_exit", {"timeout_s": spec.hook.exit_timeout_s}, await_exit)
        return ack

    async def _wait_ack(self, rec: JobRecord) -> Ack:
        """Poll for the acknowledgement; repeat the request meanwhile; fail if ranks die without one."""
        spec = rec.spec
        ack_path = self.supervisor.acks.path(rec)
        deadline = time.monotonic() + spec.hook.ack_timeout_s
        next_send = time.monotonic() + self.resend_s
        while True:
            try:
                ack = read_ack(ack_path)
            except AckError as exc:
                raise StepFailed(f"job {rec.name}: {exc}", outcome="cancelled") from exc
            if ack is not None:
                return self._validate_ack(rec, ack)
            ranks = self.supervisor.ranks(rec.name)
            bad = [h for h in ranks if h.proc.finished() and h.proc.returncode not in (0, None)]
            if bad or (ranks and all(h.proc.finished() for h in ranks)) or not ranks:
                # One last look: the ack may have landed just before the last rank exited.
                ack = read_ack(ack_path)
                if ack is not None:
                    return self._validate_ack(rec, ack)
                what = ", ".join(f"rank {h.slot} exited with status {h.proc.returncode}" for h in bad) or (
                    "every rank exited"
                )
                raise StepFailed(f"job {rec.name} crashed while checkpointing ({what}) before acknowledging")
            now = time.monotonic()
            if now >= deadline:
                raise StepFailed(
                    f"job {rec.name} did not acknowledge the checkpoint within {spec.hook.ack_timeout_s:g} s; "
                    "move cancelled, the job keeps running",
                    outcome="cancelled",
                    code="ACK_TIMEOUT",
                )
            if now >= next_send:
                self.supervisor.signal_workers(rec.name, int(spec.hook.signal))
                next_send = now + self.resend_s
            await asyncio.sleep(self.poll_s)

    def _validate_ack(self, rec: JobRecord, ack: Ack) -> Ack:
        """The checkpoint must lie inside the job's checkpoint directory and be a non-empty file.

        A daemon without CAP_DAC_OVERRIDE (the shipped systemd unit) may not be allowed to look inside the job's
        directory; then only the path is checked, and the job's word taken for the rest.
        """
        ckpt = Path(os.path.realpath(rec.spec.working_dir / ack.checkpoint))
        root = rec.spec.checkpoint_dir
        if ckpt != root and root not in ckpt.parents:
            raise StepFailed(
                f"job {rec.name} acknowledged a checkpoint outside {root}: {ack.checkpoint}", outcome="cancelled"
            )
        try:
            st = ckpt.stat()
        except PermissionError:
            return Ack(step=ack.step, checkpoint=str(ckpt))
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            raise StepFailed(f"job {rec.name} acknowledged a missing or empty checkpoint {ckpt}", outcome="cancelled")
        return Ack(step=ack.step, checkpoint=str(ckpt))

    async def _reconfigure(self, run: _Run, src: Sequence[Slot], dst: Sequence[Slot]) -> list[Slot]:
        """Destroy the job's sources that overlap missing targets, create the missing targets; returns targets."""

        async def decide() -> dict[str, Any]:
            view = await self.view()
            missing = [d for d in dst if (i := view.instance(d.gpu, d.start)) is None or i.profile != d.profile]
            destroy = [s for s in src if any(_overlap(s, d) for d in missing)]
            return {"destroy": [s.to_json() for s in destroy], "create": [d.to_json() for d in missing]}

        res = await run.step("layout", {}, decide)
        for s in (Slot.from_json(d) for d in res["destroy"]):
            await run.step(f"destroy:{s.gpu}@{s.start}", s.to_json(), lambda s=s: self._destroy_idle(s))  # type: ignore[misc]
        for d in (Slot.from_json(x) for x in res["create"]):
            await run.step(f"create:{d.gpu}@{d.start}", d.to_json(), lambda d=d: self._create_at(d))  # type: ignore[misc]
        return await self._with_uuids(dst)

    async def _launch(self, run: _Run, name: str, rec: JobRecord, slots: Sequence[Slot], resume: Ack | None) -> None:
        """Launch generation N+1 of ``rec`` on ``slots``; after a crash, adopt what already started."""
        prior = run.args_of(name)
        if prior is not None:
            gen, port = int(prior["generation"]), int(prior["port"])
            slots = [Slot.from_json(s) for s in prior["slots"]]
            resume = Ack.from_json(prior["resume"]) if prior.get("resume") else None
        else:
            gen, port = rec.generation + 1, free_port()
        new = self._job(rec.name).with_(
            state="running", generation=gen, slots=tuple(slots), resume=resume, master_port=port, error=None
        )

        async def launch() -> dict[str, Any]:
            await self._prepare_dirs(new)
            # Only a re-run after a crash can find ranks of this generation already started (or an older one
            # still running); a first run skips the process-table scan, which costs tens of milliseconds.
            found = await asyncio.to_thread(self.scanner.find, new.uid) if prior is not None else []
            for f in found:
                if f.generation != gen:  # an older generation still running would make the job run twice
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(f.pid, signal.SIGKILL)
            mine = [f for f in found if f.generation == gen]
            if not mine:
                with contextlib.suppress(FileNotFoundError):
                    self.supervisor.acks.path(new).unlink()
            self.supervisor.forget(new.name)
            await self.supervisor.adopt(new, mine)
            have = {h.slot for h in self.supervisor.alive(new.name)}
            todo = [i for i in range(len(slots)) if i not in have]
            try:
                await self.supervisor.launch(new, port=port, resume=resume, only=todo)
            except OSError as exc:
                raise StepFailed(f"cannot launch job {new.name}: {exc}") from exc
            return {"pids": {str(h.slot): h.proc.pid for h in self.supervisor.alive(new.name)}}

        args = {
            "generation": gen,
            "port": port,
            "slots": [s.to_json() for s in slots],
            "resume": resume.to_json() if resume else None,
        }
        await run.step(name, args, launch, job_before=new, job_failed=new.with_(state="failed"))

    async def _prepare_dirs(self, rec: JobRecord) -> None:
        """Create the checkpoint directory if missing, owned by the job's user, mode 0700."""
        d = rec.spec.checkpoint_dir
        try:
            if d.is_dir():
                return
            d.mkdir(parents=True, mode=0o700, exist_ok=True)
            if os.geteuid() == 0:
                pw = pwd.getpwnam(rec.spec.user)
                gid = grp.getgrnam(rec.spec.group).gr_gid if rec.spec.group else pw.pw_gid
                os.chown(d, pw.pw_uid, gid)
        except (OSError, KeyError) as exc:
            raise StepFailed(
                f"cannot create checkpoint_dir {d} for user {rec.spec.user} ({exc}); create it, owned by that user"
            ) from exc

    async def _roll_back(self, run: _Run, rec: JobRecord, src: Sequence[Slot], ack: Ack, cause: StepFailed) -> None:
        """Undo a failed move after its checkpoint: remove what it created, restore what it destroyed, relaunch."""
        try:
            await self.supervisor.terminate(rec.name, self.term_grace_s)
            for name in reversed(run.names("create:")):
                s = Slot.from_json(run.prior[name].args)
                await run.step(f"undo_{name}", s.to_json(), lambda s=s: self._destroy_idle(s))  # type: ignore[misc]
            for name in run.names("destroy:"):
                s = Slot.from_json(run.prior[name].args)
                await run.step(f"undo_{name}", s.to_json(), lambda s=s: self._create_at(s))  # type: ignore[misc]
            placed = await self._with_uuids(src)
            await self._launch(run, "relaunch", self._job(rec.name), placed, ack)
        except StepFailed as exc:
            msg = f"{cause}; roll-back failed too: {exc}; job stopped with checkpoint step {ack.step} kept"
            self.journal.put_job(self._job(rec.name).with_(state="failed", error=msg, last_ack=ack))
            self.events.emit(Event(kind="job_failed", time_s=self.wall(), job=rec.name, error=msg))
            raise StepFailed(msg, code=cause.code) from exc
        raise StepFailed(f"{cause}; rolled back: job relaunched on its instances from step {ack.step}", code=cause.code)

    # ------------------------------------------------------------------------------------ rank exits
    def _on_exit(self, job: str, slot: int, code: int | None) -> None:
        if job in self._busy or job in self._settling:
            return
        self._settling.add(job)
        task = asyncio.get_running_loop().create_task(self._settle(job), name=f"settle-{job}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, job: str) -> None:
        try:
            async with self._lock:
                await self._settle_locked(job)
        finally:
            self._settling.discard(job)

    async def _settle_locked(self, job: str) -> None:
        """A rank exited outside any action: decide whether the job failed, finished, or checkpointed."""
        rec = self.journal.get_job(job)
        if rec is None or rec.state != "running" or job in self._busy:
            return
        ranks = [h for h in self.supervisor.ranks(job) if h.generation == rec.generation]
        if ranks and not any(h.proc.finished() for h in ranks):
            return  # a rank of an older generation exited (adopted across a restart, after its move): nothing to do
        bad = [h for h in ranks if h.proc.finished() and h.proc.returncode not in (0, None)]
        if bad:
            await self.supervisor.terminate(job, self.term_grace_s)
            msg = ", ".join(f"rank {h.slot} exited with status {h.proc.returncode}" for h in bad)
            self.journal.put_job(rec.with_(state="failed", error=msg))
            self.events.emit(Event(kind="job_failed", time_s=self.wall(), job=job, error=msg))
            return
        if not await self.supervisor.wait_exited(job, rec.spec.hook.exit_timeout_s):
            return  # others still run; their exits call us again
        try:
            ack = read_ack(self.supervisor.acks.path(rec))
        except AckError:
            ack = None
        if ack is not None and (rec.resume is None or ack.step > rec.resume.step):
            try:
                ack = self._validate_ack(rec, ack)
            except StepFailed:
                ack = None
        else:
            ack = None
        if ack is not None:
            # A checkpoint request was acknowledged after its move was cancelled: resume in place.
            self.journal.put_job(rec.with_(last_ack=ack))
            if self.mode == "act":
                plan_id, _ = self.journal.begin_plan("restart", [("restart", job, {"reason": "late acknowledgement"})])
                await self._run_plan(plan_id)
            return
        unknown = [h for h in ranks if h.proc.returncode is None]
        if unknown or not ranks:
            msg = "ranks exited while the daemon was away; exit status unknown"
            self.journal.put_job(rec.with_(state="failed", error=msg))
            self.events.emit(Event(kind="job_failed", time_s=self.wall(), job=job, error=msg))
            return
        self.journal.put_job(rec.with_(state="done", error=None))
        self.events.emit(Event(kind="job_exited", time_s=self.wall(), job=job, detail={"state": "done"}))

    # --------------------------------------------------------------------------------------- recovery
    async def reconcile(self) -> dict[str, Any]:
        """At start-up: adopt running ranks, finish or roll back unfinished actions, settle dead jobs.

        Outside mode ``act`` only the adoption happens; unfinished actions wait for a start in ``act``.
        """
        summary: dict[str, Any] = {"adopted": {}, "killed_stale": {}, "plans": [], "settled": []}
        async with self._lock:
            with contextlib.suppress(Exception):
                summary["pruned"] = await self.offload(self.devices.prune)
            for rec in self.journal.jobs():
                if rec.state != "running":
                    continue
                found = await asyncio.to_thread(self.scanner.find, rec.uid)
                actions = [a for p in self.journal.unfinished_plans() for a in self.journal.actions(p)]
                moving = any(a.job == rec.name and a.state == "running" for a in actions)
                stale = [f for f in found if f.generation != rec.generation and not moving]
                for f in stale:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(f.pid, signal.SIGKILL)
                if stale:
                    summary["killed_stale"][rec.name] = [f.pid for f in stale]
                adopted = await self.supervisor.adopt(rec, found)
                summary["adopted"][rec.name] = [h.proc.pid for h in adopted]
            if self.mode == "act":
                for plan_id in self.journal.unfinished_plans():
                    res = await self._run_plan(plan_id)
                    summary["plans"].append(res.to_json())
                for rec in self.journal.jobs():
                    if rec.state == "running" and len(self.supervisor.alive(rec.name)) < len(rec.slots):
                        await self._settle_locked(rec.name)
                        summary["settled"].append(rec.name)
        self.events.emit(Event(kind="reconciled", time_s=self.wall(), detail=summary))
        return summary

    async def close(self) -> None:
        """Cancel pending settle tasks."""
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t


def new_job_uid() -> str:
    """A fresh job ID (travels in every rank's environment)."""
    return uuidlib.uuid4().hex
