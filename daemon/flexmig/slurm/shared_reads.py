"""How often a node reads Slurm's queue, and the looks at Slurm and NVML that the agents of one round share.

:func:`read_spacing` bounds the reads that sdiag's moving counters ask for (:data:`READ_SHARE`); :class:`SharedReads`
is one look at slurmctld and one at NVML for the agents of one round (``[slurm] node_per_gpu`` and
``node_per_instance``), read again after a round that changed something. :class:`Reads` is what the instance
carver (:class:`flexmig.slurm.carver.InstanceCarver`) needs of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from flexmig.nvml.types import Inventory
from flexmig.slurm.agent_read import SlurmRound, SlurmView

if TYPE_CHECKING:
    from flexmig.slurm.agent import SlurmAgent

__all__ = [
    "JOB_LOCK_SHARE",
    "READ_SHARE",
    "Reads",
    "SharedReads",
    "job_lock_s",
    "read_spacing",
    "round_due",
    "shared_round",
]

READ_SHARE = 10.0
"""Reads of the queue that sdiag's moving counters ask for are at least this many times what a read costs apart: at
most a tenth of the node's time goes to reading and parsing Slurm's queue (2,000 jobs: 6.4 MB of JSON, 0.34 s on
the testbed), and a slurmctld that answers slowly is asked less often."""


JOB_LOCK_SHARE = 0.1
"""By default (``[slurm] cluster_job_lock_share``) all the cluster's flexmig hosts together hold slurmctld's job lock
at most this share of its time by their reads of the queue. Slurm packs every job it keeps under that lock for each
``squeue`` (REQUEST_JOB_INFO; ``-w``/``--nodelist`` and ``--states`` filter in the client, after the packing, and
22.05's ``--json`` ignores them), so a read costs in proportion to the cluster's queue, not to the host's jobs: a
cluster of many hosts with a long queue is read less often."""

JOB_LOCK_BASE_S = 0.29e-3
JOB_LOCK_PER_JOB_S = (5.2e-3 - 0.29e-3) / 2000
"""What a read of the queue holds slurmctld's job lock: 0.29 ms with a short queue, 5.2 ms with 2,000 jobs (measured
on Slurm 22.05.8, the testbed's slurmctld), linear in between and beyond."""


def job_lock_s(jobs: int) -> float:
    """Seconds of slurmctld's job lock that one read of a queue of ``jobs`` jobs holds (measured, linear)."""
    return JOB_LOCK_BASE_S + JOB_LOCK_PER_JOB_S * max(0, jobs)


def read_spacing(
    hosts: int, read_s: float, *, reads_per_s: float, probe_s: float, jobs: int = 0, lock_share: float = JOB_LOCK_SHARE
) -> float:
    """The least seconds between two reads of the queue on one of ``hosts`` machines sharing ``reads_per_s`` reads a
    second, when a read takes ``read_s`` and the queue holds ``jobs`` jobs: the hosts over ``reads_per_s``, at least
    :data:`READ_SHARE` times a read, at least what keeps the hosts' reads within ``lock_share`` of slurmctld's job
    lock (``[slurm] cluster_job_lock_share``, :data:`JOB_LOCK_SHARE` by default), and at least ``probe_s``."""
    lock = hosts * job_lock_s(jobs) / lock_share if hosts else 0.0
    return max(probe_s, hosts / reads_per_s, READ_SHARE * read_s, lock)


def round_due(since_s: float, *, spacing_s: float, interval_s: float, moved: bool = False) -> bool:
    """Whether a node reads the queue now, ``since_s`` seconds after its last read: when the probe saw it ``moved``
    and the spacing has passed, and at the latest every ``interval_s`` (the timed read), but never before the spacing
    either: on a cluster of many hosts the timed reads alone would otherwise exceed the budget (1,000 hosts every
    10 s: 100 reads a second)."""
    if since_s < spacing_s:
        return False
    return moved or since_s >= interval_s


class Reads(Protocol):
    """What :class:`SharedReads` offers: one look at Slurm and NVML, read again after a round that changed
    something."""

    async def view(self) -> SlurmView:
        """Slurm's jobs, nodes and reservations."""

    async def inventory(self) -> Inventory:
        """NVML's inventory."""

    def after(self, rnd: SlurmRound) -> None:
        """Forget the looks when ``rnd`` did anything."""


class SharedReads:
    """One look at slurmctld (jobs, nodes, reservations) and one at NVML (the inventory) shared by the GPU nodes'
    agents of one round (``[slurm] node_per_gpu``), so that a host of eight GPU nodes asks slurmctld three questions
    a round, not 24, and NVML once, not nine times: each read when first needed, and again after an agent's round
    that did anything (carried out, committed, moved or abandoned a change, registered its node, restarted its
    slurmd: any result or event), since what it did changed Slurm and maybe the GPUs."""

    def __init__(
        self, fetch: Callable[[], Awaitable[SlurmView]], inventory: Callable[[], Awaitable[Inventory]]
    ) -> None:
        self.fetch = fetch
        self.fetch_inventory = inventory
        self.reads = 0
        """How many times Slurm was read (for the tests and the log)."""
        self._view: SlurmView | None = None
        self._inventory: Inventory | None = None

    async def view(self) -> SlurmView:
        """Slurm as last read this round (read now if nothing since changed it)."""
        if self._view is None:
            self._view = await self.fetch()
            self.reads += 1
        return self._view

    async def inventory(self) -> Inventory:
        """NVML's inventory as last read this round (read now if nothing since changed it)."""
        if self._inventory is None:
            self._inventory = await self.fetch_inventory()
        return self._inventory

    def after(self, rnd: SlurmRound) -> None:
        """Forget both looks when ``rnd`` did anything."""
        if rnd.result is not None or rnd.events:
            self._view = None
            self._inventory = None


async def shared_round(agent: SlurmAgent, mode: str, shared: Reads | None, *, plan: bool = True) -> SlurmRound:
    """``agent``'s round on the round's shared looks at Slurm and NVML (its own reads without them), which it holds
    only while the round runs; the looks are forgotten after a round that changed something."""
    if shared is None:
        return await agent.round(mode, plan=plan)
    try:
        agent.shared = await shared.view()
        agent.shared_inventory = await shared.inventory()
        rnd = await agent.round(mode, plan=plan)
    finally:
        agent.shared = None
        agent.shared_inventory = None
    shared.after(rnd)
    return rnd
