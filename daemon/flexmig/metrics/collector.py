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

Other layers add metric families through :class:`SnapshotMetrics` (the MQTT publisher's health, the actuator's
actions: state that changes between sweeps, collected at every scrape) or :class:`SnapshotFamilies` (detection's
fragmentation figures: computed from the snapshot alone, so written once per snapshot with the rest, see
:mod:`flexmig.metrics.scrape`), and reuse :func:`gpu_label_set`/:func:`instance_label_set` so every flexmig series
joins on the same labels. The families are written through :class:`~flexmig.metrics.exposition.Writer`, at the
node's detail level.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from prometheus_client.core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from flexmig import __version__
from flexmig.metrics.exposition import LabelSet, Writer, label_set
from flexmig.metrics.families import GPU_LABELS, INSTANCE_LABELS, NODE_LABELS, Level
from flexmig.metrics.server import MetricsServer  # the HTTP server has a module of its own
from flexmig.telemetry.snapshot import GpuSnapshot, HostProcess, InstanceSnapshot, Snapshot

__all__ = [
    "GPU_LABELS",
    "INSTANCE_LABELS",
    "Extension",
    "MetricsServer",
    "SnapshotCollector",
    "SnapshotFamilies",
    "SnapshotMetrics",
    "build_registry",
    "device_name",
    "gpu_label_set",
    "gpu_labels",
    "instance_label_set",
    "instance_labels",
    "live_metrics",
    "node_label_set",
    "write_snapshot",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

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


def node_label_set(snap: Snapshot, out: Writer) -> LabelSet:
    """The node's labels (``Hostname``), formatted once per ``out``."""
    return out.labels("node", lambda: label_set(NODE_LABELS, [snap.hostname]))


def gpu_label_set(snap: Snapshot, gpu: GpuSnapshot, out: Writer) -> LabelSet:
    """:func:`gpu_labels`, formatted once per ``out`` for every series of the GPU."""
    return out.labels(("gpu", gpu.index), lambda: label_set(GPU_LABELS, gpu_labels(snap, gpu)))


def instance_label_set(snap: Snapshot, inst: InstanceSnapshot, out: Writer) -> LabelSet:
    """:func:`instance_labels`, formatted once per ``out`` for every series of the instance."""
    key = ("instance", inst.gpu_index, inst.gpu_instance_id, inst.compute_instance_id)
    return out.labels(key, lambda: label_set(INSTANCE_LABELS, instance_labels(snap, inst)))


class SnapshotMetrics(Protocol):
    """Extra metric families collected at every scrape (state that changes between sweeps), on our labels."""

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        """The families for ``snapshot``; must be cheap and must not do I/O (it runs inside a scrape)."""
        ...


@runtime_checkable
class SnapshotFamilies(Protocol):
    """Extra families computed from the snapshot alone, written once per snapshot with the node's own."""

    def write(self, snapshot: Snapshot, out: Writer) -> None:
        """Write the families for ``snapshot`` into ``out`` (at its detail level); cheap, no I/O."""
        ...


Extension = SnapshotMetrics | SnapshotFamilies


def write_snapshot(snap: Snapshot, out: Writer, extensions: Sequence[object] = ()) -> None:
    """Every family computed from ``snap`` alone: the node's, its GPUs' and instances', then those of the
    ``extensions`` that are :class:`SnapshotFamilies`. One broken extension loses its own series, not the others'."""
    _node_families(snap, out)
    _gpu_families(snap, out)
    _instance_families(snap, out)
    for ext in extensions:
        if not isinstance(ext, SnapshotFamilies):
            continue
        try:
            ext.write(snap, out)
        except Exception:  # one broken extension must not take every other series down with it
            log.exception("metrics extension %r failed; its series are missing from this scrape", ext)


def live_metrics(snap: Snapshot, extensions: Sequence[object]) -> Iterator[Metric]:
    """The families of the extensions that are collected at every scrape (:class:`SnapshotMetrics` only)."""
    for ext in extensions:
        if isinstance(ext, SnapshotFamilies) or not hasattr(ext, "collect"):
            continue
        try:
            families = list(ext.collect(snap))
        except Exception:  # one broken extension must not take every other series down with it
            log.exception("metrics extension %r failed; its series are missing from this scrape", ext)
            continue
        yield from families


class SnapshotCollector(Collector):
    """A prometheus_client collector over the latest snapshot, for prometheus_client's own encoders: what
    flexmigd serves (:class:`~flexmig.metrics.scrape.Exposition`) as library families. Before the first sweep it
    renders nothing. ``detail`` is the level of the families written (default: every family)."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        extensions: Sequence[object] = (),
        *,
        detail: Level = "full",
    ) -> None:
        self._latest = latest
        self._extensions = tuple(extensions)
        self._detail: Level = detail

    def describe(self) -> list[Metric]:
        """Nothing: our families depend on the snapshot, and describing must not call :meth:`collect`."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every flexmig family for the latest snapshot."""
        snap = self._latest()
        if snap is None:
            return
        out = Writer(self._detail, keep=True)
        write_snapshot(snap, out, self._extensions)
        yield from out.metrics()
        yield from live_metrics(snap, self._extensions)


def build_registry(collector: Collector, *, process_metrics: bool = True) -> CollectorRegistry:
    """A fresh registry with ``collector`` (and the standard ``process_*`` series of this process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry


# ---------------------------------------------------------------------------------------------------- families


def _node_families(snap: Snapshot, out: Writer) -> None:
    stats = snap.stats
    host = node_label_set(snap, out)
    info = out.family("flexmig_node")
    if info is not None:
        info.info(host, (__version__, snap.driver_version or "", snap.nvml_version or ""))
    for name, value in (
        ("flexmig_sweeps", stats.sweeps),
        ("flexmig_sweep_cpu_seconds", stats.sweep_cpu_s_total),
        ("flexmig_inventories", stats.inventories),
        ("flexmig_sweep_duration_seconds", stats.last_sweep_s),
        ("flexmig_last_sweep_cpu_seconds", stats.last_sweep_cpu_s),
        ("flexmig_last_sweep_timestamp_seconds", snap.taken_at),
        ("flexmig_window_seconds", snap.window_s),
    ):
        fam = out.family(name)
        if fam is not None:
            fam.add(host, value)
    fam = out.family("flexmig_nvml_errors")
    if fam is not None:
        for (call, error), count in sorted(stats.nvml_errors.items()):
            fam.add(host.extend(("call", "error"), (call, error)), count)
    fam = out.family("flexmig_source_errors")
    if fam is not None:
        for source, count in sorted(stats.source_errors.items()):
            fam.add(host.extend(("source",), (source,)), count)
    if snap.dcgm is not None:
        d = snap.dcgm
        for name, labels, value in (
            ("flexmig_dcgm_up", host.extend(("url",), (d.url,)), 1.0 if d.up else 0.0),
            ("flexmig_dcgm_instances", host.extend(("era",), (d.era or "",)), float(d.instances)),
        ):
            fam = out.family(name)
            if fam is not None:
                fam.add(labels, value)
        fam = out.family("flexmig_dcgm_scrape_age_seconds")
        if d.age_s is not None and fam is not None:
            fam.add(host, d.age_s)


_GPU_VALUES: tuple[tuple[str, Callable[[GpuSnapshot], float | None]], ...] = (
    ("flexmig_gpu_power_watts", lambda g: g.power_w),
    ("flexmig_gpu_power_limit_watts", lambda g: g.power_limit_w),
    ("flexmig_gpu_temperature_celsius", lambda g: g.temperature_c),
    ("flexmig_gpu_sm_clock_hertz", lambda g: None if g.sm_clock_mhz is None else g.sm_clock_mhz * _MHZ),
    ("flexmig_gpu_memory_clock_hertz", lambda g: None if g.mem_clock_mhz is None else g.mem_clock_mhz * _MHZ),
    ("flexmig_gpu_memory_total_bytes", lambda g: g.memory_total_bytes),
    ("flexmig_gpu_mig_mode", lambda g: None if g.mig_current is None else 1.0 if g.mig_current else 0.0),
    ("flexmig_gpu_lost", lambda g: 1.0 if g.lost else 0.0),
    ("flexmig_gpu_mig_instances", lambda g: None if g.lost else len(g.instances)),
    ("flexmig_gpu_free_compute_slices", lambda g: g.free_compute_slices),
    ("flexmig_gpu_free_memory_slices", lambda g: g.free_memory_slices),
)
"""Each per-GPU value family and how to read it off a GPU (None: no series)."""


def _value_families(
    out: Writer, table: Sequence[tuple[str, Callable[[_T], float | None]]], rows: Sequence[tuple[_T, LabelSet]]
) -> None:
    """The value families of ``table`` in its order, each with a series for every row (a GPU or an instance, with
    its labels) whose value is not None; a family this detail leaves out is skipped."""
    for name, read in table:
        fam = out.family(name)
        if fam is None:
            continue
        for item, labels in rows:
            value = read(item)
            if value is not None:
                fam.add(labels, value)


def _gpu_families(snap: Snapshot, out: Writer) -> None:
    # The families in catalogue order, each with every GPU's series; a family this detail leaves out is skipped.
    gpus = [(gpu, gpu_label_set(snap, gpu, out)) for gpu in snap.gpus]
    _value_families(out, _GPU_VALUES, gpus)
    fam = out.family("flexmig_gpu_creatable_instances")
    if fam is not None:
        for gpu, labels in gpus:
            for profile, n in gpu.creatable.items():
                fam.add(labels.extend(("profile",), (profile,)), n)


_INSTANCE_VALUES: tuple[tuple[str, Callable[[InstanceSnapshot], float | None]], ...] = (
    ("flexmig_mig_memory_total_bytes", lambda i: i.memory_total_bytes),
    ("flexmig_mig_memory_used_bytes", lambda i: i.memory_used_bytes),
    ("flexmig_mig_memory_used_mean_bytes", lambda i: _window(i.memory_used_window, "mean")),
    ("flexmig_mig_memory_used_max_bytes", lambda i: _window(i.memory_used_window, "max")),
    ("flexmig_mig_memory_used_p95_bytes", lambda i: _window(i.memory_used_window, "p95")),
    ("flexmig_mig_sm_active_ratio", lambda i: None if i.activity is None else i.activity.sm_active),
    ("flexmig_mig_sm_active_mean_ratio", lambda i: _window(i.sm_active_window, "mean")),
    ("flexmig_mig_sm_active_min_ratio", lambda i: _window(i.sm_active_window, "min")),
    ("flexmig_mig_sm_active_p95_ratio", lambda i: _window(i.sm_active_window, "p95")),
    ("flexmig_mig_sm_occupancy_ratio", lambda i: None if i.activity is None else i.activity.sm_occupancy),
    ("flexmig_mig_dram_active_ratio", lambda i: None if i.activity is None else i.activity.dram_active),
    ("flexmig_mig_tensor_active_ratio", lambda i: None if i.activity is None else i.activity.tensor_active),
    ("flexmig_mig_gr_engine_active_ratio", lambda i: None if i.activity is None else i.activity.gr_engine_active),
    ("flexmig_mig_processes", lambda i: None if i.processes is None else len(i.processes)),
    ("flexmig_mig_processes_cpu_ratio", lambda i: _host_sum(i, lambda h: h.cpu_ratio)),
    ("flexmig_mig_processes_resident_memory_bytes", lambda i: _host_sum(i, lambda h: h.rss_bytes)),
    ("flexmig_mig_idle_seconds", lambda i: i.idle_seconds),
    ("flexmig_mig_compute_slices", lambda i: i.compute_slices),
    ("flexmig_mig_memory_slices", lambda i: i.memory_slices),
    ("flexmig_mig_placement_start", lambda i: i.start),
)
"""Each per-instance value family and how to read it off an instance (None: no series)."""


def _window(stats: object, attr: str) -> float | None:
    """One statistic of a window (None when there is no window yet)."""
    return None if stats is None else float(getattr(stats, attr))


def _host_sum(inst: InstanceSnapshot, read: Callable[[HostProcess], float | None]) -> float | None:
    """The sum of a host figure over the instance's processes the host can see (None when it sees none)."""
    if inst.processes is None:
        return None
    known = [v for p in inst.processes if p.host is not None and (v := read(p.host)) is not None]
    return sum(known) if known else None


def _instance_families(snap: Snapshot, out: Writer) -> None:
    instances = [(inst, instance_label_set(snap, inst, out)) for gpu in snap.gpus for inst in gpu.instances]
    _value_families(out, _INSTANCE_VALUES, instances)
    fam = out.family("flexmig_mig_activity_source")
    if fam is not None:
        for inst, labels in instances:
            if inst.activity is not None:
                fam.info(labels, (inst.activity.source,))
