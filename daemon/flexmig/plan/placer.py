"""Placers: where a job goes under one policy's rules, for the shared queue discipline; the flex placer here.

A placer answers the discipline's questions (:class:`flexmig.plan.queue.Placer`) on a :class:`Scratch`:

* whether a job starts now, and where: its nominal shape first; an elastic job that does not fit nominally may be
  *spread* (flex only); a malleable job that still does not fit may start *narrow*, below its nominal compute,
  when the wait it is spared outweighs what it pays, even if it never grows back (:mod:`flexmig.plan.narrow`);
* the head's reservation: the earliest time it could start as running jobs end (all jobs ending at one time
  together), and whether it still could then with a backfilled job running (:meth:`BasePlacer.keeps_head`).

The flex rules: a job first tries its nominal shape anywhere on the node: free instances that fit, or new
instances created around the running jobs on busy GPUs (repartitioning a busy GPU never touches a held instance).
An elastic job that does not fit nominally is spread over several smaller instances, on one GPU or several (one
rank per instance, Flex-MIG's one-to-many placement), at the settings' spread efficiency; of the spreads that fit,
the one that keeps the most demand-weighted capacity wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from flexmig.mig.catalogue import GpuModel
from flexmig.plan.narrow import NarrowCase, narrow_case
from flexmig.plan.queue import Reservation
from flexmig.plan.scratch import GpuTally, Scratch
from flexmig.plan.shapes import Shape, speed_of
from flexmig.plan.types import Instance, JobRequest, PlannerSettings, RankNeed, StartJob

__all__ = ["BasePlacer", "FlexPlacer", "Placed", "PlacerInputs", "rigid"]

Placed = tuple[Shape, tuple[Instance, ...]]

_INF = math.inf


def rigid(request: JobRequest, name: str | None = None) -> JobRequest:
    """``request`` that may run only at its nominal shape (named ``name``): for look-aheads and growth."""
    return replace(
        request,
        name=name or request.name,
        min_ranks=request.ranks,
        max_ranks=request.ranks,
        malleable=False,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacerInputs:
    """What one planning pass builds its placer from (the one signature of every placer and placer factory).

    ``weights`` is the demand mix (:func:`flexmig.plan.geometry.demand_weights`). ``ends`` gives the expected end
    time of each running job (for the head's reservation); jobs without one are assumed to run forever. ``queue``
    is the pass's queue in order, for placers that lay GPUs out for the jobs still waiting (the strong drain).
    """

    scratch: Scratch
    model: GpuModel
    settings: PlannerSettings
    weights: tuple[float, ...]
    now_s: float
    ends: Mapping[str, float]
    queue: Sequence[JobRequest] = ()


class BasePlacer:
    """What every placer on a :class:`Scratch` shares: starting jobs (narrow ones too), and the head's
    reservation by look-ahead.

    Subclasses say where a job fits at its nominal shape or a spread (:meth:`fit_nominal`) and how ranks of one
    profile are placed (:meth:`place_exact`). Built from the pass's :class:`PlacerInputs`.
    """

    def __init__(
        self,
        inputs: PlacerInputs,
        *,
        on_start: Callable[[JobRequest, Shape, tuple[Instance, ...]], None] | None = None,
    ) -> None:
        self.scratch = inputs.scratch
        self.model = inputs.model
        self.settings = inputs.settings
        self.weights = inputs.weights
        self.now_s = inputs.now_s
        self.ends = dict(inputs.ends)
        self.queue = tuple(inputs.queue)
        self.on_start = on_start
        self._nominal_start: dict[tuple[int, int], float] = {}
        self._open: GpuTally | None = None

    # ------------------------------------------------------------------------------------------- shapes
    def shapes(self, job: JobRequest) -> tuple[Shape, ...]:
        """Every shape ``job`` may take under these settings: nominal, spreads, narrow shapes."""
        return self.scratch.geo.shapes(job, resplit=self.settings.resplit, malleable=self.settings.malleable)

    def speed(self, job: JobRequest, shape: Shape) -> float:
        """Speed of ``job`` as ``shape``, relative to nominal."""
        return speed_of(self.model, job, shape, self.settings)

    # ------------------------------------------------------------------------------------------ protocol
    def shape_key(self, job: JobRequest) -> Hashable:
        """Nominal profile and rank count; for jobs that may take other shapes, their range too (the discipline also
        weighs their run time: :class:`flexmig.plan.queue.Placer`)."""
        if (self.settings.resplit and job.elastic) or (self.settings.malleable and job.malleable):
            return (job.need, job.ranks, job.min_ranks, job.max_ranks, job.rank_memory_mib, job.malleable)
        return (job.need, job.ranks)

    def try_place(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """Start ``job`` now at its nominal shape or a spread if it fits; with a reservation, only where the head
        still fits at its start.

        The placement this policy prefers is tried first; if it would keep the head from starting on time and the
        reservation names GPUs, a placement off those GPUs is tried too.
        """
        return self._try(job, reservation, self.fit)

    def try_narrow(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """Start the malleable ``job`` now narrow, on what is left, if that pays (:meth:`narrow_pays`); with a
        reservation, only where the head still fits at its start."""
        if not (self.settings.malleable and job.malleable):
            return False
        return self._try(job, reservation, self.fit_narrow)

    def _try(
        self,
        job: JobRequest,
        reservation: Reservation | None,
        fit: Callable[[Scratch, JobRequest, Sequence[int], str], Placed | None],
    ) -> bool:
        guard = reservation if reservation is not None and reservation.start_s < _INF else None
        if guard is not None and (guard.request is None or guard.job == job.name):
            guard = None
        reason = f"start {job.name}"
        tries = [self.scratch.usable_gpus()]
        avoid = _reserved_gpus(guard)
        if guard is not None and avoid:
            tries.append(self.scratch.usable_gpus(avoid))
        for gpus in tries:
            if not gpus:
                continue
            self.scratch.begin()
            got = fit(self.scratch, job, gpus, reason)
            if got is not None and (guard is None or self.keeps_head(guard, {job.name: self._end_of(job, got[0])})):
                self.scratch.commit()
                self._started(job, *got)
                return True
            self.scratch.rollback()
            if got is None:
                return False  # no placement at all on every usable GPU: fewer GPUs will not help
        return False

    def _end_of(self, job: JobRequest, shape: Shape) -> float:
        runtime = job.expected_runtime_s
        if runtime is None:
            return _INF
        return self.now_s + runtime / self.speed(job, shape)

    def _started(self, job: JobRequest, shape: Shape, instances: tuple[Instance, ...]) -> None:
        speed = self.speed(job, shape)
        nominal = self.shapes(job)[0]
        if speed == 1.0:
            how = "fits as requested"
        elif shape.compute_slices >= nominal.compute_slices:
            how = f"fits spread over {shape.ranks} instances at {speed:.0%} speed"
        else:
            wait = self._nominal_start.get((nominal.profile.profile_id, nominal.ranks))
            case = None if wait is None else self.narrow_case(job, nominal, speed, nominal_s=wait)
            waited = (
                ""
                if wait is None
                else f" (its {nominal.ranks}x{nominal.profile.name} "
                + ("never frees up as running jobs end" if wait == _INF else f"frees up in ~{wait - self.now_s:.0f}s")
                + ")"
            )
            weighed = (
                ""
                if case is None or wait == _INF
                else f": spares ~{case.wait_s:.0f}s of waiting for ~{case.expected_cost_s:.0f}s of slowdown and growing"
                f" back, ~{case.worst_cost_s:.0f}s if it never grows"
            )
            how = (
                f"starts narrow as {shape.ranks}x{shape.profile.name} at {speed:.0%} speed rather than wait"
                f"{waited}{weighed}; it is grown when room frees"
            )
        self.scratch.emit(StartJob(job.name, instances, f"{job.name} {how}", 0.0))
        self.ends[job.name] = self._end_of(job, shape)
        if self.on_start is not None:
            self.on_start(job, shape, instances)

    def shadow(self, job: JobRequest) -> Reservation | None:
        """Release running jobs in end order on a copy (every job ending at one time together) until ``job`` fits;
        the time, the GPUs it would use and the shape it is reserved as.

        A rigid job is reserved at its nominal shape or a spread, and held to what it was reserved as: reserved
        nominal, a backfill must leave it its nominal shape at its start (:meth:`keeps_head`), not just a spread.
        A malleable one may instead be reserved *narrow*:
        at the first time its smallest narrow shape fits, holding just that, when starting narrow then pays
        (:meth:`narrow_pays`, judged at the smallest shape's speed, from that time). This is how
        shrinking a waiting head beats reserving the node for it: the head needs only what frees first, not a
        drain; when it starts it takes whatever narrow shape fits then.
        """
        twin = self.scratch.fork()
        shapes = self.shapes(job)
        nominal = shapes[0]
        full = [s for s in shapes if s.compute_slices >= nominal.compute_slices]
        narrow = [s for s in shapes if s.compute_slices < nominal.compute_slices]
        gpus = twin.usable_gpus()
        first_narrow: tuple[float, Shape, tuple[Instance, ...]] | None = None
        for t in self._releasing(twin):
            if narrow and first_narrow is None:
                for shape in reversed(narrow):  # the least the head needs to start
                    if not self.may_fit(twin, (shape,), gpus):
                        continue
                    twin.begin()
                    got_n = self.place_exact(twin, job.name, shape, gpus, "look ahead")
                    twin.rollback()
                    if got_n is not None:
                        first_narrow = (max(t, self.now_s), Shape(len(got_n), got_n[0].profile), got_n)
                        break
            if not self.may_fit(twin, full, gpus):
                continue
            twin.begin()
            got = self.fit(twin, job, gpus, "look ahead")
            twin.rollback()
            if got is not None:
                t_full = max(t, self.now_s)
                if first_narrow is not None and first_narrow[0] < t_full:
                    at, shape, where = first_narrow
                    if self.narrow_pays(job, nominal, self.speed(job, shape), start_s=at, nominal_s=t_full):
                        return self._narrow_reservation(job, at, shape, where)
                # Reserved at its nominal shape, the head is held to it: a backfill that leaves it only a spread at
                # its start would slow it down, or (when the spread does not pay then) delay it past its start.
                held = rigid(job) if got[0] == nominal else job
                return Reservation(job.name, t_full, frozenset(i.gpu for i in got[1]), held)
        if first_narrow is not None:
            return self._narrow_reservation(job, *first_narrow)
        return None

    def _releasing(self, twin: Scratch) -> Iterator[float]:
        """Release the running jobs on ``twin`` (a copy) in the order they are expected to end, every job ending at
        one time together, yielding each such time once its jobs are gone."""
        order = sorted((t, name) for name, t in self.ends.items() if name in twin.jobs and t < _INF)
        i = 0
        while i < len(order):
            t = order[i][0]
            while i < len(order) and order[i][0] == t:
                twin.release(order[i][1])
                i += 1
            yield t

    @staticmethod
    def _narrow_reservation(job: JobRequest, at: float, shape: Shape, where: tuple[Instance, ...]) -> Reservation:
        n = shape.ranks
        held = replace(rigid(job), need=RankNeed(profile=shape.profile.name), ranks=n, min_ranks=n, max_ranks=n)
        return Reservation(job.name, at, frozenset(i.gpu for i in where), held)

    def may_fit(self, scratch: Scratch, shapes: Sequence[Shape], gpus: Sequence[int]) -> bool:
        """A cheap necessary condition for one of ``shapes`` to fit on ``gpus`` (subclasses may sharpen it)."""
        return any(scratch.room(shape.profile, gpus) >= shape.ranks for shape in shapes)

    def keeps_head(self, reservation: Reservation, extra: Mapping[str, float]) -> bool:
        """True when the head of ``reservation`` still fits at its start with what this pass placed, where
        ``extra`` gives end times of jobs placed but not yet in :attr:`ends`: every job ending by then is released
        on a copy, and the head is fitted there in the shape it was reserved as (:meth:`shadow`: its nominal
        shape; nominal or a spread; or its narrow shape)."""
        head = reservation.request
        if head is None or reservation.start_s == _INF:
            return True
        t = reservation.start_s
        if all(end <= t for end in extra.values()):
            return True
        twin = self.scratch.fork()
        for name, end in (*self.ends.items(), *extra.items()):
            if end <= t and name in twin.jobs:
                twin.release(name)
        gpus = twin.usable_gpus()
        return self.fit(twin, head, gpus, "look ahead") is not None

    def fit(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place ``job`` on ``scratch`` using ``gpus`` at its nominal shape or a spread (:meth:`fit_nominal`); None and
        no change when it does not fit."""
        return self.fit_nominal(scratch, job, gpus, reason)

    def fit_narrow(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place the malleable ``job`` narrow: the narrow shape with the most compute that fits (and, on the plan's
        own scratch, pays); None and no change when none does."""
        shapes = self.shapes(job)
        nominal = shapes[0]
        live = scratch is self.scratch
        for shape in shapes[1:]:
            if shape.compute_slices >= nominal.compute_slices:
                continue
            if not self.may_fit(scratch, (shape,), gpus):
                continue
            if live and not self.narrow_pays(job, nominal, self.speed(job, shape)):
                continue
            placed = self.place_exact(scratch, job.name, shape, gpus, reason)
            if placed is not None:
                return Shape(len(placed), placed[0].profile), placed
        return None

    def fit_nominal(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place ``job`` at its nominal shape (or, for policies that spread, a spread); None and no change if not."""
        raise NotImplementedError

    def place_exact(
        self, scratch: Scratch, owner: str, shape: Shape, gpus: Sequence[int], reason: str
    ) -> tuple[Instance, ...] | None:
        """``shape.ranks`` ranks of one profile (``shape.profile`` or, where the policy allows, one covering it) for
        ``owner`` on ``gpus``; None and no change when they do not all fit."""
        raise NotImplementedError

    def exhausted(self) -> bool:
        """No usable GPU could take a rank of any job now (:meth:`gpu_open`); answered from a :class:`GpuTally`, so
        asking after every job of a long queue costs what changed since, not every GPU again."""
        if self._open is None:
            self._open = GpuTally(self.scratch, lambda g: int(self.gpu_open(g)))
        return self._open.total() == 0

    def gpu_open(self, gpu: int) -> bool:
        """Could ``gpu`` take a rank of some job now? Here: it has a free instance (subclasses add other ways)."""
        return bool(self.scratch.free_instances(gpu))

    # -------------------------------------------------------------------------------------- narrow starts
    def nominal_start(self, nominal: Shape) -> float:
        """When ``nominal`` first fits as the running jobs end in order, ignoring the queue (infinity if never);
        memoised for the pass."""
        key = (nominal.profile.profile_id, nominal.ranks)
        got = self._nominal_start.get(key)
        if got is None:
            got = self._nominal_start[key] = self._earliest(nominal)
        return got

    def _earliest(self, shape: Shape) -> float:
        twin = self.scratch.fork()
        gpus = twin.usable_gpus()
        n = shape.ranks
        probe = JobRequest("\x00probe", RankNeed(profile=shape.profile.name), ranks=n, min_ranks=n, max_ranks=n)
        for t in self._releasing(twin):
            if not self.may_fit(twin, (shape,), gpus):
                continue
            twin.begin()
            got = self.fit_nominal(twin, probe, gpus, "look ahead")
            twin.rollback()
            if got is not None:
                return t
        return _INF

    def narrow_pays(
        self,
        job: JobRequest,
        nominal: Shape,
        speed: float,
        *,
        start_s: float | None = None,
        nominal_s: float | None = None,
    ) -> bool:
        """Should ``job`` start narrow at ``start_s`` (now), at ``speed``, rather than wait for its nominal shape
        until ``nominal_s`` (by default when the running jobs ending first leave room for it, ignoring the queue)?
        The rule and the model are :mod:`flexmig.plan.narrow`'s."""
        case = self.narrow_case(job, nominal, speed, start_s=start_s, nominal_s=nominal_s)
        return case is None or case.pays(self.settings.gain_ratio)

    def narrow_case(
        self,
        job: JobRequest,
        nominal: Shape,
        speed: float,
        *,
        start_s: float | None = None,
        nominal_s: float | None = None,
    ) -> NarrowCase | None:
        """The model's figures for starting ``job`` narrow (None: its run time is unknown)."""
        return narrow_case(
            job.expected_runtime_s,
            speed,
            start_s=self.now_s if start_s is None else start_s,
            nominal_s=self.nominal_start(nominal) if nominal_s is None else nominal_s,
            settling_s=self.settings.settling_s,
            move_cost_s=self.settings.move_cost(job.move_cost_s, standby=job.standby),
        )


class FlexPlacer(BasePlacer):
    """The flex rules: nominal anywhere (creating around held instances), else the best spread, else narrow."""

    def gpu_open(self, gpu: int) -> bool:
        """A free instance, or room to create the smallest instance around the held ones."""
        if super().gpu_open(gpu):
            return True
        smallest = min(self.model.plain_profiles, key=lambda p: (p.compute_slices, p.memory_slices))
        return self.scratch.room(smallest, (gpu,)) > 0

    def fit_nominal(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
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

    def place_exact(
        self, scratch: Scratch, owner: str, shape: Shape, gpus: Sequence[int], reason: str
    ) -> tuple[Instance, ...] | None:
        """``shape.ranks`` instances of exactly ``shape.profile``, the flex way (reused or created around held
        instances)."""
        profile, count = shape.profile, shape.ranks
        if scratch.room(profile, gpus) < count:
            return None
        got = scratch.place_shape(owner, Shape(count, profile), self.weights, gpus, reason, exact=True)
        return None if got is None else got[0]

    def _spread_pays(self, job: JobRequest, nominal: Shape) -> bool:
        """Would spreading ``job`` now end it sooner than waiting for its nominal shape?

        Spread now, it ends at ``now + R / e``; nominal, no earlier than when the running jobs ending first leave
        room for it, ``t_n + R``. Spread only when ``t_n - now > R (1/e - 1)``: a spread also holds its slices
        longer, so a short wait is the better use of the node. Unknown run times: spread.
        """
        runtime = job.expected_runtime_s
        if runtime is None:
            return True
        t_n = self.nominal_start(nominal)
        return t_n - self.now_s > runtime * (1.0 / self.settings.spread_efficiency - 1.0)


def _reserved_gpus(reservation: Reservation | None) -> frozenset[int]:
    if reservation is None or not isinstance(reservation.token, frozenset):
        return frozenset()
    return frozenset(g for g in reservation.token if isinstance(g, int))
