"""Telling the node which process runs on which MIG device.

On real hardware the CUDA driver does this by itself: a rank that opens its MIG device shows up in NVML's process
list for it. The simulated node cannot see CUDA contexts, so the supervisor registers each rank's real pid on its
MIG device, and NVML (ours, nvitop's) lists it there. Both are :class:`DeviceProcessTable` implementations; the
actuator never asks which one it has.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from flexmig.act.procs import process_alive
from flexmig.errors import SimError
from flexmig.sim.node import SimNode

__all__ = ["DeviceProcessTable", "DriverProcessTable", "SimProcessTable"]


class DeviceProcessTable(Protocol):
    """Registers rank processes on MIG devices where the node cannot see them by itself."""

    def attach(self, uuid: str, pid: int) -> None:
        """Process ``pid`` now runs on MIG device ``uuid`` (idempotent)."""

    def detach(self, uuid: str, pid: int) -> None:
        """Process ``pid`` left MIG device ``uuid`` (idempotent; unknown pids are ignored)."""

    def prune(self) -> list[int]:
        """Forget registered processes that have exited (zombies included); returns their pids."""


class DriverProcessTable:
    """Real NVML: the driver tracks CUDA processes itself, so both calls do nothing."""

    def attach(self, uuid: str, pid: int) -> None:
        """Nothing to do: the driver lists the process once it opens the device."""

    def detach(self, uuid: str, pid: int) -> None:
        """Nothing to do: the driver forgets the process when it exits."""

    def prune(self) -> list[int]:
        """Nothing to do."""
        return []


class SimProcessTable:
    """The simulated node: registers real pids through :meth:`SimNode.start_process`.

    The simulator drops a real pid once it no longer exists, but counts a zombie as alive; rank processes left
    behind by a crashed daemon become zombies where PID 1 does not reap orphans (containers), while a driver
    would already have released their contexts. :meth:`prune` drops those.
    """

    def __init__(self, node: SimNode) -> None:
        self.node = node

    def attach(self, uuid: str, pid: int) -> None:
        """Register ``pid`` on ``uuid``; a pid already registered there is left alone."""
        for gpu in self.node.gpus():
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    if ci.uuid == uuid and any(p.pid == pid for p in ci.processes):
                        return
        self.node.start_process(uuid, pid=pid, real=True)

    def detach(self, uuid: str, pid: int) -> None:
        """Remove ``pid`` from the node (already gone is fine)."""
        with contextlib.suppress(SimError):
            self.node.stop_process(pid)

    def prune(self) -> list[int]:
        """Remove registered real processes that have exited or are zombies."""
        gone = []
        for gpu in self.node.gpus():
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    for p in ci.processes:
                        if p.real and not process_alive(p.pid):
                            gone.append(p.pid)
        for pid in gone:
            with contextlib.suppress(SimError):
                self.node.stop_process(pid)
        return gone
