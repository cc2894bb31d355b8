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

from collections.abc import Sequence

from flexmig.mig.catalogue import Profile
from flexmig.mig.layout import Layout
from flexmig.plan.placer import BasePlacer, Placed
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import covers
from flexmig.plan.types import Instance, JobRequest

__all__ = ["DrainPlacer", "StaticPlacer"]


def _existing(scratch: Scratch, profile: Profile, gpus: Sequence[int]) -> Instance | None:
    """The best free instance covering ``profile``: smallest, on a busy GPU first, then lowest GPU and start."""
    best: tuple[tuple[int, int, bool, int, int], Instance] | None = None
    for g in gpus:
        idle = scratch.is_idle(g)
        for inst in scratch.free_instances(g):
            if not covers(inst.profile, profile):
                continue
            key = (inst.profile.compute_slices, inst.profile.memory_slices, idle, g, inst.start)
            if best is None or key < best[0]:
                best = (key, Instance(g, inst.start, inst.profile))
    return None if best is None else best[1]


class StaticPlacer(BasePlacer):
    """Fixed layouts: free instances only, best fit."""

    def fit(self, scratch: Scratch, job: JobRequest, gpus: Sequence[int], reason: str) -> Placed | None:
        """Place every rank on a free covering instance, or nothing."""
        shape = scratch.geo.nominal(job)
        scratch.begin()
        placed: list[Instance] = []
        for _ in range(shape.ranks):
            inst = _existing(scratch, shape.profile, gpus)
            if inst is None:
                scratch.rollback()
                return None
            scratch.hold(job.name, (inst,))
            placed.append(inst)
        scratch.commit()
        return shape, tuple(placed)


class DrainPlacer(BasePlacer):
    """Free instances first; else re-lay out an idle GPU for the rank."""

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

    def _relayout(self, scratch: Scratch, profile: Profile, gpus: Sequence[int], reason: str) -> Instance | None:
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
        """Place every rank on a free covering instance or a freshly re-laid-out idle GPU, or nothing."""
        shape = scratch.geo.nominal(job)
        scratch.begin()
        placed: list[Instance] = []
        for _ in range(shape.ranks):
            inst = _existing(scratch, shape.profile, gpus) or self._relayout(scratch, shape.profile, gpus, reason)
            if inst is None:
                scratch.rollback()
                return None
            scratch.hold(job.name, (inst,))
            placed.append(inst)
        scratch.commit()
        return shape, tuple(placed)
