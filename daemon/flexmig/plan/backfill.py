"""A forecast of what Slurm itself will start on one node whose GPUs are MIG instances (typed GRES), so that flexmig
can weigh a layout by the work Slurm would actually run on it.

Slurm 22.05's rules on such a node, as verified on real daemons (slurmctld 22.05.8, ``sched/backfill``):

* jobs are considered in priority order (the order of ``queue``); a job asking for ``gpu:3g.71gb:1`` gets exactly
  that type, and a job whose type the node does not have pends elsewhere (against the FUTURE placeholder, reason
  ``ReqNodeNotAvail``) and reserves nothing on this node;
* a job of a type the node has but whose instances are all busy must wait: backfill then reserves the *whole node*
  for it from when an instance of its type frees by the running jobs' **time limits**, for its own limit (a
  ``gpu:1g.18gb`` job with ``--time=10`` waited beside a free 1g instance while a ``3g.71gb`` job had the node
  reserved from 5 minutes on). A later job starts now only if its own limit ends before every such window;
* flexmig's reservation (``close_s``) admits no job whose limit reaches into it, and none once it has started.

Jobs then run for their *expected* run time, which is not their limit: a running job is expected to end halfway to
its limit (:meth:`flexmig.plan.reregistration.DrainHolder.expected_left_s`), a waiting job halfway through its
limit. The forecast is what Slurm would do if those expectations held and nothing else arrived; it is cheap
(a few hundred events) and pure: times are seconds from now.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Ask", "Forecast", "Seat", "forecast"]


@dataclass(frozen=True, slots=True)
class Seat:
    """One MIG instance of the node: its profile, compute slices, and the job on it if any: seconds until that job
    is expected to end (``busy_s``, 0 when free) and until its time limit ends (``limit_s``, ``inf``: none)."""

    profile: str
    slices: int
    busy_s: float = 0.0
    limit_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Ask:
    """A waiting job: ``count`` instances of ``profile``, expected to run ``runtime_s``, with time limit ``limit_s``
    (``inf``: none, so backfill never starts it before another job's window)."""

    name: str
    profile: str
    runtime_s: float
    limit_s: float
    count: int = 1


@dataclass(frozen=True, slots=True)
class Forecast:
    """What Slurm is expected to do: busy compute slice-seconds within the horizon, the jobs started (in order) and
    when the node is empty of every job running or started (``inf`` when a job never ends within reason)."""

    busy_slice_s: float
    started: tuple[str, ...]
    empty_s: float


_MAX_EVENTS = 10_000


def forecast(
    seats: Sequence[Seat], queue: Sequence[Ask], horizon_s: float, *, close_s: float | None = None
) -> Forecast:
    """Run ``queue`` on ``seats`` by Slurm's rules (the module docstring) from now until ``horizon_s``; with
    ``close_s``, flexmig's reservation closes the node then (jobs that would run into it do not start)."""
    free = [s.busy_s for s in seats]
    limit = [s.limit_s for s in seats]
    busy = sum(s.slices * min(horizon_s, s.busy_s) for s in seats)
    types = {s.profile for s in seats}
    pending = [i for i, a in enumerate(queue) if a.profile in types]
    started: list[str] = []
    t = 0.0
    for _ in range(_MAX_EVENTS):
        if not pending or t >= horizon_s or (close_s is not None and t >= close_s):
            break
        windows: list[tuple[float, float]] = []
        waiting: list[int] = []
        for i in pending:
            ask = queue[i]
            own = [k for k, s in enumerate(seats) if s.profile == ask.profile]
            ready = [k for k in own if free[k] <= t]
            ends = t + ask.limit_s
            allowed = (close_s is None or ends <= close_s) and all(ends <= a for a, _ in windows)
            if len(ready) >= ask.count and allowed:
                for k in ready[: ask.count]:
                    free[k] = t + ask.runtime_s
                    limit[k] = ends
                    busy += seats[k].slices * max(0.0, min(horizon_s, t + ask.runtime_s) - t)
                started.append(ask.name)
                continue
            waiting.append(i)
            if len(own) >= ask.count:  # it reserves the node from when its instances free by the limits
                start = max(t, sorted(limit[k] if free[k] > t else t for k in own)[ask.count - 1])
                moved = True
                while moved and math.isfinite(start):
                    moved = False
                    for a, b in windows:
                        if start < b and a < start + ask.limit_s:
                            start, moved = b, True
                windows.append((start, start + ask.limit_s))
        pending = waiting
        later = [f for f in free if f > t]
        if not later:
            break
        t = min(later)
    return Forecast(busy, tuple(started), max([0.0, *free]))
