"""The actuator's job records as the planner sees them (``flexmig.plan.types``): running jobs and the queue.

The daemon builds ``NodeState(running=running_jobs(...), pending=pending_requests(...))`` from the journal each
planning round, so the planner plans for exactly the jobs the executor knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from flexmig.act.records import JobRecord
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.need import need_mib
from flexmig.plan.types import Instance, JobRequest, RankNeed, RunningJob

__all__ = ["job_request", "pending_requests", "running_jobs"]


def job_request(rec: JobRecord, model: GpuModel) -> JobRequest:
    """The planner's request for ``rec``: its rank need, nominal and allowed rank counts, submission time; it is
    malleable (may run on fewer ranks than it starts with, down to ``ranks.min``) when ``ranks.min`` is below
    ``ranks.start``."""
    need = rec.spec.need
    if need.profile:
        plan_need = RankNeed(profile=need.profile)
        memory_mib = model.profile(need.profile).memory_mib
    else:
        memory_mib = need_mib(need.memory_gib or 0.0)  # rounded up, as at submit: the same profile either way
        plan_need = RankNeed(memory_mib=memory_mib, compute_slices=need.compute_slices or 0)
    return JobRequest(
        name=rec.name,
        need=plan_need,
        ranks=rec.spec.ranks_start,
        min_ranks=rec.spec.ranks_min,
        max_ranks=rec.spec.ranks_max,
        rank_memory_mib=memory_mib,
        submitted_s=rec.submitted_s,
        expected_runtime_s=rec.spec.runtime_s,
        movable=True,
        malleable=rec.spec.ranks_min < rec.spec.ranks_start,
        standby=rec.spec.hook.standby,
    )


def running_jobs(
    records: Iterable[JobRecord],
    model: GpuModel,
    last_moved_s: Mapping[str, float] | None = None,
    started_s: Mapping[str, float] | None = None,
    now_s: float | None = None,
) -> tuple[RunningJob, ...]:
    """Every ``running`` job with its instances. ``last_moved_s`` gives, in the planner's clock, when each job
    last started or moved (the settling time counts from there); jobs missing from it count as long settled.
    ``started_s`` gives when each job first started: a job whose spec says its run time (``runtime_s``) has that
    much less the time since then left (moves' downtime and a shape's speed aside), which the planner weighs moves
    and waits by; without either, its remaining time is unknown."""
    out = []
    for rec in records:
        if rec.state != "running" or not rec.slots:
            continue
        insts = tuple(Instance(s.gpu, s.start, model.profile(s.profile)) for s in rec.slots)
        moved = (last_moved_s or {}).get(rec.name)
        began = (started_s or {}).get(rec.name)
        remaining = None
        if rec.spec.runtime_s is not None and began is not None and now_s is not None:
            remaining = max(0.0, rec.spec.runtime_s - max(0.0, now_s - began))
        request = job_request(rec, model)
        out.append(RunningJob(rec.name, insts, request, movable=True, last_moved_s=moved, remaining_s=remaining))
    return tuple(out)


def pending_requests(records: Iterable[JobRecord], model: GpuModel) -> tuple[JobRequest, ...]:
    """Jobs submitted and not started yet, oldest first."""
    pending = sorted((r for r in records if r.state == "pending"), key=lambda r: r.submitted_s)
    return tuple(job_request(r, model) for r in pending)
