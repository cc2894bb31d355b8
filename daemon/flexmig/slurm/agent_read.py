"""What a Slurm agent's round reads and returns: one look at Slurm and NVML (:class:`SlurmRead`), what the round
did (:class:`SlurmRound`), and what the read tells of when the node is empty.

:func:`read_slurm` is the one look at slurmctld (jobs, nodes, reservations) that the agents of a host may share
(:class:`flexmig.slurm.shared_reads.SharedReads`); :func:`without_taken` leaves a sibling GPU node's jobs out of a
read; :func:`holders`, :func:`close_by` and :func:`close_at` are the running jobs as the layout choice sees them and
when they leave the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flexmig.act.nodeview import NodeView
from flexmig.act.results import PlanResult
from flexmig.errors import SlurmError
from flexmig.mig.catalogue import GpuModel
from flexmig.nvml.types import Inventory
from flexmig.plan.reregistration import DrainHolder, NodeNow, Verdict, close_by_s, close_in_s
from flexmig.plan.types import Plan
from flexmig.slurm.client import SlurmClient
from flexmig.slurm.demand import SlurmDemand, request_name
from flexmig.slurm.instances import CarvingReport
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import SlurmReservation, flexmig_name
from flexmig.slurm.slurmd import SlurmdState
from flexmig.slurm.squeue import SlurmJob

__all__ = [
    "SlurmRead",
    "SlurmRound",
    "SlurmView",
    "close_at",
    "close_by",
    "describe_error",
    "holders",
    "read_slurm",
    "read_text",
    "without_taken",
]

_MAX_FILE = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SlurmRead:
    """One look at Slurm and NVML (and the node's slurmd)."""

    jobs: tuple[SlurmJob, ...]
    node: SlurmNode | None
    inventory: Inventory
    view: NodeView
    demand: SlurmDemand
    model: GpuModel
    registered_as: dict[str, int]
    expected: dict[str, int]
    reservations: tuple[SlurmReservation, ...] = ()
    slurmd: SlurmdState = "running"
    now_s: float = 0.0

    @property
    def in_sync(self) -> bool:
        """Slurm lists the node, responding, with exactly the instances NVML shows."""
        return self.node is not None and self.node.responding and self.registered_as == self.expected

    @property
    def mine(self) -> SlurmReservation | None:
        """flexmig's reservation on this node (a change is committed), if any."""
        name = flexmig_name(self.demand.node)
        return next((r for r in self.reservations if r.name == name), None)

    @property
    def busy(self) -> bool:
        """Jobs that are no hook jobs run on the node (a change must wait for them to end)."""
        return any(not r.movable for r in self.demand.running)


@dataclass(frozen=True, slots=True)
class SlurmRound:
    """What one round saw, planned and did; ``events`` are ``(kind, detail)`` for the fleet; ``carving``: a host
    round's carving (one node per MIG instance)."""

    read: SlurmRead | None
    plan: Plan = field(default_factory=Plan)
    verdict: Verdict | None = None
    result: PlanResult | None = None
    note: str = ""
    events: tuple[tuple[str, dict[str, Any]], ...] = ()
    carving: CarvingReport | None = None


SlurmView = tuple[tuple[SlurmJob, ...], tuple[SlurmNode, ...], tuple[SlurmReservation, ...]]
"""What one look at slurmctld returns: its jobs, nodes and reservations."""


async def read_slurm(client: SlurmClient) -> SlurmView:
    """Slurm's jobs, nodes and reservations (three commands); SlurmError when Slurm cannot be read."""
    return await client.jobs(), await client.nodes(), await client.reservations()


def without_taken(read: SlurmRead, taken: frozenset[str]) -> SlurmRead:
    """The read without the pending jobs in ``taken`` (a sibling GPU node's change serves them)."""
    d = read.demand
    if not taken or not any(r.name in taken for r in d.pending):
        return read
    pending = tuple(r for r in d.pending if r.name not in taken)
    jobs = tuple(j for j in d.pending_jobs if request_name(j.job_id) not in taken)
    return replace(read, demand=SlurmDemand(d.node, pending, jobs, d.running, d.ignored))


def holders(read: SlurmRead) -> tuple[DrainHolder, ...]:
    """The node's running Slurm jobs as the layout choice sees them."""
    return tuple(
        DrainHolder(
            request_name(r.job.job_id), r.compute_slices, r.remaining_s, r.movable, r.elapsed_s,
            tuple(i.key for i in r.instances),
        )
        for r in read.demand.running
    )  # fmt: skip


def close_by(read: SlurmRead) -> float | None:
    """Seconds until the node is surely empty by its immovable jobs' limits (None: one has no limit):
    :func:`~flexmig.plan.reregistration.close_by_s` of its running jobs."""
    return close_by_s(NodeNow(read.model, (), holders(read), ()))


def close_at(read: SlurmRead, floor_s: float) -> float:
    """Seconds until the node is expected to be empty, never later than the limits say: where flexmig's reservation
    starts (:func:`~flexmig.plan.reregistration.close_in_s` of its running jobs). Jobs that end before it still
    start; the few that run past it close the node for the rest of their run."""
    return close_in_s(NodeNow(read.model, (), holders(read), ()), floor_s)


def read_text(path: Path) -> str:
    """A small local file's text ('' when it is missing or unreadable)."""
    try:
        with open(path, "rb") as f:  # noqa: PTH123 - bounded read
            return f.read(_MAX_FILE).decode("utf-8", "replace")
    except OSError:
        return ""


def describe_error(exc: SlurmError) -> str:
    """One line for the log when Slurm cannot be read."""
    return f"Slurm cannot be read ({exc}); flexmig samples on and changes nothing until it answers"
