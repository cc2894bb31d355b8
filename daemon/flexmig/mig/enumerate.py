"""All maximal valid layouts of a GPU model.

A layout is maximal when no further instance of the chosen profiles fits. The search is exhaustive and cheap
(seven placement starts, at most seven instances), so it doubles as ground truth for the planner's tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.layout import Layout

__all__ = ["maximal_layouts"]


def maximal_layouts(model: GpuModel, profiles: Iterable[Profile] | None = None) -> list[Layout]:
    """Every maximal layout of ``model`` built from ``profiles`` (default: the plain profiles, no ``+me``).

    Sorted by descending instance count, then by spec, so the output is stable.
    """
    ps = tuple(model.plain_profiles if profiles is None else profiles)
    seen: set[tuple[tuple[str, int], ...]] = set()
    found: list[Layout] = []

    def walk(layout: Layout, min_start: int) -> None:
        extended = False
        for p in ps:
            for s in layout.placements(p):
                extended = True
                if s < min_start:
                    continue  # reached in another order; canonical order places by ascending start
                walk(layout.place(p, s), s)
        if not extended:
            key = tuple((i.profile.name, i.start) for i in layout.instances)
            if key not in seen:
                seen.add(key)
                found.append(layout)

    walk(Layout.empty(model), 0)
    found.sort(key=lambda lay: (-len(lay), lay.spec()))
    return found
