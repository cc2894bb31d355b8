"""How each policy manages the simulated node: layouts and plans for static, drain and flex; a slice pool for fluid.

Every manager answers to the engine the same way (:class:`Manager`): which queued jobs start or move now, as
:class:`Grant`s. The three MIG policies build a :class:`~flexmig.plan.types.Plan` and the engine-facing state
is whatever :func:`~flexmig.plan.validate.validate_plan` says the plan leads to, so every plan of every policy
is replayed action by action on the pure model, and a plan the hardware would refuse stops the replay.

Plans run serially: an action finishes ``cost_s`` after the one before it. A job started or moved by an action
makes no progress until that action is done (its *delay*).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout
from flexmig.plan.geometry import demand_weights
from flexmig.plan.placer import BasePlacer
from flexmig.plan.planner import Planner
from flexmig.plan.queue import Reservation, admit
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape, covers, nominal_shape, speed_of
from flexmig.plan.types import (
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
from flexmig.replay.baselines import DrainPlacer, StaticPlacer

__all__ = ["FluidManager", "Grant", "LayoutManager", "Manager", "RunView"]


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

    def held_slices(self) -> int:
        """Compute slices jobs hold now."""
        ...

    def fragmentation(self, weights: Mapping[str, float]) -> float:
        """External fragmentation now (FGD score over the demand mix ``weights``, by profile name)."""
        ...

    def layouts(self) -> tuple[Layout, ...]:
        """The GPUs' layouts now (empty for a manager without MIG rules)."""
        ...


def _duration(settings: PlannerSettings) -> Callable[[JobRequest], float | None]:
    def duration(job: JobRequest) -> float | None:
        if job.expected_runtime_s is None:
            return None
        spreads = settings.resplit and job.elastic
        return job.expected_runtime_s / (settings.spread_efficiency if spreads else 1.0)

    return duration


class LayoutManager:
    """static, drain or flex on a node of ``gpus`` GPUs of ``model`` starting from ``layouts``."""

    def __init__(
        self,
        policy: Literal["static", "drain", "flex"],
        model: GpuModel,
        layouts: Sequence[Layout],
        settings: PlannerSettings,
    ) -> None:
        self.policy = policy
        self.model = model
        if policy == "flex":
            self.settings = settings
        else:
            self.settings = PlannerSettings(
                checkpoint_s=settings.checkpoint_s,
                restart_s=settings.restart_s,
                reconfigure_s=settings.reconfigure_s,
                spread_efficiency=settings.spread_efficiency,
                settling_s=settings.settling_s,
                gain_margin=settings.gain_margin,
                resplit=False,
                migrate=False,
                repartition_busy=False,
            )
        self.planner = Planner(model, self.settings)
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

    def held_slices(self) -> int:
        """Compute slices held by jobs."""
        return sum(i.profile.compute_slices for insts in self._holds.values() for i in insts)

    def release(self, job: str) -> None:
        """Free ``job``'s instances (they stay, free)."""
        self._holds.pop(job, None)

    def _placer(
        self,
        cls: type[BasePlacer],
        scratch: Scratch,
        weights: tuple[float, ...],
        now_s: float,
        ends: Mapping[str, float],
    ) -> BasePlacer:
        return cls(scratch, self.model, self.settings, weights=weights, now_s=now_s, ends=ends)

    def placeable(self, job: JobRequest) -> bool:
        """Could ``job`` run on the node when nothing else runs (static: on its fixed layout)?"""
        key = (self.geometry.nominal(job), job.elastic and self.settings.resplit, job.min_ranks, job.max_ranks)
        got = self._placeable.get(key)
        if got is None:
            empty = tuple(Layout.empty(self.model) for _ in self._initial)
            base = self._initial if self.policy == "static" else empty
            scratch = Scratch(self.geometry, base, {}, self.settings)
            cls = {"static": StaticPlacer, "drain": DrainPlacer}.get(self.policy)
            weights = demand_weights(self.geometry, {})
            placer = self._placer(cls or _flex_placer(), scratch, weights, 0.0, {})
            got = placer.fit(scratch, job, scratch.usable_gpus(), "probe") is not None
            self._placeable[key] = got
        return got

    # ------------------------------------------------------------------------------------------- schedule
    def schedule(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        """Build this policy's plan for now, replay it on the model, and say who starts or moves."""
        if not queue and (self.policy != "flex" or all(v.speed >= 1.0 for v in running.values())):
            return []
        if self.policy == "flex":
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
        else:
            plan = self._baseline_plan(now_s, queue, running)
        if not plan.actions:
            return []
        state = NodeState(
            self.model,
            self._layouts,
            tuple(
                RunningJob(
                    name,
                    self._holds[name],
                    view.request,
                    movable=view.request.movable,
                    last_moved_s=view.last_moved_s,
                )
                for name, view in running.items()
            ),
            tuple(queue),
            now_s,
        )
        try:
            outcome = validate_plan(state, plan, self.settings, check=False)
        except PlanRejectedError as exc:  # a planner bug: stop loudly, with the plan
            raise PlanRejectedError(f"{self.policy} made a plan the hardware would refuse at t={now_s}: {exc}") from exc
        self._layouts = outcome.layouts
        self._holds = dict(outcome.holds)
        return self._grants(plan, queue, running)

    def _baseline_plan(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> Plan:
        scratch = Scratch(self.geometry, self._layouts, self._holds, self.settings)
        counts: Counter[str] = Counter()
        for view in running.values():
            counts[self.geometry.nominal(view.request).profile.name] += 1
        for req in queue:
            counts[self.geometry.nominal(req).profile.name] += 1
        weights = demand_weights(self.geometry, counts)
        ends = {name: now_s + view.remaining_s for name, view in running.items()}
        cls = StaticPlacer if self.policy == "static" else DrainPlacer
        placer = self._placer(cls, scratch, weights, now_s, ends)
        admit(sorted(queue, key=lambda r: r.submitted_s), placer, now_s, _duration(self.settings))
        return Plan(tuple(scratch.actions), now_s)

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
                shape = Shape(len(insts), insts[0].profile)
                nominal = self.geometry.nominal(request)
                if shape.ranks == nominal.ranks and covers(shape.profile, nominal.profile):
                    speed = 1.0
                else:
                    speed = speed_of(self.model, request, shape, self.settings)
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
                if self.policy == "drain" and not held:
                    continue
                frag += w * free
        return frag / free_total if free_total else 0.0


def _flex_placer() -> type[BasePlacer]:
    from flexmig.plan.placer import FlexPlacer  # noqa: PLC0415 - keeps the baselines' import graph small

    return FlexPlacer


class FluidManager:
    """The node as one pool of compute slices: a job starts when enough slices are free, wherever they are."""

    def __init__(self, model: GpuModel, gpus: int) -> None:
        self.model = model
        self.capacity = model.compute_slices * gpus
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

    def held_slices(self) -> int:
        """Slices held."""
        return self._used

    def release(self, job: str) -> None:
        """Return ``job``'s slices to the pool."""
        self._used -= self._held.pop(job, 0)

    def fragmentation(self, weights: Mapping[str, float]) -> float:
        """A pool has no placement rules, so no external fragmentation."""
        return 0.0

    def schedule(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        """The shared discipline over the pool."""
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
                if reservation is not None and isinstance(reservation.token, int):
                    if need > reservation.token - pool._extra_used:
                        return False
                    pool._extra_used += need
                pool._held[job.name] = need
                pool._used += need
                grants.append(Grant(job.name, "start", 1.0, 0.0, need))
                if job.expected_runtime_s is not None:
                    bisect.insort(ends, (now_s + job.expected_runtime_s, job.name))
                return True

            def exhausted(self) -> bool:
                return pool._used >= pool.capacity

            def shadow(self, job: JobRequest) -> Reservation | None:
                need = pool._need(job)
                free = pool.capacity - pool._used
                for t, name in ends:
                    free += pool._held.get(name, 0)
                    if free >= need:
                        return Reservation(job.name, t, free - need)
                return None

        admit(sorted(queue, key=lambda r: r.submitted_s), _Pool(), now_s, _duration(PlannerSettings(resplit=False)))
        return grants
