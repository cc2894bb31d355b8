"""The actuator's three NVML operations, run off the event loop on the one NVML worker thread.

NVML calls block (a GPU-instance create can take seconds on hardware), and reconfiguration steps must never
interleave with each other or with a sampling sweep half-way through re-enumeration, so every call goes through an
:class:`Offload`: the :meth:`~flexmig.nvml.worker.NvmlWorker.call` of the process's one NVML worker thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from flexmig.nvml.types import Inventory, MigDeviceInfo

__all__ = ["MigOps", "NvmlLike", "NvmlMigOps", "Offload"]

_T = TypeVar("_T")


class Offload(Protocol):
    """Runs a blocking function on the NVML worker thread and awaits its result."""

    def __call__(self, fn: Callable[[], _T]) -> Awaitable[_T]:
        """Schedule ``fn``; the awaitable gives its result or raises its exception."""


class NvmlLike(Protocol):
    """The part of :class:`flexmig.nvml.Nvml` the actuator uses."""

    def inventory(self) -> Inventory:
        """The node's GPUs, GPU instances and MIG devices with their processes."""

    def create_instance(self, gpu_index: int, profile_name: str, start: int) -> MigDeviceInfo:
        """Create a GPU instance with one compute instance spanning it; returns the new MIG device."""

    def destroy_instance(self, gpu_index: int, gpu_instance_id: int) -> None:
        """Destroy a GPU instance and its compute instances."""


class MigOps(Protocol):
    """What the executor needs from NVML, as coroutines."""

    async def inventory(self) -> Inventory:
        """A fresh inventory."""

    async def create(self, gpu: int, profile: str, start: int) -> MigDeviceInfo:
        """Create ``profile`` at memory slice ``start`` on GPU ``gpu``."""

    async def destroy(self, gpu: int, gpu_instance_id: int) -> None:
        """Destroy GPU instance ``gpu_instance_id`` of GPU ``gpu``."""


class NvmlMigOps:
    """:class:`MigOps` over a :class:`NvmlLike` through an :class:`Offload`. NVML errors arrive as NvmlCallError."""

    def __init__(self, nvml: NvmlLike, offload: Offload) -> None:
        self.nvml = nvml
        self.offload = offload

    async def inventory(self) -> Inventory:
        """``nvidia-smi mig -lgi`` plus ``nvidia-smi -L`` and the process table."""
        return await self.offload(self.nvml.inventory)

    async def create(self, gpu: int, profile: str, start: int) -> MigDeviceInfo:
        """``nvidia-smi mig -i GPU -cgi PROFILE:START -C``."""
        return await self.offload(lambda: self.nvml.create_instance(gpu, profile, start))

    async def destroy(self, gpu: int, gpu_instance_id: int) -> None:
        """``nvidia-smi mig -i GPU -gi ID -dci`` then ``-dgi``."""
        await self.offload(lambda: self.nvml.destroy_instance(gpu, gpu_instance_id))
