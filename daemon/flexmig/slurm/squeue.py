"""Slurm's jobs as typed values, read from ``squeue --json`` (Slurm 22.05, OpenAPI v0.0.38).

Facts verified on 22.05.8 that shape this module:

* ``squeue --json`` ignores its filters (``-p``, ``-w``, ``-t``): every job slurmctld still remembers comes back,
  finished ones included, so the caller filters;
* a job's GPU request is in ``tres_per_node`` (``--gres=gpu:1g.18gb:2``, ``--gpus-per-node``), ``tres_per_job``
  (``--gpus``) or ``tres_per_task`` (``--gpus-per-task``), as ``gres:gpu:TYPE:COUNT`` items;
* ``gres_detail`` of a running job lists, per node, what it holds with GRES indices: ``gpu:1g.18gb:1(IDX:2)``;
* ``time_limit`` is in minutes: null for a pending job without one, 525600 (a year, Slurm's "infinite") once it
  runs, both read as no limit; times are epoch seconds, 0 when unset (a pending job's ``start_time`` is the
  scheduler's estimate);
* a pending job array is one record whose ``array_task_string`` (``1-3``) names the tasks still pending.

Anything of the wrong type is refused with a SlurmError naming the job and the key: a half-read queue must never
be planned for. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flexmig.errors import SlurmError
from flexmig.slurm.dataparser import is_data_parser, job_record
from flexmig.slurm.envelope import decode, field, records
from flexmig.slurm.gres import GresCount, parse_gres, parse_index_list
from flexmig.slurm.hostlist import expand_hostlist

__all__ = ["SlurmJob", "parse_squeue"]

COMMAND = "squeue --json"
_INFINITE_MINUTES = 525600  # what 22.05 shows as the time limit of a running job that has none


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One Slurm job (or one pending array record) with what flexmig needs of it.

    ``gpus_per_node`` is the job's GPU request on each of its nodes, whichever option asked for it;
    ``held`` lists, per node name, the GPU GRES the job holds there, with their indices (running jobs only).
    ``array_tasks`` is how many jobs this record stands for (pending array tasks; 1 otherwise); ``array_job_id``
    the array it belongs to (0: none) and ``array_max_tasks`` its throttle (``--array=1-20%2``: 2; 0: none).
    ``eligible_s`` is when it became eligible to start (0: unknown), which ages its wait.
    """

    job_id: int
    name: str
    user_id: int
    user: str
    state: str
    reason: str
    partitions: tuple[str, ...]
    nodes: tuple[str, ...]
    node_count: int
    gpus_per_node: tuple[GresCount, ...]
    held: tuple[tuple[str, tuple[GresCount, ...]], ...]
    requeue: bool
    comment: str
    priority: int
    submit_s: float
    start_s: float | None
    time_limit_s: float | None
    restart_count: int
    array_tasks: int = 1
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    array_job_id: int = 0
    array_max_tasks: int = 0
    eligible_s: float = 0.0

    @property
    def pending(self) -> bool:
        """Waiting to start."""
        return self.state == "PENDING"

    @property
    def active(self) -> bool:
        """Holding (or about to hold, or still releasing) resources on its nodes."""
        return self.state in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING")

    def held_on(self, node: str) -> tuple[GresCount, ...]:
        """The GPU GRES (with indices) the job holds on ``node``."""
        for name, items in self.held:
            if name == node:
                return items
        return ()

    def elapsed_s(self, now_s: float) -> float:
        """How long it has run (0 before it starts)."""
        return 0.0 if self.start_s is None else max(0.0, now_s - self.start_s)

    def waited_since(self) -> float:
        """When its wait began: eligible time, else submission."""
        return self.eligible_s if self.eligible_s > 0 else self.submit_s

    def remaining_s(self, now_s: float) -> float | None:
        """Time left before its time limit ends it (None: no limit, or not started)."""
        if self.time_limit_s is None or self.start_s is None:
            return None
        return max(0.0, self.start_s + self.time_limit_s - now_s)


def _gpus(items: tuple[GresCount, ...]) -> tuple[GresCount, ...]:
    return tuple(i for i in items if i.name == "gpu")


def _per_node(rec: dict[str, Any], where: str, node_count: int) -> tuple[GresCount, ...]:
    """Merge the per-node, per-job and per-task GPU requests into one per-node request."""
    per_node = list(
        _gpus(parse_gres(field(rec, "tres_per_node", str, where, default=""), where=f"{where} tres_per_node"))
    )
    per_job = _gpus(parse_gres(field(rec, "tres_per_job", str, where, default=""), where=f"{where} tres_per_job"))
    per_task = _gpus(parse_gres(field(rec, "tres_per_task", str, where, default=""), where=f"{where} tres_per_task"))
    nodes = max(1, node_count)
    for item in per_job:
        per_node.append(GresCount(item.name, item.type, math.ceil(item.count / nodes)))
    if per_task:
        tasks = field(rec, "tasks", int, where, default=1) or 1
        per_node_tasks = math.ceil(tasks / nodes)
        for item in per_task:
            per_node.append(GresCount(item.name, item.type, item.count * per_node_tasks))
    merged: dict[str | None, int] = {}
    for item in per_node:
        merged[item.type] = merged.get(item.type, 0) + item.count
    return tuple(GresCount("gpu", t, n) for t, n in merged.items() if n > 0)


def _held(rec: dict[str, Any], where: str, nodes: tuple[str, ...]) -> tuple[tuple[str, tuple[GresCount, ...]], ...]:
    detail = field(rec, "gres_detail", list, where, default=[])
    out: list[tuple[str, tuple[GresCount, ...]]] = []
    for i, entry in enumerate(detail):
        if not isinstance(entry, str):
            raise SlurmError(f"{where}: gres_detail[{i}] is {entry!r}, not a string")
        if i >= len(nodes):
            raise SlurmError(f"{where}: gres_detail has more entries than the job has nodes ({nodes})")
        out.append((nodes[i], _gpus(parse_gres(entry, where=f"{where} gres_detail[{i}]"))))
    return tuple(out)


def _array_tasks(rec: dict[str, Any], where: str) -> int:
    text = field(rec, "array_task_string", str, where, default="")
    if not text:
        return 1
    body = text.split("%", 1)[0]  # "1-10%2": at most 2 at a time; the pending count is what matters here
    try:
        return max(1, len(parse_index_list(body.replace(":", ","), where=f"{where} array_task_string")))
    except SlurmError:
        return 1  # a stepped range ("1-9:2") or another form: count the record once


def _job(rec: dict[str, Any], i: int) -> SlurmJob:
    job_id = field(rec, "job_id", int, f"jobs[{i}]")
    where = f"job {job_id}"
    node_count = field(rec, "node_count", int, where, default=1)
    nodes = expand_hostlist(field(rec, "nodes", str, where, default=""))
    limit = field(rec, "time_limit", int, where, default=None)
    if limit is not None and limit >= _INFINITE_MINUTES:
        limit = None
    start = field(rec, "start_time", int, where, default=0)
    partition = field(rec, "partition", str, where, default="")
    return SlurmJob(
        job_id=job_id,
        name=field(rec, "name", str, where, default=""),
        user_id=field(rec, "user_id", int, where),
        user=field(rec, "user_name", str, where, default=""),
        state=field(rec, "job_state", str, where),
        reason=field(rec, "state_reason", str, where, default="None"),
        partitions=tuple(p for p in partition.split(",") if p),
        nodes=nodes,
        node_count=node_count,
        gpus_per_node=_per_node(rec, where, node_count),
        held=_held(rec, where, nodes),
        requeue=bool(field(rec, "requeue", bool, where, default=False)),
        comment=field(rec, "comment", str, where, default=""),
        priority=field(rec, "priority", int, where, default=0),
        submit_s=float(field(rec, "submit_time", int, where, default=0)),
        start_s=float(start) if start else None,
        time_limit_s=None if limit is None else float(limit) * 60.0,
        restart_count=field(rec, "restart_cnt", int, where, default=0),
        array_tasks=_array_tasks(rec, where),
        required_nodes=expand_hostlist(field(rec, "required_nodes", str, where, default="")),
        excluded_nodes=expand_hostlist(field(rec, "excluded_nodes", str, where, default="")),
        array_job_id=field(rec, "array_job_id", int, where, default=0) or 0,
        array_max_tasks=field(rec, "array_max_tasks", int, where, default=0) or 0,
        eligible_s=float(field(rec, "eligible_time", int, where, default=0) or 0),
    )


def parse_squeue(text: str | bytes) -> tuple[SlurmJob, ...]:
    """Every job in ``squeue --json``'s answer, in its order. SlurmError names the first problem."""
    doc = decode(text, COMMAND)
    recs = records(doc, "jobs", COMMAND)
    if is_data_parser(doc):  # Slurm 23.02 and on
        recs = [job_record(rec) for rec in recs]
    return tuple(_job(rec, i) for i, rec in enumerate(recs))
