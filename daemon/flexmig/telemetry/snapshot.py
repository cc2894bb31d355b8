"""The immutable picture of the node after one sweep: what every reader (Prometheus, MQTT, detect) sees.

The sampling loop builds a new :class:`Snapshot` after every sweep and swaps it in whole (one reference
assignment), so a reader on another thread (the Prometheus server's) always sees one consistent sweep and never
blocks the loop. Fields that could not be read are ``None`` and are exported as absent series, never as 0.

``findings`` is the hook for the detect layer: an enricher (a pure function ``Snapshot -> Snapshot``, see
``flexmig.telemetry.publish``) may attach them with :func:`dataclasses.replace`; the telemetry layer itself leaves
it empty and never looks inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flexmig.mig import Offer
from flexmig.mig.fastinit import fast_init
from flexmig.telemetry.ring import WindowStats

__all__ = [
    "ActivitySource",
    "DcgmStatus",
    "GpuInstanceSnapshot",
    "GpuSnapshot",
    "HostProcess",
    "InstanceActivity",
    "InstanceSnapshot",
    "ProcessSnapshot",
    "SamplingStats",
    "Snapshot",
]

ActivitySource = Literal["gpm", "dcgm"]


@dataclass(frozen=True, slots=True)
class HostProcess:
    """What the host says about one process (through psutil and /proc), read in the same sweep.

    ``cpu_ratio`` is CPU time over wall time since the previous sweep, in cores (1.0 = one core busy); None on the
    first sweep that sees the process, since a rate needs two readings.
    """

    pid: int
    user: str | None
    cmdline: tuple[str, ...] | None
    cgroup: str | None
    cpu_ratio: float | None
    rss_bytes: int | None


@fast_init
@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
    """A compute process on a MIG instance: NVML's view (PID, GPU memory) joined with the host's.

    ``host`` is None when the process was gone by the time the host was asked (it exited between the two
    reads), or when the PID belongs to another PID namespace (a container) and the host cannot see it.
    """

    pid: int
    gpu_memory_bytes: int | None
    host: HostProcess | None


@fast_init
@dataclass(frozen=True, slots=True)
class InstanceActivity:
    """Activity of one GPU instance over the last window, as ratios 0..1, and where it came from.

    GPM (Hopper and newer, from NVML) or a dcgm-exporter scrape (the only source on Ampere). When both are at
    hand, DCGM is preferred (it is what dashboards built on dcgm-exporter already show), and GPM fills the fields
    DCGM did not export.
    """

    source: ActivitySource
    window_s: float | None
    sm_active: float | None
    sm_occupancy: float | None
    dram_active: float | None
    tensor_active: float | None
    gr_engine_active: float | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """One MIG instance (a GPU instance with one of its compute instances) as the sweep saw it."""

    gpu_index: int
    gpu_uuid: str
    model_name: str
    mig_uuid: str
    mig_index: int
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    profile_name: str  # "3g.71gb"; "unknown" only if neither NVML nor our catalogue could name it
    start: int  # first memory slice of the placement
    memory_slices: int
    compute_slices: int | None  # None when the profile is not in our catalogue (a future GPU)
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    processes: tuple[ProcessSnapshot, ...] | None  # None: NVML would not list them
    activity: InstanceActivity | None
    sm_active_window: WindowStats | None
    memory_used_window: WindowStats | None
    idle_seconds: float | None  # time since the instance last ran a process or showed activity
    first_seen: float  # monotonic time this instance (this GI/CI pair with this UUID) first appeared
    pci_bus_id: str | None = None  # the parent GPU's (GpuSnapshot.pci_bus_id), for dcgm-exporter's join labels


@dataclass(frozen=True, slots=True)
class GpuInstanceSnapshot:
    """One GPU instance as the last inventory saw it (``nvidia-smi mig -lgi``), with or without a MIG device.

    A GPU instance holds its memory and compute slices from creation, even before it has a compute instance
    (``nvidia-smi mig -cgi 9`` without ``-C``): it is then no MIG device, has no telemetry and is missing from
    :attr:`GpuSnapshot.instances`, but layouts built from a snapshot must still count its slices as taken.
    """

    gpu_instance_id: int
    profile_id: int
    profile_name: str  # as in InstanceSnapshot.profile_name
    start: int  # first memory slice of the placement
    memory_slices: int
    compute_slices: int | None  # None when the profile is not in our catalogue
    compute_instances: int  # 0: no MIG device (nothing can run on it yet)


@fast_init
@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One physical GPU: its sensors, MIG state, free capacity and instances."""

    index: int
    uuid: str
    model_name: str
    memory_total_bytes: int | None
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    mig_current: bool | None
    lost: bool
    free_compute_slices: int | None  # None when the model is not in our catalogue or MIG is off
    free_memory_slices: int | None
    creatable: Mapping[str, int]  # profile name -> how many could still be created now (empty if unknown)
    instances: tuple[InstanceSnapshot, ...]
    # Every GPU instance of the last inventory, those without a MIG device included (empty when lost); the
    # placements layouts are built from. Defaults to none for snapshots made by hand.
    gpu_instances: tuple[GpuInstanceSnapshot, ...] = ()
    pci_bus_id: str | None = None  # "00000000:18:00.0" as NVML and dcgm-exporter write it; None if NVML would not say
    power_limit_w: float | None = None  # the enforced power limit, from the last inventory
    offers: tuple[Offer, ...] | None = None  # the GPU-instance profiles its driver offers (None: not known)


@dataclass(frozen=True, slots=True)
class DcgmStatus:
    """How the last dcgm-exporter scrape went (present only when a DCGM endpoint is configured)."""

    url: str
    up: bool
    era: str | None  # "legacy" (DCGM_FI_PROF_GR_ENGINE_ACTIVE, MiB) or "4.9" (..._UTIL_RATIO, bytes)
    instances: int  # per-instance rows found in the last good scrape
    age_s: float | None  # seconds since the last good scrape


@dataclass(frozen=True, slots=True)
class SamplingStats:
    """The daemon's own cost and troubles, cumulative since start (counters) or of the last sweep (gauges)."""

    sweeps: int
    last_sweep_s: float  # wall time of the last sweep
    last_sweep_cpu_s: float  # CPU time of the last sweep (NVML thread plus the loop's own work)
    sweep_cpu_s_total: float
    inventories: int  # full inventories taken (the first one, and each re-inventory)
    nvml_errors: Mapping[tuple[str, str], int]  # (call, NVML error name) -> count
    source_errors: Mapping[str, int]  # source ("nvml", "dcgm", "host", "sweep") -> failed reads
    lost_gpus: tuple[str, ...] = ()  # UUIDs of GPUs that answered GPU_IS_LOST


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole node after one sweep."""

    taken_at: float  # wall-clock seconds (Unix time), for people and MQTT
    monotonic: float  # the monotonic time of the sweep, for windows and ages
    hostname: str
    driver_version: str | None
    nvml_version: str | None
    window_s: float
    gpus: tuple[GpuSnapshot, ...]
    stats: SamplingStats
    dcgm: DcgmStatus | None = None
    findings: tuple[Any, ...] = field(default=())  # filled by the detect layer's enricher; opaque here

    def instances(self) -> list[InstanceSnapshot]:
        """Every MIG instance of the node, in GPU then MIG-index order."""
        return [i for g in self.gpus for i in g.instances]
