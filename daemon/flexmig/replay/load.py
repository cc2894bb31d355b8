"""Offered load: thinning a trace (seeded) so that its work is RHO times the node's capacity over its span.

Definitions:

* the *work* of a job is its compute slices times its nominal run time (slice-seconds);
* the *span* is from the first to the last arrival of the jobs considered;
* the *offered load* of a set of jobs on a node of ``C`` compute slices is ``sum(work) / (C * span)``.

:func:`thin` keeps a seeded random subset whose offered load over the trace's span is RHO: jobs are taken in a
random order (``random.Random(seed)``) until their work reaches ``RHO * C * span`` (the last one taken may pass
it by less than its own work). The kept jobs keep their arrival times; the first and the last arrival of the
trace are always kept, so the span is the trace's. RHO above the trace's natural load cannot be reached by
thinning: :class:`~flexmig.errors.TraceError` says so.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from flexmig.errors import TraceError
from flexmig.replay.trace import TraceJob

__all__ = ["cap_runtime", "compress", "natural_load", "span_of", "thin"]


def span_of(jobs: Sequence[TraceJob]) -> float:
    """Seconds from the first to the last arrival (0 for fewer than two jobs)."""
    if len(jobs) < 2:
        return 0.0
    arrivals = [j.arrival_s for j in jobs]
    return max(arrivals) - min(arrivals)


def natural_load(jobs: Sequence[TraceJob], slices: int) -> float:
    """Offered load of all ``jobs`` on ``slices`` compute slices over their span."""
    span = span_of(jobs)
    if span <= 0 or slices <= 0:
        return float("inf")
    return sum(j.work for j in jobs) / (slices * span)


def compress(jobs: Sequence[TraceJob], max_gap_s: float) -> list[TraceJob]:
    """Arrivals with every quiet stretch longer than ``max_gap_s`` cut to ``max_gap_s``, the first arrival at 0.

    The trace spans about 150 days, but nine tenths of its pods arrive in the last 30: the earlier pods are
    the long-lived survivors of a snapshot. Cutting the gaps between consecutive arrivals keeps the order and the
    bursts of the busy weeks and removes the empty months. Run times are not touched.
    """
    if max_gap_s <= 0:
        raise TraceError(f"the longest gap between arrivals must be positive, not {max_gap_s}")
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    out: list[TraceJob] = []
    clock = 0.0
    prev: float | None = None
    for j in ordered:
        if prev is not None:
            clock += min(j.arrival_s - prev, max_gap_s)
        prev = j.arrival_s
        out.append(replace(j, arrival_s=clock))
    return out


def cap_runtime(jobs: Sequence[TraceJob], max_runtime_s: float) -> list[TraceJob]:
    """Run times capped at ``max_runtime_s`` (0: no cap).

    The trace's pods include services that run for weeks or months (a few per cent of the pods, most of the
    GPU-time); on an eight-GPU node a handful of them would decide every figure. Capping treats the part
    beyond the cap as another tenant's business.
    """
    if max_runtime_s < 0:
        raise TraceError(f"the run-time cap must not be negative, not {max_runtime_s}")
    if max_runtime_s == 0:
        return list(jobs)
    return [j if j.runtime_s <= max_runtime_s else replace(j, runtime_s=max_runtime_s) for j in jobs]


def thin(jobs: Sequence[TraceJob], rho: float, slices: int, seed: int) -> list[TraceJob]:
    """A seeded subset of ``jobs`` offering load ``rho`` on ``slices`` slices over the trace's span."""
    if rho <= 0:
        raise TraceError(f"load must be positive, not {rho}")
    natural = natural_load(jobs, slices)
    if rho > natural:
        raise TraceError(
            f"load {rho} is above what the trace offers on {slices} compute slices ({natural:.3f}); "
            "thinning can only lower it"
        )
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    target = rho * slices * span_of(ordered)
    first, last = ordered[0], ordered[-1]
    kept = {first.name, last.name}
    work = first.work + (last.work if last is not first else 0.0)
    rest = list(ordered[1:-1])
    random.Random(seed).shuffle(rest)  # noqa: S311 - a reproducible sample, not a secret
    for j in rest:
        if work >= target:
            break
        kept.add(j.name)
        work += j.work
    return [j for j in ordered if j.name in kept]
