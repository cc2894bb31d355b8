"""The ``jobs.*`` operations of the control API: submit, list, migrate, resplit, stop.

Their names, arguments and callers are rows of :data:`flexmig.act.operation_table.OPERATIONS`, whose checks run
before a handler here sees the arguments. Each turns the request into a Plan (:mod:`flexmig.act.placement`) and
hands it to the executor, which refuses outside mode ``act``. In mode ``advise`` the answer is the plan that would
have run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flexmig.act import deadline
from flexmig.act.control import Handler, RequestError
from flexmig.act.durable import storage_unavailable
from flexmig.act.encoding import StopPayload, encode
from flexmig.act.executor import Executor, new_job_uid
from flexmig.act.fullstop import stop_on_full_storage
from flexmig.act.nodeview import NodeView
from flexmig.act.operation_table import JOBS_OPERATIONS, JobsOps, Operation, bind
from flexmig.act.peers import CURRENT_PEER, refusal_for
from flexmig.act.placement import choose_targets, make_room, move_plan, node_model, start_plan
from flexmig.act.records import JobRecord, Slot, inside
from flexmig.act.results import PlanResult
from flexmig.errors import JobSpecError, JournalError, PlanRejectedError
from flexmig.hook.protocol import Ack
from flexmig.jobspec.spec import JobPolicy, JobSpec, load_job_spec
from flexmig.mig.catalogue import GpuModel
from flexmig.plan.types import CreateInstance, DestroyInstance, Plan, PlannerSettings, StartJob

__all__ = ["JobsApi", "describe_plan", "own_checkpoint", "refuse_in_place"]

_ACTING = {
    "start": "starting",
    "migrate": "migrating",
    "resplit": "resplitting",
    "stop": "stopping",
    "restart": "restarting",
}


def describe_plan(plan: Plan) -> list[str]:
    """One line per action, for people (advise-mode answers, CLI output)."""
    out = []
    for a in plan.actions:
        kind = type(a).__name__
        if isinstance(a, CreateInstance | DestroyInstance):
            out.append(f"{kind} gpu{a.gpu}:{a.profile.name}@{a.start}: {a.reason}")
        else:
            to = a.instances if isinstance(a, StartJob) else a.to_instances
            out.append(f"{kind} {a.job} -> {', '.join(i.spec() for i in to)}: {a.reason}")
    return out


def own_checkpoint(old: JobRecord | None, spec: JobSpec) -> Ack | None:
    """The checkpoint a resubmitted ``spec`` resumes from: the last one acknowledged by the stopped (or failed) job
    of that name, if it ran as the same user and the checkpoint lies in the new spec's checkpoint directory. A
    same-name spec of another user, or one that moved its checkpoint directory, starts afresh: resuming would hand
    it a file it has no business reading (``FLEXMIG_RESUME`` outside its own directory)."""
    if old is None or old.state not in ("stopped", "failed") or old.last_ack is None:
        return None
    if old.spec.user != spec.user or not inside(Path(old.last_ack.checkpoint), spec.checkpoint_dir):
        return None
    return old.last_ack


def refuse_in_place(model: GpuModel, rec: JobRecord, profile: str, targets: Sequence[Slot], kind: str) -> None:
    """PlanRejectedError, in one line, when a move of ``rec`` would put a rank on (or over) an instance the job runs
    on: nothing else of ``profile`` is free, so the "move" would stop the job and start it again where it was, cold
    (no standby rank can start on an instance the running generation holds), at the price of a whole restart. An
    operator who wants that asks for it (``in_place``)."""
    landing = [t for t in targets if any(_overlap(model, t, s) for s in rec.slots)]
    if not landing:
        return
    free = len(targets) - len(landing)
    what = f"no free instance of {profile}" if not free else f"only {free} free instance(s) of {profile}"
    where = ", ".join(s.spec() for s in rec.slots)
    raise PlanRejectedError(
        f"{what} for {len(targets)} rank(s) of job {rec.name}: the {kind} could only restart it, cold, where it "
        f"runs ({where}); nothing moved (--in-place to do that anyway)"
    )


def _overlap(model: GpuModel, a: Slot, b: Slot) -> bool:
    """Whether instances ``a`` and ``b`` share a memory slice."""
    if a.gpu != b.gpu:
        return False
    ea = a.start + model.profile(a.profile).memory_slices
    eb = b.start + model.profile(b.profile).memory_slices
    return a.start < eb and b.start < ea


class JobsApi:
    """Job operations over an :class:`Executor`; ``handlers()`` plugs them into a ControlServer.

    Each public ``async`` method taking ``args`` is the handler a row of the operation table names; ``args`` have
    passed that row's checks (and carry its defaults)."""

    def __init__(
        self,
        executor: Executor,
        policy: JobPolicy,
        settings: PlannerSettings | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.ex = executor
        self.policy = policy
        self.settings = settings or PlannerSettings()
        self.wall = wall
        self.queue_when_full = False
        """In mode act, a submitted job that finds no room now is registered ``pending`` (the daemon's planner
        starts it later) instead of refused."""
        self.max_pending = 1000
        """Most jobs ``pending`` at once (``jobs.max_pending``): a submission that would queue one more is refused."""
        self.refuse_submit: str | None = None
        """Why ``jobs.submit`` is refused on this node, if it is (its jobs come from Slurm)."""

    def handlers(self, wrap: Callable[[Operation[JobsOps], Handler], Handler] | None = None) -> dict[str, Handler]:
        """``{"jobs.submit": ..., "jobs.list": ..., ...}``, each behind its row's argument checks (``wrap``: see
        :func:`flexmig.act.operation_table.bind`)."""
        return bind(JOBS_OPERATIONS, self, wrap)

    async def _run(self, plan: Plan) -> dict[str, Any]:
        if self.ex.mode == "advise":
            lines = "; ".join(describe_plan(plan))
            raise PlanRejectedError(f"mode is 'advise': plan not executed: {lines}")
        self.ex.require_act()
        res: PlanResult = await self.ex.execute(plan, origin="control")
        return {**res.to_json(), "plan": describe_plan(plan)}

    # ---------------------------------------------------------------------------------------- handlers
    async def submit(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """``jobs.submit``: register the spec at ``path`` and start it (in mode act, queue it when it does not fit)."""
        if self.refuse_submit is not None:
            raise PlanRejectedError(self.refuse_submit)
        path = Path(args["path"])
        if not path.is_absolute():
            raise RequestError(f"job spec path must be absolute, not {path}")
        if self.ex.mode == "observe":
            self.ex.require_act()
        # A group member of a 0660 socket has root read only what they could read themselves (flexmig.act.peers).
        refused = await asyncio.to_thread(refusal_for, path, CURRENT_PEER.get(), "job spec")
        if refused is not None:
            raise JobSpecError(refused)
        spec = await asyncio.to_thread(load_job_spec, path, self.policy)  # file system I/O: off the loop
        view = await self.ex.view()
        model = node_model(view)
        try:
            profile = spec.need.profile_on(model)
        except (KeyError, ValueError) as exc:
            raise JobSpecError(f"{path}: need: {exc.args[0]} (this node has {model.name})") from None
        old = self.ex.journal.get_job(spec.name)
        if old is not None and old.state == "running":
            raise PlanRejectedError(f"job {spec.name} is already running")
        resume = own_checkpoint(old, spec)
        held = self.ex.held()
        try:
            targets, clear = self._place(view, profile.name, spec.ranks_start, held=held)
        except PlanRejectedError as exc:
            if not (self.queue_when_full and self.ex.mode == "act"):
                raise
            return self._queue(spec, old, resume, str(exc))
        plan = start_plan(view, spec.name, targets, self.settings, reason=f"submitted from {path}", clear=clear)
        if self.ex.mode != "act":
            return await self._run(plan)
        self._put_pending(spec, old, resume)
        out = await self._run(plan)
        job = self.ex.journal.get_job(spec.name)
        return {**out, "job": job.summary() if job else None}

    def _put_pending(self, spec: JobSpec, old: JobRecord | None, resume: Ack | None) -> JobRecord:
        """Journal ``spec`` as a pending job with a fresh UID, keeping the generation of the job it replaces and the
        checkpoint it resumes from."""
        rec = JobRecord(
            name=spec.name,
            uid=new_job_uid(),
            spec=spec,
            state="pending",
            generation=old.generation if old else 0,
            last_ack=resume,
            submitted_s=self.wall(),
        )
        deadline.begin()
        self.ex.journal.queue_job(rec)
        return rec

    def _queue(self, spec: JobSpec, old: JobRecord | None, resume: Ack | None, why: str) -> dict[str, Any]:
        """Register ``spec`` as a pending job: the planner starts it when it fits (or makes room for it). Refused
        (PlanRejectedError, nothing written) when ``max_pending`` jobs already wait and this is not one of them."""
        waiting = self.ex.journal.job_counts().get("pending", 0)
        if waiting >= self.max_pending and not (old is not None and old.state == "pending"):
            raise PlanRejectedError(
                f"job {spec.name} not queued: {waiting} jobs are already pending, the most jobs.max_pending allows "
                f"({self.max_pending}); nothing was changed: submit it again once some have started, or raise "
                "jobs.max_pending"
            )
        rec = self._put_pending(spec, old, resume)
        return {"plan_id": None, "ok": True, "actions": [], "queued": f"no room now ({why})", "job": rec.summary()}

    async def list_jobs(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``jobs.list``: every journalled job (:meth:`summary`)."""
        return [self.summary(rec) for rec in self.ex.journal.jobs()]

    def summary(self, rec: JobRecord) -> dict[str, Any]:
        """What ``jobs list`` and ``status`` show of ``rec``: its record, with what is true now laid over it.

        The journal says ``running`` from a job's launch to its end, also while a move has stopped its ranks (and
        longer, if the disk filled meanwhile). A job is shown ``running`` only while its ranks are: during an
        action on it the state is what the action does (``migrating``, ``resplitting``, ``starting``, ``stopping``,
        ``restarting``) with the action and its step, and ``waiting`` when the journal cannot be written; with
        ranks missing outside any action, ``settling`` (the daemon is deciding what their exit means).
        """
        s = rec.summary()
        s["pids"] = [h.proc.pid for h in self.ex.supervisor.alive(rec.name)]
        run = self.ex.running
        if run is not None and run.row.job == rec.name:
            s["state"] = _ACTING.get(run.row.kind, run.row.kind)
            s["action"] = {"id": run.row.id, "kind": run.row.kind, "step": run.current}
            stall = self.ex.durable.stalled
            if stall is not None:
                s["waiting"] = stall.describe(self.wall())
        elif rec.state == "running" and len(s["pids"]) < len(rec.slots):
            s["state"] = "settling"
        return s

    def _running(self, name: str) -> JobRecord:
        rec = self.ex.journal.get_job(name)
        if rec is None:
            raise RequestError(f"no job named {name!r}")
        if rec.state != "running":
            raise PlanRejectedError(f"job {name} is {rec.state}, not running")
        return rec

    async def migrate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """``jobs.migrate``: move a running job to instances of profile ``to`` (default: its own).

        Refused (nothing moved) when some rank could only land on the instances the job runs on, unless
        ``in_place``: that is a cold restart where it is, not a move (:func:`refuse_in_place`)."""
        rec = self._running(args["name"])
        view = await self.ex.view()
        model = node_model(view)
        profile = args["to"] or rec.slots[0].profile
        try:
            model.profile(profile)
        except KeyError as exc:
            raise RequestError(str(exc.args[0])) from None
        targets, clear = self._place(view, profile, len(rec.slots), held=self.ex.held(exclude=rec.name), own=rec.slots)
        if not args["in_place"]:
            refuse_in_place(model, rec, profile, targets, "migrate")
        plan = move_plan(
            view, rec.name, rec.slots, targets, self.settings, resplit=False, reason="operator request", clear=clear
        )
        return await self._run(plan)

    async def resplit(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """``jobs.resplit``: relaunch a running job over ``ranks`` instances of ``profile`` (default: its own).

        A job without standby ranks restarts cold whatever its targets, so it keeps its own instances first. A job
        with standby ranks goes where there is room; when some rank could only land on the instances it runs on (it
        would start cold there, after the checkpoint), the request is refused unless ``in_place``."""
        rec = self._running(args["name"])
        ranks: int = args["ranks"]
        if not rec.spec.ranks_min <= ranks <= rec.spec.ranks_max:
            raise RequestError(f"job {rec.name} may run {rec.spec.ranks_min}..{rec.spec.ranks_max} ranks, not {ranks}")
        view = await self.ex.view()
        model = node_model(view)
        profile = args["profile"] or rec.slots[0].profile
        try:
            model.profile(profile)
        except KeyError as exc:
            raise RequestError(str(exc.args[0])) from None
        # A re-split keeps the job's own instances, unless the job has standby ranks: those start only on instances
        # the job does not hold yet, so it goes where there is room and keeps its own only when nothing else fits.
        keep = not rec.spec.hook.standby
        held = self.ex.held(exclude=rec.name)
        targets, clear = self._place(view, profile, ranks, held=held, own=rec.slots, keep_own=keep)
        if rec.spec.hook.standby and not args["in_place"]:
            refuse_in_place(model, rec, profile, targets, "resplit")
        plan = move_plan(
            view, rec.name, rec.slots, targets, self.settings, resplit=True, reason="operator request", clear=clear
        )
        return await self._run(plan)

    def _place(
        self,
        view: NodeView,
        profile: str,
        count: int,
        *,
        held: Mapping[tuple[int, int], str],
        own: Sequence[Slot] = (),
        keep_own: bool = False,
    ) -> tuple[list[Slot], list[Slot]]:
        """Targets for an operator's request, and the idle instances to destroy first: what is free and what fits
        now (:func:`choose_targets`); failing that, the planner's way of making room (:func:`make_room`), so a
        request gets the help ``flexmig plan --request`` shows. PlanRejectedError (the first chooser's, which names
        what it found) when neither finds room."""
        try:
            return choose_targets(view, profile, count, held=held, own=own, keep_own=keep_own), []
        except PlanRejectedError as first:
            kept = [s for s in own if s.profile == profile][:count] if keep_own else []
            try:
                added, clear = make_room(view, profile, count - len(kept), self.settings, held=held, own=own)
            except PlanRejectedError:
                raise PlanRejectedError(f"{first}; destroying idle instances would not make room either") from None
            return [*kept, *added], clear

    async def stop(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """``jobs.stop``: checkpoint and stop a running job (``force``: without waiting for the checkpoint)."""
        name: str = args["name"]
        force: bool = args["force"]
        self._running(name)
        if self.ex.mode == "advise":
            raise PlanRejectedError(f"mode is 'advise': would stop job {name}; nothing done")
        try:
            res = await self.ex.execute_encoded([encode(StopPayload(force, "operator request"), name)], "control")
        except (PlanRejectedError, JournalError) as exc:
            if not self._storage_full(exc):
                raise
            return await stop_on_full_storage(self.ex, name, str(exc))  # flexmig.act.fullstop
        return res.to_json()

    def _storage_full(self, exc: Exception) -> bool:
        """The journal refused a plan for want of storage (it fails to write, or a write waits for space)."""
        if isinstance(exc, JournalError):
            return storage_unavailable(exc) is not None
        return self.ex.durable.stalled is not None and "cannot be written now" in str(exc)
