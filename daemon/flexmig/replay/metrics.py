"""The figures a replay reports, computed from its raw outcome.

* ``makespan_s``: from the first arrival to the last completion;
* ``mean_jct_s``, ``p95_jct_s``: completion time (end minus arrival) of the completed jobs, mean and 95th
  percentile (nearest rank);
* ``mean_wait_s``: arrival to first running (after the plan's reconfiguration delay);
* ``utilization``: compute-slice-seconds of running jobs (their nominal compute, not the larger instance a
  policy may have given them, and only while they run: not while a plan reconfigures for them or moves them) over
  the slice-seconds available during the makespan;
* ``fragmentation_mean``: time-weighted mean of the node's FGD external fragmentation score over the makespan;
* ``migrations``, ``resplits``: moves of running jobs; ``spread_starts``: jobs that started spread;
* ``jobs_completed``, ``jobs_unplaceable`` (can never run on the node under the policy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flexmig.replay.engine import Replay

__all__ = ["Metrics", "metrics_of", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Metrics:
    """One policy's figures for one replay (see the module docstring for each)."""

    policy: str
    makespan_s: float
    mean_jct_s: float
    p95_jct_s: float
    mean_wait_s: float
    utilization: float
    fragmentation_mean: float
    migrations: int
    resplits: int
    spread_starts: int
    jobs: int
    jobs_completed: int
    jobs_unplaceable: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with every figure and the extras (static layout, trace facts, settings)."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "makespan_s": round(self.makespan_s, 3),
            "mean_jct_s": round(self.mean_jct_s, 3),
            "p95_jct_s": round(self.p95_jct_s, 3),
            "mean_wait_s": round(self.mean_wait_s, 3),
            "utilization": round(self.utilization, 6),
            "fragmentation_mean": round(self.fragmentation_mean, 6),
            "migrations": self.migrations,
            "resplits": self.resplits,
            "spread_starts": self.spread_starts,
            "jobs": self.jobs,
            "jobs_completed": self.jobs_completed,
            "jobs_unplaceable": self.jobs_unplaceable,
        }
        out.update(self.extra)
        return out


def metrics_of(policy: str, run: Replay, extra: dict[str, Any] | None = None) -> Metrics:
    """The figures of ``run``."""
    completed = [r for r in run.records if r.end_s is not None]
    jcts = [r.jct_s for r in completed if r.jct_s is not None]
    waits = [r.wait_s for r in completed if r.wait_s is not None]
    makespan = max(0.0, run.last_end_s - run.first_arrival_s)
    available = run.capacity_slices * makespan
    return Metrics(
        policy=policy,
        makespan_s=makespan,
        mean_jct_s=sum(jcts) / len(jcts) if jcts else 0.0,
        p95_jct_s=percentile(jcts, 95),
        mean_wait_s=sum(waits) / len(waits) if waits else 0.0,
        utilization=run.busy_slice_seconds / available if available > 0 else 0.0,
        fragmentation_mean=run.fragmentation_integral / makespan if makespan > 0 else 0.0,
        migrations=run.migrations,
        resplits=run.resplits,
        spread_starts=sum(1 for r in completed if r.spread_start),
        jobs=len(run.records),
        jobs_completed=len(completed),
        jobs_unplaceable=len(run.unplaceable),
        extra=dict(extra or {}),
    )
