"""The placers of the two MIG baselines, built as strong as their rules allow.

* **static**: the layout never changes. A rank takes the smallest free instance that covers its profile (best
  fit), on a busy GPU before an idle one.
* **drain** (mig-parted / GPU Operator / nos kind): a busy GPU is never reconfigured. A rank takes a free instance
  that covers it, as static does; when none is free, an *idle* GPU is re-laid out for it: the whole GPU gets the
  maximal layout that holds the rank's profile and whose other instances best serve the demand (the profile mix
  of the running and waiting jobs), so that later jobs find instances ready on that GPU while it is busy. Of the
  idle GPUs, the one needing the fewest create/destroy steps is taken.

Neither spreads a job over several instances (one rank per instance of the nominal shape: the conventional
one-to-one allocation), and neither migrates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flexmig.mig.catalogue import Profile
from flexmig.mig.layout import Layout
from flexmig.plan.placer import BasePlacer, Placed
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import covers
from flexmig.plan.types import Instance, JobRequest

__all__ = ["DrainPlacer", "StaticPlacer"]


def _existing(scratch: Scratch, profile: Profile, gpus: Sequence[int]) -> Instance | None:
    """A free instance of exactly ``profile``: on a busy GPU first, then the lowest GPU and start."""
    best: tuple[tuple[bool, int, int], Instance] | None = None
    for g in gpus:
        idle = scratch.is_idle(g)
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


def _ranks_on(
    scratch: Scratch,
    owner: str,
    profile: Profile,
    ranks: int,
    gpus: Sequence[int],
    *,
    fallback: Callable[[Scratch, Profile, Sequence[int]], Instance | None] | None = None,
) -> tuple[Instance, ...] | None:
    """``ranks`` instances of one profile for ``owner``: free ones of ``profile``, then ``fallback`` (if any)."""
    scratch.begin()
    placed: list[Instance] = []
    for _ in range(ranks):
        inst = _existing(scratch, profile, gpus)
        if inst is None and fallback is not None:
            inst = fallback(scratch, profile, gpus)
        if inst is None:
            scratch.rollback()
            return None
        scratch.hold(owner, (inst,))
        placed.append(inst)
    scratch.commit()
    return tuple(placed)


class StaticPlacer(BasePlacer):
    """Fixed layouts: free instances only, best fit (the smallest profile that covers the rank and has room for
    every rank; all ranks of a job share one profile)."""

    def fit(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place every rank on a free covering instance, or nothing."""
        shape = scratch.geo.nominal(job)
        for profile in _covering(scratch, shape.profile):
            got = _ranks_on(scratch, job.name, profile, shape.ranks, gpus)
            if got is not None:
                return shape, got
        return None


class DrainPlacer(BasePlacer):
    """Free instances first; else re-lay out an idle GPU for the rank."""

    def exhausted(self) -> bool:
        """No free instance and no idle GPU."""
        return super().exhausted() and not any(self.scratch.is_idle(g) for g in self.scratch.usable_gpus())

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

    def _relayout(self, scratch: Scratch, profile: Profile, gpus: Sequence[int]) -> Instance | None:
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

    def fit(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place every rank on free covering instances (as static does); else on freshly re-laid-out idle GPUs."""
        shape = scratch.geo.nominal(job)
        for profile in _covering(scratch, shape.profile):
            got = _ranks_on(scratch, job.name, profile, shape.ranks, gpus)
            if got is not None:
                return shape, got
        got = _ranks_on(scratch, job.name, shape.profile, shape.ranks, gpus, fallback=self._relayout)
        return None if got is None else (shape, got)
