"""Yardsticks for a cluster mix's worst cases (``bench/slurm_moves.py``): a tighter lower bound on its makespan than
the packing bound, and an idealised rival no real scheduler can beat under the site's priority order.

The packing bound (``slurm_mix.bound``) spreads all the mix's slice-seconds over the cluster's slices from the first
arrival, as if every job were there at the start and any shape fitted anywhere. Two things it ignores:

* arrivals: work that arrives at ``t`` cannot run before ``t``. :func:`lower_bound` is the largest of the packing
  term, each job's arrival plus its run time, and, for every arrival time ``t``, ``t`` plus the slice-seconds
  arriving at or after ``t`` spread over every slice; and the same for 7g jobs alone, whose work needs whole GPUs
  (``t`` plus the 7g seconds arriving from ``t`` spread over the GPUs). Every term is a true lower bound of any
  schedule's makespan, so their largest is one too.
* shapes and order: :func:`ideal` schedules the mix with free, instant repacking of every running job across all
  GPUs and hosts (a set of jobs fits when its instances can be laid out on the GPUs in some way, whatever runs
  where now; no carving, no registration, no move cost, no start latency) and exact run times, in the site's order:
  each job, in order of submission, starts at the earliest moment it fits beside the jobs before it for its whole
  run (conservative backfill with perfect knowledge: a later job starts ahead only where it delays no earlier one).
  Under that order no scheduler starts a job earlier, job by job in the order (each job's start is the earliest the
  jobs before it leave; starting an earlier job later to let a later one in breaks the order), which is what makes
  it the yardstick of the 7g jobs' wait: when the ideal's 7g longest wait is above half of a rival's, no mover can
  halve that rival's under the site's order. Its makespan is not a lower bound (another order may pack better), it
  is what the order allows with perfect repacking.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from flexmig.mig import H200
from flexmig.mig.enumerate import maximal_layouts
from slurm_mix import SLICES, MixJob

PROFILES = ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb")
"""The mix's profiles, in the order of a count vector."""

Counts = tuple[int, int, int, int]


@cache
def _one_gpu() -> frozenset[Counts]:
    """Every count vector of the mix's profiles that one H200 can hold at once (in some layout): the maximal
    layouts' counts and everything below them."""
    tops = {
        tuple(sum(1 for i in lay.instances if i.profile.name == p) for p in PROFILES) for lay in maximal_layouts(H200)
    }
    out: set[Counts] = set()
    for a, b, c, d in tops:
        for x in range(a + 1):
            for y in range(b + 1):
                for z in range(c + 1):
                    for w in range(d + 1):
                        out.add((x, y, z, w))
    return frozenset(out)


@cache
def fits(gpus: int) -> frozenset[Counts]:
    """Every count vector that ``gpus`` H200s hold at once, the instances laid out on them in any way."""
    if gpus < 1:
        raise ValueError(f"fits: gpus must be at least 1, not {gpus}")
    one = _one_gpu()
    if gpus == 1:
        return one
    less = fits(gpus - 1)
    return frozenset(tuple(p + q for p, q in zip(a, b, strict=True)) for a in less for b in one)  # type: ignore[misc]


def lower_bound(jobs: Sequence[MixJob], gpus: int) -> float:
    """A lower bound on the makespan (from the first arrival) of any schedule of ``jobs`` on ``gpus`` H200s."""
    first = min(j.arrival_s for j in jobs)
    slices = 7 * gpus
    best = max(j.arrival_s - first + j.runtime_s for j in jobs)
    work = seven = 0.0
    for j in sorted(jobs, key=lambda k: -k.arrival_s):
        work += SLICES[j.profile] * j.runtime_s
        if j.profile == PROFILES[3]:
            seven += j.runtime_s
        best = max(best, j.arrival_s - first + work / slices, j.arrival_s - first + seven / gpus)
    return best


@dataclass(frozen=True)
class Ideal:
    """The idealised rival's schedule: each job's start (by its index in the mix), the makespan from the first
    arrival, and the 7g jobs' longest wait (0: no 7g job)."""

    starts: dict[int, float]
    makespan: float
    seven_longest: float


def ideal(jobs: Sequence[MixJob], gpus: int) -> Ideal:
    """``jobs`` on ``gpus`` H200s with free, instant repacking and exact run times, each job in order of submission
    at the earliest moment it fits beside the jobs before it for its whole run."""
    ok = fits(gpus)
    booked: list[tuple[float, float, int]] = []  # (start, end, profile index)
    starts: dict[int, float] = {}
    for j in sorted(jobs, key=lambda k: (k.arrival_s, k.index)):
        p = PROFILES.index(j.profile)
        t = _earliest(booked, ok, j.arrival_s, j.runtime_s, p)
        booked.append((t, t + j.runtime_s, p))
        starts[j.index] = t
    first = min(j.arrival_s for j in jobs)
    end = max(starts[j.index] + j.runtime_s for j in jobs)
    sevens = [starts[j.index] - j.arrival_s for j in jobs if j.profile == PROFILES[3]]
    return Ideal(starts, end - first, max(sevens, default=0.0))


def _earliest(
    booked: Sequence[tuple[float, float, int]], ok: frozenset[Counts], at: float, run: float, p: int
) -> float:
    """The earliest start from ``at`` of a job of profile index ``p`` running ``run`` seconds that fits beside the
    ``booked`` jobs at every moment of its run (a fit can only begin when one of them ends, or at ``at``)."""
    candidates = sorted({at, *(e for _, e, _ in booked if e > at)})
    for t in candidates:
        if _fits_during(booked, ok, t, t + run, p):
            return t
    raise AssertionError("unreachable: after every booked job has ended, any one job fits")  # pragma: no cover


def _fits_during(booked: Sequence[tuple[float, float, int]], ok: frozenset[Counts], t0: float, t1: float,
                 p: int) -> bool:  # fmt: skip
    """Whether a job of profile index ``p`` fits beside the ``booked`` jobs over ``[t0, t1)``: the set of jobs
    running changes only at their starts, so it is checked at ``t0`` and at each start inside."""
    over = [b for b in booked if b[0] < t1 and t0 < b[1]]
    for x in [t0, *(s for s, _, _ in over if t0 < s)]:
        counts = [0, 0, 0, 0]
        counts[p] += 1
        for s, e, q in over:
            if s <= x < e:
                counts[q] += 1
        if tuple(counts) not in ok:
            return False
    return True


__all__ = ["PROFILES", "Ideal", "fits", "ideal", "lower_bound"]
