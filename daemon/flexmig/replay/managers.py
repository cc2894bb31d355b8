"""How each policy manages the simulated node: layouts and plans for static, drain (both kinds) and flex; a slice
pool for fluid (and, in :mod:`flexmig.replay.repack`, freely re-packed whole instances for repack).

Every manager answers to the engine the same way (:class:`Manager`): which queued jobs start or move now, as
:class:`Grant`s, under the queue discipline of its settings (EASY or greedy). The MIG policies build a
:class:`~flexmig.plan.types.Plan` and the engine-facing state is whatever :func:`~flexmig.plan.validate.validate_plan`
says the plan leads to, so every plan of every policy is replayed action by action on the pure model, and a plan
the hardware would refuse stops the replay. The baselines plan through the daemon's own pipeline
(:class:`~flexmig.plan.planner.Planner`: admit, then grow slow jobs with what is left), with their own placer and no
stage that makes room by moving jobs.

Plans run serially: an action finishes ``cost_s`` after the one before it. A job started or moved by an action
makes no progress until that action is done (its *delay*).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout
from flexmig.plan.geometry import demand_weights
from flexmig.plan.placer import BasePlacer, PlacerInputs
from flexmig.plan.planner import Planner
from flexmig.plan.queue import Reservation, admit
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape, covers, nominal_shape, speed_of
from flexmig.plan.types import (
    Discipline,
    Instance,
    JobRequest,
    MigrateJob,
    NodeState,
    Plan,
    PlannerSettings,
    ResplitJob,
    RunningJob,
    StartJob,
)
from flexmig.plan.validate import validate_plan
from flexmig.replay.baselines import DrainFirstFitPlacer, DrainPlacer, StaticPlacer

__all__ = ["FluidManager", "Grant", "LayoutManager", "Manager", "MigPolicy", "RunView"]

MigPolicy = Literal["static", "drain", "drain-first-fit", "flex"]
_PLACERS: dict[str, type[BasePlacer]] = {
    "static": StaticPlacer,
    "drain": DrainPlacer,
    "drain-first-fit": DrainFirstFitPlacer,
}


@dataclass(frozen=True, slots=True)
class Grant:
    """A job starts or moves: from now on it holds ``slices`` compute slices and runs at ``speed`` after ``delay_s``."""

    job: str
    kind: Literal["start", "migrate", "resplit"]
    speed: float
    delay_s: float
    slices: int
    instances: tuple[Instance, ...] = ()


@dataclass(frozen=True, slots=True)
class RunView:
    """What a manager may know of a running job."""

    request: JobRequest
    remaining_s: float
    last_moved_s: float
    speed: float


class Manager(Protocol):
    """One policy's management of the node."""

    def placeable(self, job: JobRequest) -> bool:
        """Could ``job`` ever run here (on the node with nothing else running)?"""
        ...

    def schedule(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        """Starts and moves for now."""
        ...

    def release(self, job: str) -> None:
        """``job`` ended: free what it holds."""
        ...

    def fragmentation(self, weights: Mapping[str, float]) -> float:
        """External fragmentation now (FGD score over the demand mix ``weights``, by profile name)."""
        ...

    def layouts(self) -> tuple[Layout, ...]:
        """The GPUs' layouts now (empty for a manager without MIG rules)."""
        ...


class LayoutManager:
    """static, drain, drain-first-fit or flex on a node of ``gpus`` GPUs of ``model`` starting from ``layouts``.

    The baselines keep the settings' costs, discipline and malleability, with spreading, migration and
    repartitioning of busy GPUs off (they have none of flexmig's mechanisms).
    """

    def __init__(
        self,
        policy: MigPolicy,
        model: GpuModel,
        layouts: Sequence[Layout],
        settings: PlannerSettings,
    ) -> None:
        self.policy = policy
        self.model = model
        if policy == "flex":
            self.settings = settings
        else:
            self.settings = replace(settings, resplit=False, migrate=False, repartition_busy=False)
        if policy == "flex":
            self.planner = Planner(model, self.settings)
        else:
            self.planner = Planner(model, self.settings, placer=_PLACERS[policy], make_room=None)
        self.geometry = self.planner.geometry
        self._layouts: tuple[Layout, ...] = tuple(layouts)
        self._holds: dict[str, tuple[Instance, ...]] = {}
        self._placeable: dict[Hashable, bool] = {}
        self._initial = tuple(layouts)

    # ---------------------------------------------------------------------------------------------- state
    def layouts(self) -> tuple[Layout, ...]:
        """Every GPU's layout now."""
        return self._layouts

    def holds(self) -> Mapping[str, tuple[Instance, ...]]:
        """Instances each running job holds."""
        return self._holds

    def release(self, job: str) -> None:
        """Free ``job``'s instances (they stay, free)."""
        self._holds.pop(job, None)

    def placeable(self, job: JobRequest) -> bool:
        """Could ``job`` run on the node when nothing else runs (static: on its fixed layout)?"""
        key = (self.geometry.nominal(job), job.elastic and self.settings.resplit, job.min_ranks, job.max_ranks)
        got = self._placeable.get(key)
        if got is None:
            empty = tuple(Layout.empty(self.model) for _ in self._initial)
            base = self._initial if self.policy == "static" else empty
            scratch = Scratch(self.geometry, base, {}, self.settings)
            weights = demand_weights(self.geometry, {})
            placer = self.planner.placer(
                PlacerInputs(
                    scratch=scratch, model=self.model, settings=self.settings, weights=weights, now_s=0.0, ends={}
                )
            )
            got = placer.fit(scratch, job, scratch.usable_gpus(), "probe") is not None
            self._placeable[key] = got
        return got

    # ------------------------------------------------------------------------------------------- schedule
    def schedule(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        """Build this policy's plan for now, replay it on the model, and say who starts or moves."""
        if not queue and all(v.speed >= 1.0 for v in running.values()):
            return []
        state = NodeState(
            self.model,
            self._layouts,
            tuple(
                RunningJob(
                    name=name,
                    instances=self._holds[name],
                    nominal=view.request,
                    movable=view.request.movable,
                    move_cost_s=view.request.move_cost_s,
                    last_moved_s=view.last_moved_s,
                    remaining_s=view.remaining_s,
                )
                for name, view in running.items()
            ),
            tuple(queue),
            now_s,
        )
        plan = self.planner.plan(state, check=False)
        if not plan.actions:
            return []
        try:
            outcome = validate_plan(state, plan, self.settings, check=False)
        except PlanRejectedError as exc:  # a planner bug: stop loudly, with the plan
            raise PlanRejectedError(f"{self.policy} made a plan the hardware would refuse at t={now_s}: {exc}") from exc
        self._layouts = outcome.layouts
        self._holds = dict(outcome.holds)
        return self._grants(plan, queue, running)

    def _grants(self, plan: Plan, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        requests = {r.name: r for r in queue}
        requests.update({name: view.request for name, view in running.items()})
        grants: list[Grant] = []
        clock = 0.0
        for action in plan.actions:
            clock += action.cost_s
            if isinstance(action, StartJob | MigrateJob | ResplitJob):
                insts = action.instances if isinstance(action, StartJob) else action.to_instances
                request = requests[action.job]
                speed = speed_of(self.model, request, Shape(len(insts), insts[0].profile), self.settings)
                kind: Literal["start", "migrate", "resplit"]
                kind = (
                    "start"
                    if isinstance(action, StartJob)
                    else "migrate"
                    if isinstance(action, MigrateJob)
                    else "resplit"
                )
                slices = sum(i.profile.compute_slices for i in insts)
                grants.append(Grant(action.job, kind, speed, clock, slices, insts))
        return grants

    # ------------------------------------------------------------------------------------- fragmentation
    def fragmentation(self, weights: Mapping[str, float]) -> float:
        """FGD external fragmentation of the node: sum_g sum_m w_m F_g(m) over sum_g free(g).

        ``free(g)`` counts compute slices no job holds; ``F_g(m) = free(g)`` when a rank of profile ``m`` cannot
        start on ``g`` now under this policy's rules (static: no free instance covers it; drain: none covers it
        and the GPU is busy; flex: none covers it and none can be created around the held instances), else 0.
        The same definition as ``flexmig.detect.fragmentation``, with "can start" taken per policy.
        """
        held_by_gpu: dict[int, list[Instance]] = {}
        for insts in self._holds.values():
            for inst in insts:
                held_by_gpu.setdefault(inst.gpu, []).append(inst)
        frag = 0.0
        free_total = 0
        profiles = [(self.model.profile(name), w) for name, w in weights.items() if w > 0]
        for g, layout in enumerate(self._layouts):
            held = held_by_gpu.get(g, [])
            free = self.model.compute_slices - sum(i.profile.compute_slices for i in held)
            if free <= 0:
                continue
            free_total += free
            held_starts = {i.start for i in held}
            free_insts = [i for i in layout.instances if i.start not in held_starts]
            key = tuple(sorted((i.start, i.profile.profile_id) for i in held))
            for profile, w in profiles:
                if any(covers(i.profile, profile) for i in free_insts):
                    continue
                if self.policy == "flex" and self.geometry.starts(key, profile):
                    continue
                if self.policy in ("drain", "drain-first-fit") and not held:
                    continue
                frag += w * free
        return frag / free_total if free_total else 0.0


class FluidManager:
    """The node as one pool of compute slices: a job starts when enough slices are free, wherever they are."""

    def __init__(self, model: GpuModel, gpus: int, discipline: Discipline = "easy") -> None:
        self.model = model
        self.capacity = model.compute_slices * gpus
        self.discipline: Discipline = discipline
        self._held: dict[str, int] = {}
        self._used = 0
        self._extra_used = 0

    def layouts(self) -> tuple[Layout, ...]:
        """No MIG layouts in the pool."""
        return ()

    def _need(self, job: JobRequest) -> int:
        return nominal_shape(self.model, job).compute_slices

    def placeable(self, job: JobRequest) -> bool:
        """Fits in the pool at all."""
        return self._need(job) <= self.capacity

    def release(self, job: str) -> None:
        """Return ``job``'s slices to the pool."""
        self._used -= self._held.pop(job, 0)

    def fragmentation(self, weights: Mapping[str, float]) -> float:
        """A pool has no placement rules, so no external fragmentation."""
        return 0.0

    def schedule(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        """The shared discipline over the pool. The head's reservation holds the slices it needs at its start;
        what is left then (``extra``) is what jobs that run past it may take."""
        if not queue:
            return []
        ends = sorted((now_s + v.remaining_s, name) for name, v in running.items())
        grants: list[Grant] = []
        self._extra_used = 0
        pool = self

        class _Pool:
            def shape_key(self, job: JobRequest) -> Hashable:
                return pool._need(job)

            def try_place(self, job: JobRequest, reservation: Reservation | None) -> bool:
                need = pool._need(job)
                if need > pool.capacity - pool._used:
                    return False
                runs = job.expected_runtime_s
                past = reservation is not None and (runs is None or now_s + runs > reservation.start_s)
                if reservation is not None and past and isinstance(reservation.token, int):
                    if need > reservation.token - pool._extra_used:
                        return False
                    pool._extra_used += need
                pool._held[job.name] = need
                pool._used += need
                grants.append(Grant(job.name, "start", 1.0, 0.0, need))
                if runs is not None:
                    bisect.insort(ends, (now_s + runs, job.name))
                return True

            def try_narrow(self, job: JobRequest, reservation: Reservation | None) -> bool:
                return False  # jobs run at their nominal compute here

            def exhausted(self) -> bool:
                return pool._used >= pool.capacity

            def shadow(self, job: JobRequest) -> Reservation | None:
                need = pool._need(job)
                free = pool.capacity - pool._used
                i = 0
                while i < len(ends):
                    t = ends[i][0]
                    while i < len(ends) and ends[i][0] == t:  # every job ending at t frees its slices at t
                        free += pool._held.get(ends[i][1], 0)
                        i += 1
                    if free >= need:
                        return Reservation(job.name, max(t, now_s), free - need, job)
                return None

        def duration(job: JobRequest) -> float | None:
            return job.expected_runtime_s

        admit(sorted(queue, key=lambda r: r.submitted_s), _Pool(), now_s, duration, discipline=self.discipline)
        return grants
