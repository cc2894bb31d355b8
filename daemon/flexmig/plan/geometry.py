"""Cached placement geometry of one GPU model, keyed by the instances that are *held* on a GPU.

The planner asks the same questions thousands of times per plan (where can a 3g go on a GPU holding a 1g at 2
and a 2g at 4? how many 7g could still be created?), so the answers are memoised per layout key. A key is the
sorted tuple of ``(start, profile ID)`` of the instances; two GPUs with the same held instances share answers.
The cache belongs to one :class:`Geometry` object (one per planner or replay), never to the module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.enumerate import maximal_layouts
from flexmig.mig.layout import Layout

if TYPE_CHECKING:
    from flexmig.plan.shapes import Shape
    from flexmig.plan.types import JobRequest

__all__ = ["Geometry", "LayoutKey", "demand_weights"]

LayoutKey = tuple[tuple[int, int], ...]


class Geometry:
    """Memoised placement answers for ``model``'s plain profiles."""

    def __init__(self, model: GpuModel) -> None:
        self.model = model
        self.profiles: tuple[Profile, ...] = model.plain_profiles
        self._by_id = {p.profile_id: p for p in model.profiles}
        self._layouts: dict[LayoutKey, Layout] = {}
        self._caps: dict[LayoutKey, tuple[int, ...]] = {}
        self._starts: dict[tuple[LayoutKey, int], tuple[int, ...]] = {}
        self._added: dict[tuple[LayoutKey, int, int], LayoutKey] = {}
        self._values: dict[tuple[float, ...], dict[LayoutKey, float]] = {}
        self.index = {p.profile_id: k for k, p in enumerate(self.profiles)}
        self._shapes: dict[tuple[object, ...], tuple[Shape, ...]] = {}
        self._maximal: tuple[Layout, ...] | None = None

    def add(self, key: LayoutKey, profile: Profile, start: int) -> LayoutKey:
        """The key with ``profile`` at ``start`` added (the caller has checked it fits)."""
        k = (key, profile.profile_id, start)
        got = self._added.get(k)
        if got is None:
            got = tuple(sorted((*key, (start, profile.profile_id))))
            self._added[k] = got
        return got

    @staticmethod
    def drop(key: LayoutKey, start: int) -> LayoutKey:
        """The key without the instance at ``start``."""
        return tuple(item for item in key if item[0] != start)

    def layout(self, key: LayoutKey) -> Layout:
        """The layout of ``key`` (built once)."""
        lay = self._layouts.get(key)
        if lay is None:
            lay = Layout.of(self.model, ((self._by_id[pid], start) for start, pid in key))
            self._layouts[key] = lay
        return lay

    def starts(self, key: LayoutKey, profile: Profile) -> tuple[int, ...]:
        """Starts at which ``profile`` can be created on a GPU holding exactly ``key``."""
        k = (key, profile.profile_id)
        got = self._starts.get(k)
        if got is None:
            got = self.layout(key).placements(profile)
            self._starts[k] = got
        return got

    def capacities(self, key: LayoutKey) -> tuple[int, ...]:
        """How many of each plain profile (in ``self.profiles`` order) could still be created, each alone."""
        got = self._caps.get(key)
        if got is None:
            lay = self.layout(key)
            got = tuple(lay.creatable(p) for p in self.profiles)
            self._caps[key] = got
        return got

    def value(self, key: LayoutKey, weights: tuple[float, ...]) -> float:
        """Demand-weighted usable capacity, in compute slices: ``sum_m w_m * creatable_m * compute_m``.

        This is FGD's fragmentation measure (Weng et al., ATC '23) turned around: FGD counts the free capacity a
        typical request cannot use; this counts what each request shape *can* use, weighted by how popular the
        shape is. A placement that lowers it least leaves the GPU most useful for the demand to come.
        """
        table = self._values.get(weights)
        if table is None:
            if len(self._values) >= 8:  # weights change from plan to plan; keep the recent ones only
                self._values.pop(next(iter(self._values)))
            table = self._values[weights] = {}
        got = table.get(key)
        if got is None:
            caps = self.capacities(key)
            got = sum(w * c * p.compute_slices for w, c, p in zip(weights, caps, self.profiles, strict=True))
            table[key] = got
        return got

    def maximal_layouts(self) -> tuple[Layout, ...]:
        """:func:`flexmig.mig.maximal_layouts` over the plain profiles (computed once)."""
        if self._maximal is None:
            self._maximal = tuple(maximal_layouts(self.model))
        return self._maximal

    def shapes(self, request: JobRequest, *, resplit: bool, malleable: bool = False) -> tuple[Shape, ...]:
        """:func:`flexmig.plan.shapes.shapes_for`, memoised by the request's shape fields."""
        narrow = malleable and request.malleable
        k = (
            request.need,
            request.ranks,
            request.min_ranks,
            request.max_ranks,
            request.rank_memory_mib,
            resplit,
            narrow,
        )
        got = self._shapes.get(k)
        if got is None:
            from flexmig.plan.shapes import shapes_for  # noqa: PLC0415 - shapes imports types, which is heavier

            got = self._shapes[k] = shapes_for(self.model, request, resplit=resplit, malleable=narrow)
        return got

    def nominal(self, request: JobRequest) -> Shape:
        """The request's nominal shape (memoised)."""
        return self.shapes(request, resplit=False)[0]

    def room(self, key: LayoutKey, profile: Profile) -> int:
        """How many ``profile`` instances fit around the held instances ``key`` (free ones may be destroyed)."""
        index = self.index.get(profile.profile_id)
        if index is None:
            return self.layout(key).creatable(profile)
        return self.capacities(key)[index]


def demand_weights(geometry: Geometry, counts: Mapping[str, float], floor: float = 1.0) -> tuple[float, ...]:
    """Popularity weights of the plain profiles (summing to 1) from ``counts`` by profile name, plus ``floor``.

    The floor keeps every shape's capacity worth something when the demand seen so far never asked for it.
    """
    raw = [counts.get(p.name, 0.0) + floor for p in geometry.profiles]
    total = sum(raw)
    return tuple(r / total for r in raw)
