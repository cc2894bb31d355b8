"""How often a node reads Slurm's queue, and the looks at Slurm and NVML that the agents of one round share.

:func:`read_spacing` bounds the reads that sdiag's moving counters ask for (:data:`READ_SHARE`); :class:`SharedReads`
is one look at slurmctld and one at NVML for the agents of one round (``[slurm] node_per_gpu`` and
``node_per_instance``), read again after a round that changed something. :class:`Reads` is what the instance
carver (:class:`flexmig.slurm.carver.InstanceCarver`) needs of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from flexmig.nvml.types import Inventory
from flexmig.slurm.agent_read import SlurmRound, SlurmView

__all__ = ["READ_SHARE", "Reads", "SharedReads", "read_spacing"]

READ_SHARE = 10.0
"""Reads of the queue that sdiag's moving counters ask for are at least this many times what a read costs apart: at
most a tenth of the node's time goes to reading and parsing Slurm's queue (2,000 jobs: 6.4 MB of JSON, 0.34 s on
the testbed), and a slurmctld that answers slowly is asked less often."""


def read_spacing(hosts: int, read_s: float, *, reads_per_s: float, probe_s: float) -> float:
    """The least seconds between two reads of the queue that its moving counters ask for, on one of ``hosts``
    machines sharing ``reads_per_s`` reads a second, when a read takes ``read_s``; at least ``probe_s``."""
    return max(probe_s, hosts / reads_per_s, READ_SHARE * read_s)


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
