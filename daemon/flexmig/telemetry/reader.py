"""The sampler's :class:`~flexmig.telemetry.sampler.NodeReader` over an NVML session."""

from __future__ import annotations

from flexmig.nvml import GpmWindows, GpuSample, Inventory, Nvml

__all__ = ["NvmlReader"]


class NvmlReader:
    """The sampler's view of an NVML session: inventory, and sweeps that carry GPM windows from one to the next."""

    def __init__(self, nvml: Nvml, gpm: GpmWindows | None) -> None:
        self.nvml = nvml
        self.gpm = gpm

    def inventory(self) -> Inventory:
        """``Nvml.inventory``."""
        return self.nvml.inventory()

    def sample(self) -> tuple[GpuSample, ...]:
        """``Nvml.sample`` with this reader's GPM windows."""
        return self.nvml.sample(self.gpm)
