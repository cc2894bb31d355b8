"""``bound``: lower bounds that no policy, however clever, can beat on this node.

Derivation. Let job ``j`` arrive at ``a_j``, run ``p_j`` at its nominal shape, and need ``c_j`` compute slices; the
node has ``C`` slices. No policy runs a job faster than nominal (flexmig never gives a job more compute than it
asked for, and a spread runs slower), so:

1. job ``j`` ends no earlier than ``a_j + p_j``: the makespan ends no earlier than ``max_j (a_j + p_j)``;
2. the work ``W(t) = sum_{a_j >= t} c_j p_j`` that arrives at or after ``t`` cannot start before ``t`` and the node
   does at most ``C`` slice-seconds of it per second: the makespan ends no earlier than ``t + W(t) / C``, for every
   arrival time ``t`` (at the first arrival this is the classic total-work-over-capacity bound);
3. each job's completion time is at least ``p_j``, so the mean completion time is at least the mean of ``p_j``, and
   every percentile of completion times is at least that percentile of the ``p_j`` (sorted completion times
   dominate sorted run times element by element).

``makespan_s`` is the largest of (1) and (2), measured from the first arrival; ``mean_jct_s`` and ``p95_jct_s``
come from (3); waits are 0; ``utilization`` is total work over ``C`` times that makespan (an upper bound on the
utilization any policy reaches); fragmentation is 0. Jobs the node can never host (larger than the node) are
left out and counted as unplaceable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flexmig.replay.metrics import Metrics, percentile
from flexmig.replay.trace import TraceJob

__all__ = ["lower_bound"]


def lower_bound(jobs: Sequence[TraceJob], capacity_slices: int, extra: dict[str, Any] | None = None) -> Metrics:
    """The bounds above for ``jobs`` on a node of ``capacity_slices`` compute slices."""
    fits = [j for j in jobs if j.compute_slices <= capacity_slices]
    if not fits:
        return Metrics("bound", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, len(jobs), 0, len(jobs), dict(extra or {}))
    order = sorted(fits, key=lambda j: j.arrival_s)
    first = order[0].arrival_s
    end = max(j.arrival_s + j.runtime_s for j in order)
    suffix = 0.0
    for j in reversed(order):  # W(t) at each arrival, from the last one back
        suffix += j.work
        end = max(end, j.arrival_s + suffix / capacity_slices)
    makespan = end - first
    runtimes = [j.runtime_s for j in order]
    work = sum(j.work for j in order)
    return Metrics(
        policy="bound",
        makespan_s=makespan,
        mean_jct_s=sum(runtimes) / len(runtimes),
        p95_jct_s=percentile(runtimes, 95),
        mean_wait_s=0.0,
        utilization=work / (capacity_slices * makespan) if makespan > 0 else 0.0,
        fragmentation_mean=0.0,
        migrations=0,
        resplits=0,
        spread_starts=0,
        jobs=len(jobs),
        jobs_completed=len(order),
        jobs_unplaceable=len(jobs) - len(order),
        extra=dict(extra or {}),
    )
