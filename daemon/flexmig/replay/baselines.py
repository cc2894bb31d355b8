"""The placers of the MIG baselines, built as strong as their rules allow.

* **static**: the layout never changes. A rank takes the smallest free instance that covers its profile (best
  fit), on a busy GPU before an idle one.
* **drain** (mig-parted / GPU Operator / nos kind, at its strongest): a busy GPU is never reconfigured. A rank
  takes a free instance only on a *busy* GPU (the smallest that covers it, lowest GPU and start first); when there
  is none, an *idle* GPU is re-laid out for it with instances of exactly the waiting jobs' profiles: the rank's
  own (and the job's other ranks'), then, in queue order, those of the other waiting jobs that still fit, and the
  free space left is filled with the largest instances that fit. Later jobs then find instances of their profile
  ready on that GPU while it is busy. Of the idle GPUs, the one needing the fewest create/destroy steps is taken
  (then the lowest index). An idle GPU's existing instances are never used as they are for a job they do not
  match: a 1g job does not take an idle GPU's 7g.
* **drain-first-fit** (drain as flexmig first had it, kept for comparison): a rank takes any free instance that
  covers it, idle GPUs included (so one 7g per idle GPU serves any job), and an idle GPU is re-laid out only when
  no covering instance is free anywhere, as the maximal layout holding the rank's profile whose other instances
  are worth most to the demand mix.

Within a layout being built, each instance goes at the highest start its profile allows (small instances at the
top, so the low slices stay free for large ones). None of the baselines spreads a job over smaller instances, and
none migrates; with malleable jobs they may start them narrow (fewer ranks of the nominal profile) and grow them
back, by the same rules as flex (:mod:`flexmig.plan.placer`, :mod:`flexmig.plan.grow`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from flexmig.mig.catalogue import Profile
from flexmig.mig.layout import Layout
from flexmig.plan.geometry import Geometry, LayoutKey
from flexmig.plan.placer import BasePlacer, Placed, PlacerInputs
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape, covers
from flexmig.plan.types import Instance, JobRequest

__all__ = ["DrainFirstFitPlacer", "DrainPlacer", "StaticPlacer", "target_layout"]

_WAITING_LOOKED_AT = 32  # waiting jobs whose profiles a re-laid GPU is built for


def _existing(scratch: Scratch, profile: Profile, gpus: Sequence[int], *, busy_only: bool = False) -> Instance | None:
    """A free instance of exactly ``profile``: on a busy GPU first, then (unless ``busy_only``) an idle one;
    then the lowest GPU and start."""
    best: tuple[tuple[bool, int, int], Instance] | None = None
    for g in gpus:
        idle = scratch.is_idle(g)
        if idle and busy_only:
            continue
        for inst in scratch.free_instances(g):
            if inst.profile != profile:
                continue
            key = (idle, g, inst.start)
            if best is None or key < best[0]:
                best = (key, Instance(g, inst.start, profile))
    return None if best is None else best[1]


def _covering(scratch: Scratch, profile: Profile) -> list[Profile]:
    """Profiles whose instances can host a rank of ``profile``, smallest first."""
    return sorted(
        (p for p in scratch.geo.profiles if covers(p, profile)), key=lambda p: (p.compute_slices, p.memory_slices)
    )


def _on_covering(scratch: Scratch, owner: str, shape: Shape, gpus: Sequence[int]) -> tuple[Instance, ...] | None:
    """``shape.ranks`` free instances for ``owner`` of the smallest profile covering ``shape.profile`` that has room
    for them all; None and no change when none has."""
    for p in _covering(scratch, shape.profile):
        got = _ranks_on(scratch, owner, p, shape.ranks, gpus)
        if got is not None:
            return got
    return None


def _ranks_on(
    scratch: Scratch,
    owner: str,
    profile: Profile,
    ranks: int,
    gpus: Sequence[int],
    *,
    busy_only: bool = False,
    fallback: Callable[[Scratch, Profile, Sequence[int], int], Instance | None] | None = None,
) -> tuple[Instance, ...] | None:
    """``ranks`` instances of one profile for ``owner``: free ones of ``profile``, then ``fallback`` (given the
    ranks still to place); None and no change when they do not all fit."""
    scratch.begin()
    placed: list[Instance] = []
    for n in range(ranks):
        inst = _existing(scratch, profile, gpus, busy_only=busy_only)
        if inst is None and fallback is not None:
            inst = fallback(scratch, profile, gpus, ranks - n)
        if inst is None:
            scratch.rollback()
            return None
        scratch.hold(owner, (inst,))
        placed.append(inst)
    scratch.commit()
    return tuple(placed)


def target_layout(geo: Geometry, wanted: Iterable[Profile]) -> Layout:
    """The layout strong drain gives an idle GPU: ``wanted`` instances in order, each at the highest start it may
    take, skipping those that no longer fit; then the largest instances that still fit (most compute, then most
    memory), until none does."""
    key: LayoutKey = ()
    for p in wanted:
        if not any(geo.capacities(key)):
            break  # full: nothing more fits
        starts = geo.starts(key, p)
        if starts:
            key = geo.add(key, p, max(starts))
    fill = sorted(geo.profiles, key=lambda p: (-p.compute_slices, -p.memory_slices))
    placed = True
    while placed:
        placed = False
        for p in fill:
            starts = geo.starts(key, p)
            if starts:
                key = geo.add(key, p, max(starts))
                placed = True
                break
    return geo.layout(key)


class StaticPlacer(BasePlacer):
    """Fixed layouts: free instances only, best fit (the smallest profile that covers the rank and has room for
    every rank; all ranks of a job share one profile)."""

    def fit_nominal(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place every rank on a free covering instance, or nothing."""
        shape = scratch.geo.nominal(job)
        got = self.place_exact(scratch, job.name, shape, gpus, reason)
        return None if got is None else (shape, got)

    def place_exact(
        self, scratch: Scratch, owner: str, shape: Shape, gpus: Sequence[int], reason: str
    ) -> tuple[Instance, ...] | None:
        """``shape.ranks`` free instances of the smallest profile covering ``shape.profile`` that has room for all."""
        return _on_covering(scratch, owner, shape, gpus)


class DrainPlacer(BasePlacer):
    """Strong drain: free instances on busy GPUs; else an idle GPU re-laid out for the waiting jobs."""

    def __init__(self, inputs: PlacerInputs) -> None:
        super().__init__(inputs)
        self._started_names: set[str] = set()
        self._targets: dict[tuple[object, ...], Layout] = {}

    def gpu_open(self, gpu: int) -> bool:
        """A free instance on a busy GPU, or an idle GPU to re-lay out."""
        return self.scratch.is_idle(gpu) or bool(self.scratch.free_instances(gpu))

    def _started(self, job: JobRequest, shape: Shape, instances: tuple[Instance, ...]) -> None:
        self._started_names.add(job.name)
        super()._started(job, shape, instances)

    def _wanted(self, owner: str, profile: Profile, ranks_left: int) -> list[Profile]:
        """The owner's ranks still to place, then the other waiting jobs' ranks in queue order."""
        wanted = [profile] * ranks_left
        looked = 0
        for req in self.queue:
            if req.name == owner or req.name in self._started_names or req.name in self.scratch.jobs:
                continue
            looked += 1
            if looked > _WAITING_LOOKED_AT:
                break
            shape = self.scratch.geo.nominal(req)
            wanted += [shape.profile] * shape.ranks
        return wanted

    def _relayout(self, owner: str) -> Callable[[Scratch, Profile, Sequence[int], int], Instance | None]:
        def relayout(scratch: Scratch, profile: Profile, gpus: Sequence[int], ranks_left: int) -> Instance | None:
            idle = [g for g in gpus if scratch.is_idle(g)]
            if not idle:
                return None
            wanted = self._wanted(owner, profile, ranks_left)
            key = tuple(p.profile_id for p in wanted)
            target = self._targets.get(key)
            if target is None:
                target = self._targets[key] = target_layout(scratch.geo, wanted)
            want = {(i.start, i.profile.profile_id) for i in target}

            def steps(g: int) -> int:
                have = {(i.start, i.profile.profile_id) for i in scratch.layouts[g]}
                return len(have - want) + len(want - have)

            g = min(idle, key=lambda g: (steps(g), g))
            why = f"drain: re-lay out idle GPU {g} as {target.spec()}"
            for inst in list(scratch.layouts[g].instances):
                if (inst.start, inst.profile.profile_id) not in want:
                    scratch.destroy(g, inst.start, why)
            for inst in target:
                if scratch.layouts[g].at(inst.start) is None:
                    scratch.ensure(g, inst.profile, inst.start, why)
            start = max(i.start for i in target if i.profile == profile)
            return Instance(g, start, profile)

        return relayout

    def fit_nominal(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Every rank on a free covering instance of a busy GPU; else on idle GPUs re-laid out for the queue."""
        shape = scratch.geo.nominal(job)
        got = self.place_exact(scratch, job.name, shape, gpus, reason)
        return None if got is None else (Shape(len(got), got[0].profile), got)

    def place_exact(
        self, scratch: Scratch, owner: str, shape: Shape, gpus: Sequence[int], reason: str
    ) -> tuple[Instance, ...] | None:
        """``shape.ranks`` ranks: on free instances of busy GPUs (exactly ``shape.profile``, then the smallest
        covering one), else of ``shape.profile`` with idle GPUs re-laid out as needed."""
        profile, count = shape.profile, shape.ranks
        for p in _covering(scratch, profile):
            got = _ranks_on(scratch, owner, p, count, gpus, busy_only=True)
            if got is not None:
                return got
        return _ranks_on(scratch, owner, profile, count, gpus, busy_only=True, fallback=self._relayout(owner))


class DrainFirstFitPlacer(BasePlacer):
    """Drain as flexmig first had it: any free covering instance (idle GPUs too); else re-lay out an idle GPU."""

    def gpu_open(self, gpu: int) -> bool:
        """A free instance, or an idle GPU to re-lay out."""
        return self.scratch.is_idle(gpu) or bool(self.scratch.free_instances(gpu))

    _targets: dict[tuple[int, tuple[float, ...]], Layout | None]

    def _target(self, profile: Profile) -> Layout | None:
        """The maximal layout holding ``profile`` whose other instances are worth most to the demand.

        Worth is the demand-weighted compute of the instances besides one of ``profile``; the first of equals
        in :func:`maximal_layouts` order wins. Memoised per profile and weights.
        """
        if not hasattr(self, "_targets"):
            self._targets = {}
        key = (profile.profile_id, self.weights)
        if key in self._targets:
            return self._targets[key]
        index = self.scratch.geo.index
        best: tuple[float, Layout] | None = None
        for lay in self.scratch.geo.maximal_layouts():
            if not any(i.profile == profile for i in lay):
                continue
            worth = sum(self.weights[index[i.profile.profile_id]] * i.profile.compute_slices for i in lay)
            worth -= self.weights[index[profile.profile_id]] * profile.compute_slices
            if best is None or worth > best[0]:
                best = (worth, lay)
        got = None if best is None else best[1]
        self._targets[key] = got
        return got

    def _relayout(self, scratch: Scratch, profile: Profile, gpus: Sequence[int], _ranks_left: int) -> Instance | None:
        idle = [g for g in gpus if scratch.is_idle(g)]
        if not idle:
            return None
        target = self._target(profile)
        if target is None:
            return None
        wanted = {(i.start, i.profile.profile_id) for i in target}

        def steps(g: int) -> int:
            have = {(i.start, i.profile.profile_id) for i in scratch.layouts[g]}
            return len(have - wanted) + len(wanted - have)

        g = min(idle, key=lambda g: (steps(g), g))
        for inst in list(scratch.layouts[g].instances):
            if (inst.start, inst.profile.profile_id) not in wanted:
                scratch.destroy(g, inst.start, f"drain: re-lay out idle GPU {g} as {target.spec()}")
        for inst in target:
            if scratch.layouts[g].at(inst.start) is None:
                scratch.ensure(g, inst.profile, inst.start, f"drain: re-lay out idle GPU {g} as {target.spec()}")
        start = min(i.start for i in target if i.profile == profile)
        return Instance(g, start, profile)

    def fit_nominal(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place every rank on free covering instances (as static does); else on freshly re-laid-out idle GPUs."""
        shape = scratch.geo.nominal(job)
        got = self.place_exact(scratch, job.name, shape, gpus, reason)
        return None if got is None else (Shape(len(got), got[0].profile), got)

    def place_exact(
        self, scratch: Scratch, owner: str, shape: Shape, gpus: Sequence[int], reason: str
    ) -> tuple[Instance, ...] | None:
        """Free covering instances anywhere (smallest first); else ``shape.profile`` on re-laid-out idle GPUs."""
        got = _on_covering(scratch, owner, shape, gpus)
        if got is not None:
            return got
        return _ranks_on(scratch, owner, shape.profile, shape.ranks, gpus, fallback=self._relayout)
