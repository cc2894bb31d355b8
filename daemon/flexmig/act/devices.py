"""Telling the node which process runs on which MIG device.

On real hardware the CUDA driver does this by itself: a rank that opens its MIG device shows up in NVML's process
list for it. The simulated node cannot see CUDA contexts, so the supervisor registers each rank's real pid on its
MIG device, and NVML (ours, nvitop's) lists it there. Both are :class:`DeviceProcessTable` implementations
(:class:`DriverProcessTable` here, ``flexmig.sim.SimProcessTable`` beside the simulator); the wiring that opened the
node picks one, and the actuator never asks which one it has.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["DeviceProcessTable", "DriverProcessTable"]


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
