"""The Prometheus exporter: one custom collector over the latest immutable snapshot, and its HTTP server.

Rules:

* a scrape never calls NVML: :meth:`SnapshotCollector.collect` only reads the snapshot the sampling loop last
  published (one reference read, so a scrape on the server's thread sees one whole sweep);
* every family is declared once in :mod:`flexmig.metrics.families` (name, type, labels, help), and built from
  there; names carry the ``flexmig_`` prefix and base units (bytes, seconds, hertz, watts, ratios 0..1), counters
  end in ``_total``, and no two families share a name, so the exposition is valid OpenMetrics (what Prometheus
  asks for first) as well as the classic text format;
* identity labels follow dcgm-exporter (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``GPU_I_ID``,
  ``GPU_I_PROFILE``, ``Hostname``) so our series join dcgm-exporter's on one panel; see the catalogue;
* a value that could not be read is an absent series, never 0; an instance destroyed since the last sweep is
  simply not in the snapshot, so its series vanish at the next scrape.

Other layers add metric families through :class:`SnapshotMetrics` (the detect layer's fragmentation figures, for
one) and reuse :func:`gpu_labels`/:func:`instance_labels` so every flexmig series joins on the same labels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from flexmig import __version__
from flexmig.metrics.families import GPU_LABELS, INSTANCE_LABELS, by_name
from flexmig.metrics.server import MetricsServer  # the HTTP server has a module of its own
from flexmig.telemetry.snapshot import GpuSnapshot, InstanceSnapshot, Snapshot

__all__ = [
    "GPU_LABELS",
    "INSTANCE_LABELS",
    "MetricsServer",
    "SnapshotCollector",
    "SnapshotMetrics",
    "build_registry",
    "device_name",
    "gpu_labels",
    "instance_labels",
]

log = logging.getLogger(__name__)

_MHZ = 1_000_000.0


def device_name(gpu_index: int) -> str:
    """dcgm-exporter's ``device`` label for a GPU: ``nvidia`` and the GPU's index (``nvidia0``)."""
    return f"nvidia{gpu_index}"


def gpu_labels(snap: Snapshot, gpu: GpuSnapshot) -> list[str]:
    """Values of :data:`GPU_LABELS` for one GPU, in order (an unknown PCI bus ID is empty, as dcgm-exporter has
    it)."""
    return [str(gpu.index), gpu.uuid, gpu.pci_bus_id or "", device_name(gpu.index), gpu.model_name, snap.hostname]


def instance_labels(snap: Snapshot, inst: InstanceSnapshot) -> list[str]:
    """Values of :data:`INSTANCE_LABELS` for one MIG instance, in order."""
    return [
        str(inst.gpu_index),
        inst.gpu_uuid,
        inst.pci_bus_id or "",
        device_name(inst.gpu_index),
        inst.model_name,
        snap.hostname,
        str(inst.gpu_instance_id),
        inst.profile_name,
        str(inst.compute_instance_id),
        inst.mig_uuid,
    ]


class SnapshotMetrics(Protocol):
    """Extra metric families computed from a snapshot (another layer's figures on our labels)."""

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        """The families for ``snapshot``; must be cheap and must not do I/O (it runs inside a scrape)."""
        ...


class SnapshotCollector(Collector):
    """A prometheus_client collector that renders the latest snapshot; before the first sweep it renders nothing."""

    def __init__(self, latest: Callable[[], Snapshot | None], extensions: Sequence[SnapshotMetrics] = ()) -> None:
        self._latest = latest
        self._extensions = tuple(extensions)

    def describe(self) -> list[Metric]:
        """Nothing: our families depend on the snapshot, and describing must not call :meth:`collect`."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every flexmig family for the latest snapshot."""
        snap = self._latest()
        if snap is None:
            return
        yield from _node_families(snap)
        yield from _gpu_families(snap)
        yield from _instance_families(snap)
        for ext in self._extensions:
            try:
                families = list(ext.collect(snap))
            except Exception:  # one broken extension must not take every other series down with it
                log.exception("metrics extension %r failed; its series are missing from this scrape", ext)
                continue
            yield from families


def build_registry(collector: SnapshotCollector, *, process_metrics: bool = True) -> CollectorRegistry:
    """A fresh registry with our collector (and the standard ``process_*`` series of this process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry


# ---------------------------------------------------------------------------------------------------- families


def _node_families(snap: Snapshot) -> Iterator[Metric]:
    stats = snap.stats
    host = [snap.hostname]
    info = by_name("flexmig_node").info()
    info.add_metric(
        host,
        {"version": __version__, "driver_version": snap.driver_version or "", "nvml_version": snap.nvml_version or ""},
    )
    yield info
    for name, value in (
        ("flexmig_sweeps", stats.sweeps),
        ("flexmig_sweep_cpu_seconds", stats.sweep_cpu_s_total),
        ("flexmig_inventories", stats.inventories),
    ):
        c = by_name(name).counter()
        c.add_metric(host, value)
        yield c
    for name, value in (
        ("flexmig_sweep_duration_seconds", stats.last_sweep_s),
        ("flexmig_last_sweep_cpu_seconds", stats.last_sweep_cpu_s),
        ("flexmig_last_sweep_timestamp_seconds", snap.taken_at),
        ("flexmig_window_seconds", snap.window_s),
    ):
        g = by_name(name).gauge()
        g.add_metric(host, value)
        yield g
    c = by_name("flexmig_nvml_errors").counter()
    for (call, error), count in sorted(stats.nvml_errors.items()):
        c.add_metric([*host, call, error], count)
    yield c
    c = by_name("flexmig_source_errors").counter()
    for source, count in sorted(stats.source_errors.items()):
        c.add_metric([*host, source], count)
    yield c
    if snap.dcgm is not None:
        d = snap.dcgm
        g = by_name("flexmig_dcgm_up").gauge()
        g.add_metric([*host, d.url], 1.0 if d.up else 0.0)
        yield g
        g = by_name("flexmig_dcgm_instances").gauge()
        g.add_metric([*host, d.era or ""], d.instances)
        yield g
        if d.age_s is not None:
            g = by_name("flexmig_dcgm_scrape_age_seconds").gauge()
            g.add_metric(host, d.age_s)
            yield g


def _gpu_families(snap: Snapshot) -> Iterator[Metric]:
    power = by_name("flexmig_gpu_power_watts").gauge()
    limit = by_name("flexmig_gpu_power_limit_watts").gauge()
    temp = by_name("flexmig_gpu_temperature_celsius").gauge()
    sm_clock = by_name("flexmig_gpu_sm_clock_hertz").gauge()
    mem_clock = by_name("flexmig_gpu_memory_clock_hertz").gauge()
    mem_total = by_name("flexmig_gpu_memory_total_bytes").gauge()
    mig = by_name("flexmig_gpu_mig_mode").gauge()
    lost = by_name("flexmig_gpu_lost").gauge()
    count = by_name("flexmig_gpu_mig_instances").gauge()
    free_c = by_name("flexmig_gpu_free_compute_slices").gauge()
    free_m = by_name("flexmig_gpu_free_memory_slices").gauge()
    creatable = by_name("flexmig_gpu_creatable_instances").gauge()
    for gpu in snap.gpus:
        labels = gpu_labels(snap, gpu)
        lost.add_metric(labels, 1.0 if gpu.lost else 0.0)
        if gpu.power_w is not None:
            power.add_metric(labels, gpu.power_w)
        if gpu.power_limit_w is not None:
            limit.add_metric(labels, gpu.power_limit_w)
        if gpu.temperature_c is not None:
            temp.add_metric(labels, gpu.temperature_c)
        if gpu.sm_clock_mhz is not None:
            sm_clock.add_metric(labels, gpu.sm_clock_mhz * _MHZ)
        if gpu.mem_clock_mhz is not None:
            mem_clock.add_metric(labels, gpu.mem_clock_mhz * _MHZ)
        if gpu.memory_total_bytes is not None:
            mem_total.add_metric(labels, gpu.memory_total_bytes)
        if gpu.mig_current is not None:
            mig.add_metric(labels, 1.0 if gpu.mig_current else 0.0)
        if not gpu.lost:
            count.add_metric(labels, len(gpu.instances))
        if gpu.free_compute_slices is not None:
            free_c.add_metric(labels, gpu.free_compute_slices)
        if gpu.free_memory_slices is not None:
            free_m.add_metric(labels, gpu.free_memory_slices)
        for profile, n in gpu.creatable.items():
            creatable.add_metric([*labels, profile], n)
    yield from (power, limit, temp, sm_clock, mem_clock, mem_total, mig, lost, count, free_c, free_m, creatable)


def _instance_families(snap: Snapshot) -> Iterator[Metric]:
    mem_total = by_name("flexmig_mig_memory_total_bytes").gauge()
    mem_used = by_name("flexmig_mig_memory_used_bytes").gauge()
    mem_mean = by_name("flexmig_mig_memory_used_mean_bytes").gauge()
    mem_max = by_name("flexmig_mig_memory_used_max_bytes").gauge()
    mem_p95 = by_name("flexmig_mig_memory_used_p95_bytes").gauge()
    sm = by_name("flexmig_mig_sm_active_ratio").gauge()
    sm_mean = by_name("flexmig_mig_sm_active_mean_ratio").gauge()
    sm_min = by_name("flexmig_mig_sm_active_min_ratio").gauge()
    sm_p95 = by_name("flexmig_mig_sm_active_p95_ratio").gauge()
    occ = by_name("flexmig_mig_sm_occupancy_ratio").gauge()
    dram = by_name("flexmig_mig_dram_active_ratio").gauge()
    tensor = by_name("flexmig_mig_tensor_active_ratio").gauge()
    gr = by_name("flexmig_mig_gr_engine_active_ratio").gauge()
    source = by_name("flexmig_mig_activity_source").info()
    procs = by_name("flexmig_mig_processes").gauge()
    cpu = by_name("flexmig_mig_processes_cpu_ratio").gauge()
    rss = by_name("flexmig_mig_processes_resident_memory_bytes").gauge()
    idle = by_name("flexmig_mig_idle_seconds").gauge()
    c_slices = by_name("flexmig_mig_compute_slices").gauge()
    m_slices = by_name("flexmig_mig_memory_slices").gauge()
    start = by_name("flexmig_mig_placement_start").gauge()

    for gpu in snap.gpus:
        for inst in gpu.instances:
            labels = instance_labels(snap, inst)
            m_slices.add_metric(labels, inst.memory_slices)
            start.add_metric(labels, inst.start)
            if inst.compute_slices is not None:
                c_slices.add_metric(labels, inst.compute_slices)
            if inst.memory_total_bytes is not None:
                mem_total.add_metric(labels, inst.memory_total_bytes)
            if inst.memory_used_bytes is not None:
                mem_used.add_metric(labels, inst.memory_used_bytes)
            w = inst.memory_used_window
            if w is not None:
                mem_mean.add_metric(labels, w.mean)
                mem_max.add_metric(labels, w.max)
                mem_p95.add_metric(labels, w.p95)
            a = inst.activity
            if a is not None:
                source.add_metric(labels, {"source": a.source})
                for fam, value in ((sm, a.sm_active), (occ, a.sm_occupancy), (dram, a.dram_active)):
                    if value is not None:
                        fam.add_metric(labels, value)
                for fam, value in ((tensor, a.tensor_active), (gr, a.gr_engine_active)):
                    if value is not None:
                        fam.add_metric(labels, value)
            w = inst.sm_active_window
            if w is not None:
                sm_mean.add_metric(labels, w.mean)
                sm_min.add_metric(labels, w.min)
                sm_p95.add_metric(labels, w.p95)
            if inst.processes is not None:
                procs.add_metric(labels, len(inst.processes))
                hosts = [p.host for p in inst.processes if p.host is not None]
                cpus = [h.cpu_ratio for h in hosts if h.cpu_ratio is not None]
                if cpus:
                    cpu.add_metric(labels, sum(cpus))
                rsses = [h.rss_bytes for h in hosts if h.rss_bytes is not None]
                if rsses:
                    rss.add_metric(labels, sum(rsses))
            if inst.idle_seconds is not None:
                idle.add_metric(labels, inst.idle_seconds)
    yield from (mem_total, mem_used, mem_mean, mem_max, mem_p95, sm, sm_mean, sm_min, sm_p95, occ, dram, tensor, gr)
    yield from (source, procs, cpu, rss, idle, c_slices, m_slices, start)

