"""The expected mix of requested profiles, which the external fragmentation score is weighted by.

A mix is a set of *shapes* with weights. A shape is either a compute size (``3g``: the plain profile with three
compute slices and the fewest memory slices on the GPU's model) or an exact profile name (``1g.35gb``), so one mix
serves a node of any model. Weights need not sum to one; they are normalised per GPU over the shapes that GPU's
model knows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from flexmig.detect.settings import FragmentationSettings
from flexmig.mig import GpuModel, Profile

__all__ = ["DemandMix", "demand_from_requests"]

_SIZE = re.compile(r"^(?P<g>[1-7])g$")


@dataclass(frozen=True, slots=True)
class DemandMix:
    """Shapes of requests and their relative weights (the "target workload" of FGD, Weng et al., ATC '23)."""

    weights: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if any(w < 0 for _, w in self.weights):
            raise ValueError("demand mix: weights must be >= 0")
        if sum(w for _, w in self.weights) <= 0:
            raise ValueError("demand mix: needs at least one shape with a positive weight")

    def resolve(self, model: GpuModel) -> tuple[tuple[Profile, float], ...]:
        """The mix as ``model``'s profiles with weights summing to 1; shapes the model lacks are left out."""
        merged: dict[Profile, float] = {}
        for shape, w in self.weights:
            p = _profile_of(model, shape)
            if p is not None and w > 0:
                merged[p] = merged.get(p, 0.0) + w
        total = sum(merged.values())
        if total <= 0:
            return ()
        return tuple(
            sorted(((p, w / total) for p, w in merged.items()), key=lambda pw: (pw[0].compute_slices, pw[0].name))
        )


def _profile_of(model: GpuModel, shape: str) -> Profile | None:
    m = _SIZE.match(shape)
    try:
        return model.profile_for_slices(int(m.group("g"))) if m else model.profile(shape)
    except KeyError:
        return None


def demand_from_requests(
    requests: Iterable[tuple[float, str]], now: float, settings: FragmentationSettings
) -> DemandMix:
    """The mix learned from recent requests: ``(time, shape)`` pairs within ``settings.demand_window_s`` of ``now``,
    added to the configured mix scaled to ``settings.demand_prior_weight`` requests (so a handful of requests nudge
    the mix and many requests dominate it)."""
    counts = Counter(shape for at, shape in requests if now - settings.demand_window_s <= at <= now)
    total = sum(w for _, w in settings.demand)
    merged: dict[str, float] = {}
    for shape, w in settings.demand:
        merged[shape] = merged.get(shape, 0.0) + settings.demand_prior_weight * w / total
    for shape, n in counts.items():
        merged[shape] = merged.get(shape, 0.0) + n
    return DemandMix(tuple(sorted(merged.items())))
