"""flexmig.telemetry: samplers (NVML with GPM, dcgm-exporter, psutil) -> immutable Snapshots; ring buffers.

Modules, one idea each:

* ``ring``: bounded ring buffers of timed samples and their window statistics (mean, min, max, p95);
* ``snapshot``: the immutable values every reader sees (Snapshot, GpuSnapshot,
  GpuInstanceSnapshot, InstanceSnapshot, ...);
* ``store``: turns one sweep's readings into the next Snapshot, keeping per-instance history;
* ``sampler``: the sampling loop (cadence, re-inventory, error counting) and the DCGM/workload loops, on the one
  NVML thread (:class:`flexmig.nvml.worker.NvmlWorker`);
* ``dcgm``: dcgm-exporter scrape and parser (both naming eras); ``host``: psutil facts per GPU process;
* ``publish``: the latest-snapshot hub with enricher and subscriber hooks;
* ``reader``: the sampler's view of an NVML session; ``settings``: the loops' settings.

Which node NVML reads (the driver, or a simulated one) is the wiring's choice (``flexmig.wiring.backend``).
"""

from flexmig.telemetry.publish import Enricher, SnapshotHub, Subscriber
from flexmig.telemetry.ring import RingBuffer, WindowStats
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import (
    DcgmStatus,
    GpuInstanceSnapshot,
    GpuSnapshot,
    HostProcess,
    InstanceActivity,
    InstanceSnapshot,
    ProcessSnapshot,
    SamplingStats,
    Snapshot,
)

__all__ = [
    "DcgmStatus",
    "Enricher",
    "GpuInstanceSnapshot",
    "GpuSnapshot",
    "HostProcess",
    "InstanceActivity",
    "InstanceSnapshot",
    "ProcessSnapshot",
    "RingBuffer",
    "SamplingStats",
    "Snapshot",
    "SnapshotHub",
    "Subscriber",
    "TelemetrySettings",
    "WindowStats",
]
