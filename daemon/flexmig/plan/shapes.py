"""Rank shapes: which profile a request needs, how an elastic job may be spread, and how fast it then runs.

A *shape* is ``(ranks, profile)``: one rank per instance, every rank of one profile. A job's nominal shape is
``(request.ranks, profile_for_need(...))``. An elastic job (``min_ranks < max_ranks``) may also run as any shape
whose compute covers the nominal compute, with the same memory per rank (or at least ``rank_memory_mib``):
flexmig never gives a job less compute than it asked for, so a spread never runs slower than
``spread_efficiency`` of nominal and never faster than nominal.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.need import fitting_profile
from flexmig.plan.types import JobRequest, PlannerSettings, RankNeed

__all__ = ["Shape", "covers", "nominal_shape", "profile_for_need", "shapes_for", "speed_of"]


@dataclass(frozen=True, slots=True)
class Shape:
    """``ranks`` ranks of ``profile``, one per instance."""

    ranks: int
    profile: Profile

    @property
    def compute_slices(self) -> int:
        """Compute slices the whole shape holds."""
        return self.ranks * self.profile.compute_slices


def profile_for_need(model: GpuModel, need: RankNeed) -> Profile:
    """The profile one rank of ``need`` gets on ``model``.

    A named profile is taken as is. Otherwise the smallest plain profile with at least ``compute_slices`` compute
    slices and ``memory_mib`` memory, by the one rule of :func:`flexmig.mig.need.fitting_profile`. PlanRejectedError
    when no profile of the model is that large, or the name is unknown.
    """
    if need.profile is not None:
        try:
            return model.profile(need.profile)
        except KeyError as exc:
            raise PlanRejectedError(str(exc.args[0])) from None
    fit = fitting_profile(model, need.memory_mib, need.compute_slices)
    if fit is None:
        raise PlanRejectedError(
            f"no {model.key} profile has {need.compute_slices} compute slice(s) and {need.memory_mib} MiB"
        )
    return fit


def covers(big: Profile, small: Profile) -> bool:
    """True when an instance of ``big`` can host a rank that needs ``small`` (as much compute and memory)."""
    return big.compute_slices >= small.compute_slices and big.memory_mib >= small.memory_mib


def nominal_shape(model: GpuModel, request: JobRequest) -> Shape:
    """The shape the request asks for."""
    return Shape(request.ranks, profile_for_need(model, request.need))


def shapes_for(model: GpuModel, request: JobRequest, *, resplit: bool) -> tuple[Shape, ...]:
    """Every shape the request may run as: the nominal one first, then (elastic jobs, ``resplit`` on) the spreads.

    A spread has ``n`` ranks of ``P`` with ``min_ranks <= n <= max_ranks``, ``n * P.compute >= nominal compute``
    (``n`` the smallest such count), and ``P`` holding ``rank_memory_mib`` (0: any profile will do). Of profiles
    with equal compute only the one with the least memory is offered. Spreads are ordered by wasted compute, then
    by rank count, so the tightest fit comes first.
    """
    nominal = nominal_shape(model, request)
    out = [nominal]
    if not (resplit and request.elastic):
        return tuple(out)
    total = nominal.compute_slices
    spreads: list[Shape] = []
    seen_compute: set[int] = set()
    # Among profiles with equal compute, the one with the least memory (1g.18gb rather than 1g.35gb).
    for p in sorted(model.plain_profiles, key=lambda p: (p.compute_slices, p.memory_slices)):
        if p.memory_mib < request.rank_memory_mib or p.compute_slices in seen_compute:
            continue
        seen_compute.add(p.compute_slices)
        n = max(request.min_ranks, -(-total // p.compute_slices))
        if n > request.max_ranks:
            continue
        shape = Shape(n, p)
        if shape != nominal:
            spreads.append(shape)
    spreads.sort(key=lambda s: (s.compute_slices - total, s.ranks))
    return (*out, *spreads)


def speed_of(model: GpuModel, request: JobRequest, shape: Shape, settings: PlannerSettings) -> float:
    """Speed of ``request`` run as ``shape``, as a fraction of its nominal speed (1.0 or ``spread_efficiency``).

    The nominal shape and any single-instance shape run at full speed; any other multi-rank shape pays the
    spread efficiency (collectives over host shared memory instead of within one instance). Extra compute beyond
    the nominal buys nothing.
    """
    nominal = nominal_shape(model, request)
    if shape == nominal or shape.ranks == 1:
        return 1.0
    return settings.spread_efficiency
