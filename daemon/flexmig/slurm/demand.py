"""Slurm's queue as the planner's demand: which jobs concern this node, what they ask for, what runs on it now.

A pending job counts for the node when it waits in one of the node's partitions (or the configured ones), may
run on the node (``--nodelist``/``--exclude``), asks for GPUs, and pends for a reason a new layout can answer:
``Resources``, ``Priority``, ``ReqNodeNotAvail`` (what a job for a profile no node has shows while it pends
against the FUTURE placeholder) or none yet. Held jobs, dependencies, begin times and limits are Slurm's business.

Each typed GPU request becomes one planner request of that many ranks of that profile (a job asking for two types
becomes two requests: Slurm starts it only when both are there, the planner places each). An untyped
``gpu:N`` takes the smallest profile. A type that is no MIG profile of the node's model is left out with its reason.
A pending job array stands for as many jobs as Slurm may start now: its pending tasks, but no more than its
throttle (``--array=1-20%2``) less its tasks already running. A request is aged from when the job became eligible.

A job running on the node holds the instances its GRES indices name (through the map flexmig wrote at the last
registration). It is *movable* only if it opted into the checkpoint hook (its comment carries the hook token,
e.g. ``sbatch --comment=flexmig:hook``), may be requeued (``--requeue``), and runs on this node alone; the agent
then keeps it movable only if its TaskProlog set the hook up (:mod:`flexmig.slurm.hookcheck`, which reads files and
so is not done here). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from flexmig.mig.catalogue import GpuModel
from flexmig.plan.types import Instance, JobRequest, RankNeed
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.squeue import SlurmJob

__all__ = ["PENDING_REASONS", "SlurmDemand", "SlurmRunning", "job_id_of", "read_demand", "request_name"]

#: Pending reasons a repartition can answer.
PENDING_REASONS = frozenset({"None", "Resources", "Priority", "ReqNodeNotAvail"})


def request_name(job_id: int, part: str | None = None) -> str:
    """The planner's name for (part of) a Slurm job: ``slurm-42``, ``slurm-42:1g.18gb``, ``slurm-42.3``."""
    return f"slurm-{job_id}" if part is None else f"slurm-{job_id}{part}"


def job_id_of(name: str) -> int | None:
    """The Slurm job of a planner name :func:`request_name` made (``slurm-42.3`` -> 42); None for other names."""
    digits = name.removeprefix("slurm-")
    end = next((i for i, ch in enumerate(digits) if not ch.isdigit()), len(digits))
    return int(digits[:end]) if name.startswith("slurm-") and 0 < end <= 12 else None


@dataclass(frozen=True, slots=True)
class SlurmRunning:
    """A job running on the node: the instances it holds (by GRES index), its size, and whether it can move."""

    job: SlurmJob
    instances: tuple[Instance, ...]
    movable: bool
    remaining_s: float | None
    unknown_indices: tuple[int, ...] = ()
    elapsed_s: float = 0.0

    @property
    def compute_slices(self) -> int:
        """Compute slices it holds."""
        return sum(i.profile.compute_slices for i in self.instances)


@dataclass(frozen=True, slots=True)
class SlurmDemand:
    """What Slurm asks of the node now: pending requests (queue order), jobs running on it, and what was left out."""

    node: str
    pending: tuple[JobRequest, ...]
    pending_jobs: tuple[SlurmJob, ...]
    running: tuple[SlurmRunning, ...]
    ignored: Mapping[int, str] = field(default_factory=dict)

    @property
    def movable(self) -> tuple[SlurmRunning, ...]:
        """Running jobs that may be checkpointed and requeued."""
        return tuple(r for r in self.running if r.movable)

    def requeued_requests(self, model: GpuModel) -> tuple[JobRequest, ...]:
        """The requests the movable jobs become once requeued (their current profiles), first in the queue."""
        out: list[JobRequest] = []
        for r in self.movable:
            by_type: dict[str, int] = {}
            for inst in r.instances:
                by_type[inst.profile.name] = by_type.get(inst.profile.name, 0) + 1
            parts = len(by_type) > 1
            for t, n in by_type.items():
                prof = model.profile(t)
                out.append(
                    JobRequest(
                        name=request_name(r.job.job_id, f":{t}" if parts else None),
                        need=RankNeed(profile=t),
                        ranks=n,
                        min_ranks=n,
                        max_ranks=n,
                        rank_memory_mib=prof.memory_mib,
                        submitted_s=r.job.submit_s,
                        movable=True,
                    )
                )
        return tuple(out)


def _profile_names(model: GpuModel) -> set[str]:
    return {p.name for p in model.profiles}


def _requests(job: SlurmJob, model: GpuModel, running_tasks: int = 0) -> tuple[list[JobRequest], str | None]:
    names = _profile_names(model)
    typed = [g for g in job.gpus_per_node if g.count > 0]
    bad = [g.type for g in typed if g.type is not None and g.type not in names]
    if bad:
        return [], f"asks for GPU type {bad[0]}, which is no MIG profile of {model.name}"
    out: list[JobRequest] = []
    copies = max(1, job.array_tasks)
    if job.array_max_tasks > 0:
        copies = min(copies, job.array_max_tasks - running_tasks)
        if copies <= 0:
            return [], f"array throttle: {running_tasks} of at most {job.array_max_tasks} tasks run already"
    parts = len(typed) > 1
    for copy in range(copies):
        suffix = f".{copy}" if copies > 1 else ""
        for g in typed:
            if g.type is None:
                need = RankNeed(compute_slices=1)
                memory = 0
                label = ":gpu"
            else:
                need = RankNeed(profile=g.type)
                memory = model.profile(g.type).memory_mib
                label = f":{g.type}"
            out.append(
                JobRequest(
                    name=request_name(job.job_id, suffix + (label if parts else "")),
                    need=need,
                    ranks=g.count,
                    min_ranks=g.count,
                    max_ranks=g.count,
                    rank_memory_mib=memory,
                    submitted_s=job.waited_since(),
                    expected_runtime_s=job.time_limit_s,
                    movable=False,
                )
            )
    return out, None


def _ours(job: SlurmJob, node: str, partitions: frozenset[str]) -> str | None:
    """Why a pending job does not concern the node (None: it does)."""
    if partitions and not partitions.intersection(job.partitions):
        return f"waits in partition {','.join(job.partitions) or '?'}, not one of {','.join(sorted(partitions))}"
    if job.required_nodes and node not in job.required_nodes:
        return f"must run on {','.join(job.required_nodes)}"
    if node in job.excluded_nodes:
        return f"excludes node {node}"
    if job.reason not in PENDING_REASONS:
        return f"pends for {job.reason}, which no layout answers"
    if not job.gpus_per_node:
        return "asks for no GPU"
    return None


def read_demand(
    jobs: Iterable[SlurmJob],
    node: SlurmNode | None,
    node_name: str,
    model: GpuModel,
    *,
    index_map: Mapping[int, Instance],
    now_s: float,
    partitions: Sequence[str] = (),
    hook_token: str,
    hook_settle_s: float = 0.0,
) -> SlurmDemand:
    """The node's demand from Slurm's ``jobs`` (``squeue``) and its ``node`` record (``sinfo``; None when it is not
    registered). ``index_map`` gives each GRES index the instance registered there; ``partitions`` (when given)
    replaces the node's own partitions; a hook job counts as movable once it has run ``hook_settle_s`` (a signal
    that arrives before the job installed its handler would end it)."""
    wanted = frozenset(partitions) or (frozenset(node.partitions) if node is not None else frozenset())
    pending: list[JobRequest] = []
    pending_jobs: list[SlurmJob] = []
    running: list[SlurmRunning] = []
    ignored: dict[int, str] = {}
    ordered = sorted(jobs, key=lambda j: (-j.priority, j.submit_s, j.job_id))
    tasks_running: dict[int, int] = {}
    for job in ordered:
        if job.array_job_id and job.active:
            tasks_running[job.array_job_id] = tasks_running.get(job.array_job_id, 0) + 1
    for job in ordered:
        if job.active and node_name in job.nodes:
            running.append(
                _running(
                    job, node_name, index_map=index_map, now_s=now_s, hook_token=hook_token, settle_s=hook_settle_s
                )
            )
            continue
        if not job.pending:
            continue
        why = _ours(job, node_name, wanted)
        if why is None:
            reqs, why = _requests(job, model, tasks_running.get(job.array_job_id, 0) if job.array_job_id else 0)
            if why is None:
                pending.extend(reqs)
                pending_jobs.append(job)
                continue
        ignored[job.job_id] = why
    return SlurmDemand(node_name, tuple(pending), tuple(pending_jobs), tuple(running), ignored)


def _running(
    job: SlurmJob, node: str, *, index_map: Mapping[int, Instance], now_s: float, hook_token: str, settle_s: float
) -> SlurmRunning:
    instances: list[Instance] = []
    unknown: list[int] = []
    for g in job.held_on(node):
        for i in g.indices:
            inst = index_map.get(i)
            if inst is None or (g.type is not None and inst.profile.name != g.type):
                unknown.append(i)
            else:
                instances.append(inst)
    opted = hook_token in re.split(r"[\s,;]+", job.comment)
    settled = job.state == "RUNNING" and job.start_s is not None and now_s - job.start_s >= settle_s
    movable = job.requeue and opted and job.node_count == 1 and not unknown and settled
    return SlurmRunning(
        job, tuple(sorted(instances)), movable, job.remaining_s(now_s), tuple(unknown), job.elapsed_s(now_s)
    )
