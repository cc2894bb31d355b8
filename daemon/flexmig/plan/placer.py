"""The flex placer: where a job goes under flexmig's rules, for the shared queue discipline.

A job first tries its nominal shape anywhere on the node: free instances that fit, or new instances created
around the running jobs on busy GPUs (repartitioning a busy GPU never touches a held instance). An elastic job
that does not fit nominally is spread over several smaller instances, on one GPU or several (one rank per
instance, Flex-MIG's one-to-many placement), at the settings' spread efficiency; of the spreads that fit, the one
that keeps the most demand-weighted capacity wins.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

from flexmig.mig.catalogue import GpuModel
from flexmig.plan.queue import Reservation
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape, speed_of
from flexmig.plan.types import Instance, JobRequest, PlannerSettings, StartJob

__all__ = ["BasePlacer", "FlexPlacer", "Placed"]

Placed = tuple[Shape, tuple[Instance, ...]]


class BasePlacer:
    """What every placer on a :class:`Scratch` shares: starting jobs, and the head's reservation by look-ahead.

    Subclasses say where a job fits (:meth:`fit`). ``ends`` gives the expected end time of each running job (for
    the head's reservation); jobs without one are assumed to run forever. Reservations hold GPUs: a backfilled
    job that would run past the head's start keeps off them.
    """

    def __init__(
        self,
        scratch: Scratch,
        model: GpuModel,
        settings: PlannerSettings,
        *,
        weights: tuple[float, ...],
        now_s: float,
        ends: Mapping[str, float],
        on_start: Callable[[JobRequest, Shape, tuple[Instance, ...]], None] | None = None,
    ) -> None:
        self.scratch = scratch
        self.model = model
        self.settings = settings
        self.weights = weights
        self.now_s = now_s
        self.ends = dict(ends)
        self.on_start = on_start
        self._nominal_start: dict[tuple[int, int], float] = {}

    # ------------------------------------------------------------------------------------------ protocol
    def shape_key(self, job: JobRequest) -> Hashable:
        """Nominal profile, rank count, and (when spreads are on) the elastic range."""
        if self.settings.resplit and job.elastic:
            return (job.need, job.ranks, job.min_ranks, job.max_ranks, job.rank_memory_mib)
        return (job.need, job.ranks)

    def try_place(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """Start ``job`` now if it fits (off the reserved GPUs when a reservation is given)."""
        avoid = _reserved_gpus(reservation)
        got = self.fit(self.scratch, job, self.scratch.usable_gpus(avoid), f"start {job.name}")
        if got is None:
            return False
        shape, instances = got
        speed = speed_of(self.model, job, shape, self.settings)
        how = "as requested" if speed == 1.0 else f"spread over {shape.ranks} instances at {speed:.0%} speed"
        self.scratch.emit(StartJob(job.name, instances, f"{job.name} fits {how}", 0.0))
        if job.expected_runtime_s is not None:
            self.ends[job.name] = self.now_s + job.expected_runtime_s / speed
        if self.on_start is not None:
            self.on_start(job, shape, instances)
        return True

    def shadow(self, job: JobRequest) -> Reservation | None:
        """Release running jobs in end order on a copy until ``job`` fits; the time and the GPUs it would use."""
        twin = self.scratch.fork()
        order = sorted(
            ((t, name) for name, t in self.ends.items() if name in twin.jobs),
            key=lambda item: (item[0], item[1]),
        )
        shapes = twin.geo.shapes(job, resplit=self.settings.resplit)
        gpus = twin.usable_gpus()
        for t, name in order:
            twin.release(name)
            if not any(twin.room(shape.profile, gpus) >= shape.ranks for shape in shapes):
                continue
            twin.begin()
            got = self.fit(twin, job, gpus, "look ahead")
            twin.rollback()
            if got is not None:
                return Reservation(job.name, max(t, self.now_s), frozenset(i.gpu for i in got[1]))
        return None

    def fit(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place ``job`` on ``scratch`` using ``gpus``; None and no change when it does not fit."""
        raise NotImplementedError

    def exhausted(self) -> bool:
        """No free instance on any usable GPU, and (subclasses) no other way to make one."""
        return not any(self.scratch.free_instances(g) for g in self.scratch.usable_gpus())


class FlexPlacer(BasePlacer):
    """The flex rules: nominal anywhere (creating around held instances), else the best spread."""

    def exhausted(self) -> bool:
        """Not even the smallest instance could be created or reused anywhere."""
        if not super().exhausted():
            return False
        smallest = min(self.model.plain_profiles, key=lambda p: (p.compute_slices, p.memory_slices))
        return self.scratch.room(smallest, self.scratch.usable_gpus()) == 0

    def fit(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place ``job`` on ``scratch`` (nominal first, then the best spread); None and no change if it cannot."""
        shapes = scratch.geo.shapes(job, resplit=self.settings.resplit)
        nominal = shapes[0]
        if scratch.room(nominal.profile, gpus) >= nominal.ranks:
            got = scratch.place_shape(job.name, nominal, self.weights, gpus, reason)
            if got is not None:
                return nominal, got[0]
        if len(shapes) > 1 and scratch is self.scratch and not self._spread_pays(job, nominal):
            return None
        best: tuple[tuple[float, int], Shape] | None = None
        for shape in shapes[1:]:
            if scratch.room(shape.profile, gpus) < shape.ranks:
                continue
            scratch.begin()
            trial = scratch.place_shape(job.name, shape, self.weights, gpus, reason, exact=True)
            scratch.rollback()
            if trial is None:
                continue
            score = (-round(trial[1], 9), shape.ranks)
            if best is None or score < best[0]:
                best = (score, shape)
        if best is None:
            return None
        again = scratch.place_shape(job.name, best[1], self.weights, gpus, reason, exact=True)
        assert again is not None, "a trial that fitted must fit again"
        return best[1], again[0]

    def _spread_pays(self, job: JobRequest, nominal: Shape) -> bool:
        """Would spreading ``job`` now end it sooner than waiting for its nominal shape?

        Spread now, it ends at ``now + R / e``; nominal, no earlier than when the running jobs ending first leave
        room for it, ``t_n + R``. Spread only when ``t_n - now > R (1/e - 1)``: a spread also holds its slices
        longer, so a short wait is the better use of the node. Unknown run times: spread.
        """
        runtime = job.expected_runtime_s
        if runtime is None:
            return True
        key = (nominal.profile.profile_id, nominal.ranks)
        t_n = self._nominal_start.get(key)
        if t_n is None:
            t_n = self._earliest(nominal)
            self._nominal_start[key] = t_n
        return t_n - self.now_s > runtime * (1.0 / self.settings.spread_efficiency - 1.0)

    def _earliest(self, shape: Shape) -> float:
        """When ``shape`` first fits as running jobs end in order (infinity if never)."""
        twin = self.scratch.fork()
        gpus = twin.usable_gpus()
        order = sorted((t, name) for name, t in self.ends.items() if name in twin.jobs)
        for t, name in order:
            twin.release(name)
            if twin.room(shape.profile, gpus) < shape.ranks:
                continue
            twin.begin()
            got = twin.place_shape("\x00probe", shape, self.weights, gpus, "look ahead")
            twin.rollback()
            if got is not None:
                return t
        return float("inf")


def _reserved_gpus(reservation: Reservation | None) -> frozenset[int]:
    if reservation is None or not isinstance(reservation.token, frozenset):
        return frozenset()
    return frozenset(g for g in reservation.token if isinstance(g, int))
