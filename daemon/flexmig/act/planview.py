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
        movable=True,
        malleable=rec.spec.ranks_min < rec.spec.ranks_start,
        standby=rec.spec.hook.standby,
    )


def running_jobs(
    records: Iterable[JobRecord], model: GpuModel, last_moved_s: Mapping[str, float] | None = None
) -> tuple[RunningJob, ...]:
    """Every ``running`` job with its instances. ``last_moved_s`` gives, in the planner's clock, when each job
    last started or moved (the settling time counts from there); jobs missing from it count as long settled."""
    out = []
    for rec in records:
        if rec.state != "running" or not rec.slots:
            continue
        insts = tuple(Instance(s.gpu, s.start, model.profile(s.profile)) for s in rec.slots)
        moved = (last_moved_s or {}).get(rec.name)
        out.append(RunningJob(rec.name, insts, job_request(rec, model), movable=True, last_moved_s=moved))
    return tuple(out)


def pending_requests(records: Iterable[JobRecord], model: GpuModel) -> tuple[JobRequest, ...]:
    """Jobs submitted and not started yet, oldest first."""
    pending = sorted((r for r in records if r.state == "pending"), key=lambda r: r.submitted_s)
    return tuple(job_request(r, model) for r in pending)
