"""Prometheus families for detection's figures and findings, and for the MQTT publisher's health.

Both are :class:`~flexmig.metrics.collector.SnapshotMetrics` extensions of the one snapshot collector, so they
share its rules: no I/O in a scrape, ``flexmig_`` names in base units, dcgm-exporter identity labels (reused
through :func:`gpu_labels`/:func:`instance_labels`, so ``on(gpu, GPU_I_ID)`` joins keep working), and a figure
nobody knows is an absent series, never 0.

* :class:`FindingsMetrics` reads the :class:`~flexmig.detect.Report` that the daemon's detection enricher put in
  ``Snapshot.findings`` (see :func:`report_of`); a snapshot without one (detection failed or is not wired) exports
  none of these series.
* :class:`PublisherMetrics` reads :meth:`MqttPublisher.stats` (through a callable, so a test can pass any stats).

Finding series: ``flexmig_mig_finding{finding="idle"|"underused"|"oversized"}`` and
``flexmig_gpu_finding{finding="fragmentation"}`` are 1 while the finding is active and 0 for the kinds detection
judged and found absent; an instance detection could not judge (no telemetry window yet, a lost GPU) has no
series at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import Metric

from flexmig.detect import FragmentationFinding, OversizedFinding, Report, UnderuseFinding
from flexmig.metrics.collector import gpu_labels, instance_labels
from flexmig.metrics.families import by_name
from flexmig.telemetry.snapshot import GpuSnapshot, InstanceSnapshot, Snapshot

__all__ = [
    "INSTANCE_FINDINGS",
    "FindingsMetrics",
    "PublisherMetrics",
    "PublisherStatsSource",
    "report_of",
]

INSTANCE_FINDINGS: tuple[str, ...] = ("idle", "underused", "oversized")
"""Values of the ``finding`` label on ``flexmig_mig_finding``."""


def report_of(snapshot: Snapshot) -> Report | None:
    """The detection report attached to ``snapshot`` (None when detection did not run on it)."""
    for item in snapshot.findings:
        if isinstance(item, Report):
            return item
    return None


class FindingsMetrics:
    """Fragmentation figures (node, GPU, profile), internal fragmentation and active findings per instance.

    ``detect_stats`` (optional) gives the detection step's own cost: (wall seconds of the last run, failed runs
    since start), exported as ``flexmig_detect_duration_seconds`` and ``flexmig_detect_failures_total``.
    """

    def __init__(self, detect_stats: Callable[[], tuple[float | None, int]] | None = None) -> None:
        self._detect_stats = detect_stats

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        """Every detection family for ``snapshot``."""
        yield from self._detect_cost(snapshot)
        report = report_of(snapshot)
        if report is None:
            return
        gpus = {g.index: g for g in snapshot.gpus}
        yield from _node_families(snapshot, report)
        yield from _gpu_families(snapshot, report, gpus)
        yield from _instance_families(snapshot, report, gpus)

    def _detect_cost(self, snapshot: Snapshot) -> Iterator[Metric]:
        if self._detect_stats is None:
            return
        last_s, failures = self._detect_stats()
        host = [snapshot.hostname]
        if last_s is not None:
            g = by_name("flexmig_detect_duration_seconds").gauge()
            g.add_metric(host, last_s)
            yield g
        c = by_name("flexmig_detect_failures").counter()
        c.add_metric(host, failures)
        yield c


def _node_families(snap: Snapshot, report: Report) -> Iterator[Metric]:
    frag = report.fragmentation
    host = [snap.hostname]
    for name, value in (
        ("flexmig_node_fragmentation_external_ratio", frag.external_score),
        ("flexmig_node_fragmentation_external_slices", frag.external_fragment),
        ("flexmig_node_stranded_compute_slices", frag.stranded_compute_slices),
        ("flexmig_node_stranded_ratio", frag.stranded_score),
        ("flexmig_node_recoverable_compute_slices", frag.recoverable_compute_slices),
    ):
        g = by_name(name).gauge()
        g.add_metric(host, value)
        yield g


def _gpu_families(snap: Snapshot, report: Report, gpus: Mapping[int, GpuSnapshot]) -> Iterator[Metric]:
    ext = by_name("flexmig_gpu_fragmentation_external_ratio").gauge()
    ext_slices = by_name("flexmig_gpu_fragmentation_external_slices").gauge()
    stranded = by_name("flexmig_gpu_stranded_compute_slices").gauge()
    stranded_ratio = by_name("flexmig_gpu_stranded_ratio").gauge()
    recoverable = by_name("flexmig_gpu_recoverable_compute_slices").gauge()
    recoverable_ratio = by_name("flexmig_gpu_recoverable_ratio").gauge()
    changes = by_name("flexmig_gpu_instance_changes").counter()
    repacked = by_name("flexmig_gpu_creatable_repacked_instances").gauge()
    stranded_p = by_name("flexmig_gpu_stranded_instances").gauge()
    finding = by_name("flexmig_gpu_finding").gauge()
    finding_s = by_name("flexmig_gpu_finding_duration_seconds").gauge()
    active = {f.gpu: f for f in report.active if isinstance(f, FragmentationFinding)}
    for g in report.fragmentation.gpus:
        gpu = gpus.get(g.gpu)
        if gpu is None or gpu.lost:
            continue
        labels = gpu_labels(snap, gpu)
        ext.add_metric(labels, g.external_score)
        ext_slices.add_metric(labels, g.external_fragment)
        stranded.add_metric(labels, g.stranded_compute_slices)
        stranded_ratio.add_metric(labels, g.stranded_score)
        recoverable.add_metric(labels, g.recoverable_compute_slices)
        recoverable_ratio.add_metric(labels, g.recoverable_score)
        for change in ("created", "destroyed"):
            changes.add_metric([*labels, change], report.instance_changes.get((g.gpu, change), 0))
        for c in g.capacity:
            repacked.add_metric([*labels, c.profile], c.creatable_repacked)
            stranded_p.add_metric([*labels, c.profile], c.stranded)
        f = active.get(g.gpu)
        finding.add_metric([*labels, "fragmentation"], 1.0 if f is not None else 0.0)
        if f is not None:
            finding_s.add_metric([*labels, "fragmentation"], max(0.0, report.now - f.since))
    yield from (ext, ext_slices, stranded, stranded_ratio, recoverable, recoverable_ratio)
    yield from (changes, repacked, stranded_p, finding, finding_s)


def _instance_families(snap: Snapshot, report: Report, gpus: Mapping[int, GpuSnapshot]) -> Iterator[Metric]:
    idle_c = by_name("flexmig_mig_internal_fragmentation_compute_slices").gauge()
    idle_m = by_name("flexmig_mig_internal_fragmentation_memory_slices").gauge()
    finding = by_name("flexmig_mig_finding").gauge()
    finding_s = by_name("flexmig_mig_finding_duration_seconds").gauge()
    suggested = by_name("flexmig_mig_suggested_profile").info()
    by_key: dict[tuple[int, int], list[InstanceSnapshot]] = {}
    for gpu in gpus.values():
        for inst in gpu.instances:
            by_key.setdefault((inst.gpu_index, inst.start), []).append(inst)
    active: dict[tuple[int, int], list[tuple[str, UnderuseFinding | OversizedFinding]]] = {}
    for f in report.active:
        if isinstance(f, UnderuseFinding):
            active.setdefault((f.gpu, f.start), []).append((f.level, f))
        elif isinstance(f, OversizedFinding):
            active.setdefault((f.gpu, f.start), []).append(("oversized", f))
    for internal in report.internal:
        key = (internal.gpu, internal.start)
        found = dict(active.get(key, ()))
        for inst in by_key.get(key, ()):
            if inst.profile_name != internal.profile:
                continue
            labels = instance_labels(snap, inst)
            if internal.compute_idle is not None:
                idle_c.add_metric(labels, internal.compute_idle)
            if internal.memory_idle is not None:
                idle_m.add_metric(labels, internal.memory_idle)
            for kind in INSTANCE_FINDINGS:
                hit = found.get(kind)
                finding.add_metric([*labels, kind], 1.0 if hit is not None else 0.0)
                if hit is not None:
                    finding_s.add_metric([*labels, kind], max(0.0, report.now - hit.since))
                    if isinstance(hit, OversizedFinding):
                        suggested.add_metric(labels, {"suggested_profile": hit.suggested})
    yield from (idle_c, idle_m, finding, finding_s, suggested)


# ---------------------------------------------------------------------------------------------------- MQTT


class PublisherStatsSource(Protocol):
    """What :class:`PublisherMetrics` reads (``MqttPublisher.stats`` has this shape)."""

    @property
    def connected(self) -> bool:
        """True while a session with the broker is up."""
        ...

    @property
    def queued(self) -> int:
        """Events waiting to be acknowledged."""
        ...

    @property
    def sent_total(self) -> int:
        """Events the broker acknowledged since start."""
        ...

    @property
    def connect_failures_total(self) -> int:
        """Failed connection attempts since start."""
        ...

    @property
    def dropped_total(self) -> int:
        """Events the full outbox dropped since start."""
        ...


class PublisherMetrics:
    """The MQTT publisher's health: connected, outbox depth, events emitted, sent, dropped, failed connections.

    ``emitted`` (optional) gives events handed to the publisher since start, by kind.
    """

    def __init__(
        self,
        stats: Callable[[], PublisherStatsSource],
        emitted: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self._stats = stats
        self._emitted = emitted

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        """The publisher families (labelled with the node's ``Hostname`` only)."""
        s = self._stats()
        host = [snapshot.hostname]
        g = by_name("flexmig_mqtt_connected").gauge()
        g.add_metric(host, 1.0 if s.connected else 0.0)
        yield g
        g = by_name("flexmig_mqtt_outbox_events").gauge()
        g.add_metric(host, s.queued)
        yield g
        for name, value in (
            ("flexmig_mqtt_events_sent", s.sent_total),
            ("flexmig_mqtt_events_dropped", s.dropped_total),
            ("flexmig_mqtt_connect_failures", s.connect_failures_total),
        ):
            c = by_name(name).counter()
            c.add_metric(host, value)
            yield c
        if self._emitted is not None:
            c = by_name("flexmig_mqtt_events_emitted").counter()
            for kind, n in sorted(self._emitted().items()):
                c.add_metric([*host, kind], n)
            yield c
