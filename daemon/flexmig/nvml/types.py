"""Immutable values that ``flexmig.nvml`` returns: the node's inventory and per-sweep samples.

Convention (from nvitop's api): a field NVML could not give (NOT_SUPPORTED, NO_PERMISSION, an error on that
one call) is ``None``, typed as such, and exported as an absent series, never as 0. Errors on one GPU or one
MIG device are recorded in ``errors`` on the nearest object and never abort the rest of the walk.

Nothing here holds a pynvml handle: handles are invalid after every reconfiguration, so callers keep UUIDs and
(GPU index, GPU-instance ID) pairs, and ``nvml`` resolves them again on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flexmig.mig import Offer
from flexmig.mig.fastinit import fast_init

__all__ = [
    "ComputeInstanceInfo",
    "GpmActivity",
    "GpuInfo",
    "GpuInstanceInfo",
    "GpuSample",
    "Inventory",
    "MigDeviceInfo",
    "MigDeviceSample",
    "NvmlIssue",
    "ProcessInfo",
]


@dataclass(frozen=True, slots=True)
class NvmlIssue:
    """One NVML call that failed during a walk: which call, on what, and NVML's code and name."""

    call: str
    code: int
    name: str
    target: str  # "GPU 0", "GPU 0 GI 7", "MIG-...": what an operator would look up


@fast_init
@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A compute process on a MIG device (``nvidia-smi``'s process table). Memory None when NVML hides it."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class ComputeInstanceInfo:
    """A compute instance inside a GPU instance (``nvidia-smi mig -lci``)."""

    id: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class GpuInstanceInfo:
    """A GPU instance (``nvidia-smi mig -lgi``): ID chosen by the driver, profile, placement in memory slices."""

    id: int
    profile_id: int
    profile_name: str | None  # "3g.71gb", from NVML's v2 profile name; None if NVML would not say
    start: int
    size: int
    compute_instances: tuple[ComputeInstanceInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class MigDeviceInfo:
    """A MIG device (a GI/CI pair CUDA can see), as ``nvidia-smi -L`` lists it under its GPU."""

    index: int  # the MIG-device index on its parent GPU, as nvmlDeviceGetMigDeviceHandleByIndex takes it
    uuid: str  # "MIG-..."; what CUDA_VISIBLE_DEVICES takes
    gpu_instance_id: int
    compute_instance_id: int
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    processes: tuple[ProcessInfo, ...] | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU and its MIG state."""

    index: int
    uuid: str
    name: str | None
    memory_total_bytes: int | None
    mig_current: bool | None  # None: the GPU has no MIG (NOT_SUPPORTED)
    mig_pending: bool | None
    gpu_instances: tuple[GpuInstanceInfo, ...] = ()
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    lost: bool = False  # GPU_IS_LOST seen: nothing else about it can be trusted
    errors: tuple[NvmlIssue, ...] = ()
    pci_bus_id: str | None = None  # "00000000:18:00.0" (nvidia-smi --query-gpu=pci.bus_id); None if NVML would not say
    power_limit_w: float | None = None  # the enforced power limit (nvidia-smi --query-gpu=enforced.power.limit)
    # The GPU-instance profiles its driver offers (nvidia-smi mig -lgip); None with MIG off or when NVML would not
    # say. Releases differ (older A100 drivers offer no 1g.20gb): the planner plans only these.
    offers: tuple[Offer, ...] | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    """The whole node as NVML shows it at one moment."""

    driver_version: str | None
    nvml_version: str | None
    gpus: tuple[GpuInfo, ...]
    errors: tuple[NvmlIssue, ...] = ()

    def mig_devices(self) -> list[tuple[GpuInfo, MigDeviceInfo]]:
        """Every MIG device of the node with its parent GPU, in GPU then MIG-index order."""
        return [(g, d) for g in self.gpus for d in g.mig_devices]


@fast_init
@dataclass(frozen=True, slots=True)
class GpmActivity:
    """GPM metrics of one GPU instance over one window, as ratios 0..1 (NVML gives percent; we divide)."""

    window_s: float
    sm_active: float | None
    sm_occupancy: float | None
    dram_bw: float | None
    tensor_active: float | None


@fast_init
@dataclass(frozen=True, slots=True)
class MigDeviceSample:
    """What one sweep read for one MIG device."""

    uuid: str
    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    processes: tuple[ProcessInfo, ...] | None
    activity: GpmActivity | None  # None on Ampere, on the first sweep after (re)creation, or when GPM failed


@fast_init
@dataclass(frozen=True, slots=True)
class GpuSample:
    """What one sweep read for one GPU (``nvidia-smi -q -d POWER,TEMPERATURE,CLOCK``)."""

    index: int
    uuid: str
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    mig_current: bool | None
    lost: bool = False
    mig_devices: tuple[MigDeviceSample, ...] = ()
    errors: tuple[NvmlIssue, ...] = field(default=())
