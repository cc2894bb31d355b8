"""Which MIG profile a (memory, compute) need gets: the one rule for a job started at submit and for one the
planner places from the queue.

A job spec states memory in GiB, the planner counts MiB. The GiB figure becomes whole MiB once, rounded up
(:func:`need_mib`), so a need is never cut below what it asked for: 16.0005 GiB is 16,385 MiB, one more than an
H200's 1g.18gb holds, so the job gets 1g.35gb wherever it is placed from. The profile is then the smallest plain
profile that holds both figures (:func:`fitting_profile`).
"""

from __future__ import annotations

import math

from flexmig.mig.catalogue import GpuModel, Profile

__all__ = ["fitting_profile", "need_mib"]


def need_mib(gib: float) -> int:
    """The whole MiB that cover ``gib`` GiB (rounded up); ValueError when ``gib`` is not a finite number."""
    mib = gib * 1024  # exact: a power of two only moves the binary point
    if not math.isfinite(mib):
        raise ValueError(f"{gib} GiB is not a finite amount of memory")
    return math.ceil(mib)


def fitting_profile(model: GpuModel, memory_mib: int, compute_slices: int) -> Profile | None:
    """The smallest plain profile of ``model`` with at least ``memory_mib`` MiB and ``compute_slices`` compute
    slices: fewest compute slices, then fewest memory slices, then least memory. None when no profile is that large.
    """
    fits = [p for p in model.plain_profiles if p.memory_mib >= memory_mib and p.compute_slices >= compute_slices]
    return min(fits, key=lambda p: (p.compute_slices, p.memory_slices, p.memory_mib), default=None)
