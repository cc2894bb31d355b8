"""Stranded capacity: what the running instances would leave room for if they were packed tightly.

Definitions (per GPU, over every profile ``p`` of the model):

* ``creatable_now(p)``: how many instances of ``p`` alone could be created on the GPU as it is
  (``Layout.creatable``, what NVML's remaining-capacity query answers);
* ``creatable_repacked(p)``: the most instances of ``p`` that could be created if the same running instances (the
  same multiset of profiles) sat at other valid starts, the best arrangement for ``p``. The search is exhaustive
  over every valid arrangement, which is cheap: at most seven instances on eight memory slices;
* ``stranded(p) = creatable_repacked(p) - creatable_now(p)`` (never negative: the current layout is one of the
  arrangements);
* the GPU's *stranded compute slices* are ``max_p stranded(p) * compute_slices(p)``: the most compute slices that
  repacking would make usable by one profile (the maximum, not the sum, since repacking for one profile may not
  serve another), and its *stranded score* is that over the GPU's compute slices (0..1).

Worked example (H200): ``2g.35gb@0 + 1g.18gb@4`` leaves memory slices 2, 3, 5, 6, 7 and four compute slices free,
yet no 3g fits (a 3g starts only at 0 or 4) and no 4g (only at 0). Repacked as ``2g.35gb@0 + 1g.18gb@2``, slices
4-7 host a 3g; as ``2g.35gb@4 + 1g.18gb@6``, slices 0-3 host a 4g, or two 2g where one fits now. So
``stranded(3g) = stranded(4g) = stranded(2g) = 1``; stranded compute slices ``max(3, 4, 2) = 4``, score 4/7.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from flexmig.mig import GpuModel, Layout, Profile

__all__ = ["RepackKey", "StrandedCapacity", "arrangements", "repack_key", "repacked_capacity", "stranded_capacity"]

RepackKey = tuple[str, tuple[str, ...]]
"""(model key, sorted profile names): everything the repacked capacity of a layout depends on."""


@dataclass(frozen=True, slots=True)
class StrandedCapacity:
    """For one profile on one GPU: how many could be created now, and after the best repacking."""

    profile: str
    compute_slices: int
    creatable_now: int
    creatable_repacked: int

    @property
    def stranded(self) -> int:
        """Instances of this profile that only the placement of the running instances prevents."""
        return self.creatable_repacked - self.creatable_now

    @property
    def stranded_compute_slices(self) -> int:
        """``stranded * compute_slices``."""
        return self.stranded * self.compute_slices


def repack_key(layout: Layout) -> RepackKey:
    """What :func:`repacked_capacity` depends on; callers that memoise it key by this."""
    return (layout.model.key, tuple(sorted(i.profile.name for i in layout)))


def arrangements(model: GpuModel, profiles: Sequence[Profile]) -> Iterator[Layout]:
    """Every valid layout of ``model`` holding exactly ``profiles`` (a multiset), each once.

    Larger instances are placed first (they have the fewest starts, which prunes early); equal profiles take
    ascending starts, so permutations of identical instances are not visited twice.
    """
    items = sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))

    def walk(layout: Layout, i: int, lowest: int) -> Iterator[Layout]:
        if i == len(items):
            yield layout
            return
        p = items[i]
        floor = lowest if i and items[i - 1] == p else 0
        for s in layout.placements(p):
            if s >= floor:
                yield from walk(layout.place(p, s), i + 1, s)

    yield from walk(Layout.empty(model), 0, 0)


def repacked_capacity(layout: Layout) -> Mapping[str, int]:
    """For every profile of the model, the most instances creatable over all arrangements of ``layout``'s
    instances."""
    best = {p.name: 0 for p in layout.model.profiles}
    for arranged in arrangements(layout.model, [i.profile for i in layout]):
        for p in layout.model.profiles:
            if best[p.name] < p.max_instances:
                best[p.name] = max(best[p.name], arranged.creatable(p))
    return MappingProxyType(best)


def stranded_capacity(layout: Layout, repacked: Mapping[str, int] | None = None) -> tuple[StrandedCapacity, ...]:
    """Per profile of the model, creatable now versus after repacking (``repacked`` if the caller memoised it)."""
    best = repacked_capacity(layout) if repacked is None else repacked
    out = []
    for p in layout.model.profiles:
        now = layout.creatable(p)
        out.append(StrandedCapacity(p.name, p.compute_slices, now, max(now, best[p.name])))
    return tuple(out)
