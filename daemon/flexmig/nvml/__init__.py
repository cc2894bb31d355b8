"""flexmig's NVML layer, the only production code that imports pynvml: inventory, sampling (with GPM), MIG
create/destroy, and the one worker thread every NVML call runs on.

NVML errors never leave this package as pynvml exceptions: reads record them as :class:`NvmlIssue` and give None,
actions raise :class:`~flexmig.errors.NvmlCallError` subclasses.
"""

from flexmig.nvml.client import Nvml
from flexmig.nvml.gpm import GpmWindows
from flexmig.nvml.types import (
    ComputeInstanceInfo,
    GpmActivity,
    GpuInfo,
    GpuInstanceInfo,
    GpuSample,
    Inventory,
    MigDeviceInfo,
    MigDeviceSample,
    NvmlIssue,
    ProcessInfo,
)
from flexmig.nvml.worker import NvmlWorker

__all__ = [
    "ComputeInstanceInfo",
    "GpmActivity",
    "GpmWindows",
    "GpuInfo",
    "GpuInstanceInfo",
    "GpuSample",
    "Inventory",
    "MigDeviceInfo",
    "MigDeviceSample",
    "Nvml",
    "NvmlIssue",
    "NvmlWorker",
    "ProcessInfo",
]
