"""Rank shapes: which profile a request needs, how an elastic or malleable job may run, and how fast it then runs.

A *shape* is ``(ranks, profile)``: one rank per instance, every rank of one profile. A job's nominal shape is
``(request.ranks, profile_for_need(...))``. Besides it:

* an *elastic* job (``min_ranks < max_ranks``) may be *spread*: any shape whose compute covers the nominal compute,
  with ranks that hold ``rank_memory_mib``. A spread never gets less compute than asked for, so it runs at
  ``spread_efficiency`` of nominal (collectives between instances over host shared memory) and never faster;
* a *malleable* job (:attr:`~flexmig.plan.types.JobRequest.malleable`) may also run *narrow*, below its nominal
  compute: fewer ranks of its own profile (down to ``min_ranks``), or, for a one-rank elastic job, one or more
  ranks of a smaller profile. A narrow shape runs at the share of the nominal compute it holds (times the spread
  efficiency when it is spread over ranks of another profile).
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.need import fitting_profile
from flexmig.plan.types import JobRequest, PlannerSettings, RankNeed

__all__ = [
    "Shape",
    "covers",
    "narrow_shapes",
    "nominal_shape",
    "profile_for_need",
    "shape_allowed",
    "shapes_for",
    "speed_of",
]


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


def _same_kind(profile: Profile, nominal: Profile) -> bool:
    """A rank of ``profile`` is a rank of ``nominal``: it covers it with the same compute (1g.35gb for 1g.18gb)."""
    return covers(profile, nominal) and profile.compute_slices == nominal.compute_slices


def nominal_shape(model: GpuModel, request: JobRequest) -> Shape:
    """The shape the request asks for."""
    return Shape(request.ranks, profile_for_need(model, request.need))


def _holds(request: JobRequest, profile: Profile) -> bool:
    return profile.memory_mib >= request.rank_memory_mib


def _by_compute(model: GpuModel) -> list[Profile]:
    """Plain profiles, smallest first; of profiles with equal compute only the one with the least memory."""
    out: list[Profile] = []
    seen: set[int] = set()
    for p in sorted(model.plain_profiles, key=lambda p: (p.compute_slices, p.memory_slices)):
        if p.compute_slices not in seen:
            seen.add(p.compute_slices)
            out.append(p)
    return out


def shapes_for(model: GpuModel, request: JobRequest, *, resplit: bool, malleable: bool = False) -> tuple[Shape, ...]:
    """Every shape the request may run as: the nominal one first, then (elastic jobs, ``resplit`` on) the spreads,
    then (malleable jobs, ``malleable`` on) the narrow shapes of :func:`narrow_shapes`.

    A spread has ``n`` ranks of ``P`` with ``min_ranks <= n <= max_ranks``, ``n * P.compute >= nominal compute``
    (``n`` the smallest such count), and ``P`` holding ``rank_memory_mib`` (0: any profile will do). Of profiles
    with equal compute only the one with the least memory is offered. Spreads are ordered by wasted compute, then
    by rank count, so the tightest fit comes first.
    """
    nominal = nominal_shape(model, request)
    out = [nominal]
    if resplit and request.elastic:
        total = nominal.compute_slices
        spreads: list[Shape] = []
        for p in _by_compute(model):
            if not _holds(request, p):
                continue
            n = max(request.min_ranks, -(-total // p.compute_slices))
            if n > request.max_ranks:
                continue
            shape = Shape(n, p)
            if shape != nominal:
                spreads.append(shape)
        spreads.sort(key=lambda s: (s.compute_slices - total, s.ranks))
        out += spreads
    if malleable and request.malleable:
        out += narrow_shapes(model, request, resplit=resplit)
    return tuple(out)


def narrow_shapes(model: GpuModel, request: JobRequest, *, resplit: bool) -> tuple[Shape, ...]:
    """The shapes below the nominal compute that a malleable ``request`` may run as, most compute first.

    * ``k`` ranks of the nominal profile, ``min_ranks <= k < ranks``;
    * for a one-rank elastic job with ``resplit`` on (``min_ranks`` 1): ``n`` ranks of each smaller profile
      ``P`` that holds the rank's memory, ``1 <= n <= max_ranks``, with less compute in all than the nominal one.

    Ties in compute go to fewer ranks (one 4g before two 2g: no spread to pay for).
    """
    if not request.malleable:
        return ()
    nominal = nominal_shape(model, request)
    total = nominal.compute_slices
    out = [Shape(k, nominal.profile) for k in range(request.ranks - 1, request.min_ranks - 1, -1) if k >= 1]
    if request.ranks == 1 and request.min_ranks <= 1 and resplit and request.elastic:
        for p in _by_compute(model):
            if not _holds(request, p) or _same_kind(p, nominal.profile):
                continue
            top = min(request.max_ranks, (total - 1) // p.compute_slices)
            out += [Shape(n, p) for n in range(top, 0, -1)]
    out.sort(key=lambda s: (-s.compute_slices, s.ranks))
    return tuple(out)


def shape_allowed(model: GpuModel, request: JobRequest, shape: Shape) -> bool:
    """True when ``request`` may run as ``shape`` at all (any setting): nominal (or ranks of a profile covering the
    nominal one), a spread, or, for a malleable request, a narrow shape."""
    nominal = nominal_shape(model, request)
    if shape.ranks == nominal.ranks and covers(shape.profile, nominal.profile):
        return True
    if shape in shapes_for(model, request, resplit=True)[1:]:
        return True
    if not request.malleable or not request.min_ranks <= shape.ranks <= max(request.max_ranks, request.ranks):
        return False
    if shape.ranks < nominal.ranks and covers(shape.profile, nominal.profile):
        return True  # fewer of its ranks, on instances that cover them
    if shape.compute_slices >= nominal.compute_slices or not _holds(request, shape.profile):
        return False
    if _same_kind(shape.profile, nominal.profile):
        return True
    return request.ranks == 1 and request.elastic


def speed_of(model: GpuModel, request: JobRequest, shape: Shape, settings: PlannerSettings) -> float:
    """Speed of ``request`` run as ``shape``, as a fraction of its nominal speed (1.0 at most).

    * ranks on instances that cover the nominal rank (its profile, or a larger one) count as nominal ranks: the
      nominal shape runs at 1.0, ``k`` of its ``n`` ranks at ``k / n`` (a DDP job on half its ranks runs at half
      speed), more ranks than nominal no faster; extra compute beyond what a rank asked for buys nothing;
    * ranks of a smaller profile run at the share of the nominal compute they hold, times ``spread_efficiency``
      when there are several of them (collectives over host shared memory instead of within one instance): a
      spread that covers the nominal compute runs at ``spread_efficiency``, one smaller rank at its share.
    """
    nominal = nominal_shape(model, request)
    if covers(shape.profile, nominal.profile):
        if shape.ranks >= nominal.ranks:
            return 1.0
        held = shape.ranks * min(shape.profile.compute_slices, nominal.profile.compute_slices)
        if shape.ranks == 1:
            held = shape.profile.compute_slices
        return min(1.0, held / nominal.compute_slices)
    share = min(1.0, shape.compute_slices / nominal.compute_slices)
    return share if shape.ranks == 1 else share * settings.spread_efficiency
