"""Prometheus families for detection's figures and findings, and for the MQTT publisher's health.

Both are :class:`~flexmig.export.prometheus.SnapshotMetrics` extensions of the one snapshot collector, so they
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

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from flexmig.detect import FragmentationFinding, OversizedFinding, Report, UnderuseFinding
from flexmig.export.prometheus import GPU_LABELS, INSTANCE_LABELS, gpu_labels, instance_labels
from flexmig.telemetry.snapshot import GpuSnapshot, InstanceSnapshot, Snapshot

__all__ = [
    "GPU_FINDINGS",
    "INSTANCE_FINDINGS",
    "FindingsMetrics",
    "PublisherMetrics",
    "PublisherStatsSource",
    "report_of",
]

INSTANCE_FINDINGS: tuple[str, ...] = ("idle", "underused", "oversized")
"""Values of the ``finding`` label on ``flexmig_mig_finding``."""
GPU_FINDINGS: tuple[str, ...] = ("fragmentation",)
"""Values of the ``finding`` label on ``flexmig_gpu_finding``."""


def report_of(snapshot: Snapshot) -> Report | None:
    """The detection report attached to ``snapshot`` (None when detection did not run on it)."""
    for item in snapshot.findings:
        if isinstance(item, Report):
            return item
    return None


def _gauge(name: str, doc: str, labels: Iterable[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


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
            g = _gauge("flexmig_detect_duration_seconds", "Wall time of the last detection step.", ["Hostname"])
            g.add_metric(host, last_s)
            yield g
        c = CounterMetricFamily(
            "flexmig_detect_failures", "Detection steps that failed (a bug; logged) since start.", labels=["Hostname"]
        )
        c.add_metric(host, failures)
        yield c


def _node_families(snap: Snapshot, report: Report) -> Iterator[Metric]:
    frag = report.fragmentation
    node, host = ["Hostname"], [snap.hostname]
    for name, doc, value in (
        (
            "flexmig_node_fragmentation_external_ratio",
            "Demand-weighted external fragmentation of the node's MIG GPUs, 0-1: sum of F_g(M) over sum of free "
            "compute slices.",
            frag.external_score,
        ),
        (
            "flexmig_node_fragmentation_external_slices",
            "Free compute slices the demand mix cannot use, summed over MIG GPUs (sum of F_g(M)).",
            frag.external_fragment,
        ),
        (
            "flexmig_node_stranded_compute_slices",
            "Compute slices that repacking the running instances would make usable, summed over MIG GPUs.",
            frag.stranded_compute_slices,
        ),
        (
            "flexmig_node_stranded_ratio",
            "Stranded compute slices over all compute slices of the node's MIG GPUs, 0-1.",
            frag.stranded_score,
        ),
    ):
        g = _gauge(name, doc, node)
        g.add_metric(host, value)
        yield g


def _gpu_families(snap: Snapshot, report: Report, gpus: Mapping[int, GpuSnapshot]) -> Iterator[Metric]:
    lab = GPU_LABELS
    ext = _gauge(
        "flexmig_gpu_fragmentation_external_ratio",
        "Demand-weighted external fragmentation, 0-1: the chance a request from the demand mix finds no place "
        "although compute slices are free (0 when none is free).",
        lab,
    )
    ext_slices = _gauge(
        "flexmig_gpu_fragmentation_external_slices",
        "F_g(M): free compute slices weighted by the share of the demand mix that cannot use them.",
        lab,
    )
    stranded = _gauge(
        "flexmig_gpu_stranded_compute_slices",
        "Most compute slices that repacking the running instances would make usable by one profile.",
        lab,
    )
    stranded_ratio = _gauge("flexmig_gpu_stranded_ratio", "Stranded compute slices over the GPU's compute slices.", lab)
    repacked = _gauge(
        "flexmig_gpu_creatable_repacked_instances",
        "How many instances of this profile alone could be created if the running instances were packed tightly.",
        [*lab, "profile"],
    )
    stranded_p = _gauge(
        "flexmig_gpu_stranded_instances",
        "Instances of this profile that only the placement of the running instances prevents (repacked - now).",
        [*lab, "profile"],
    )
    finding = _gauge("flexmig_gpu_finding", "1 while a GPU-wide finding is active, else 0.", [*lab, "finding"])
    finding_s = _gauge(
        "flexmig_gpu_finding_duration_seconds", "How long the active GPU-wide finding has lasted.", [*lab, "finding"]
    )
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
        for c in g.capacity:
            repacked.add_metric([*labels, c.profile], c.creatable_repacked)
            stranded_p.add_metric([*labels, c.profile], c.stranded)
        f = active.get(g.gpu)
        finding.add_metric([*labels, "fragmentation"], 1.0 if f is not None else 0.0)
        if f is not None:
            finding_s.add_metric([*labels, "fragmentation"], max(0.0, report.now - f.since))
    yield from (ext, ext_slices, stranded, stranded_ratio, repacked, stranded_p, finding, finding_s)


def _instance_families(snap: Snapshot, report: Report, gpus: Mapping[int, GpuSnapshot]) -> Iterator[Metric]:
    lab = INSTANCE_LABELS
    idle_c = _gauge(
        "flexmig_mig_internal_fragmentation_compute_slices",
        "Compute slices the instance holds beyond what its job used over the window (p95 activity).",
        lab,
    )
    idle_m = _gauge(
        "flexmig_mig_internal_fragmentation_memory_slices",
        "Memory slices the instance holds beyond what its job used over the window (peak memory).",
        lab,
    )
    finding = _gauge(
        "flexmig_mig_finding",
        "1 while an underuse finding (idle, underused) or an oversized finding is active on the instance, else 0.",
        [*lab, "finding"],
    )
    finding_s = _gauge(
        "flexmig_mig_finding_duration_seconds", "How long the active finding has lasted.", [*lab, "finding"]
    )
    suggested = InfoMetricFamily(
        "flexmig_mig_suggested_profile",
        "The smaller profile an oversized instance's job would fit (only while the finding is active).",
        labels=lab,
    )
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
        node, host = ["Hostname"], [snapshot.hostname]
        g = _gauge("flexmig_mqtt_connected", "1 while a session with the MQTT broker is up, else 0.", node)
        g.add_metric(host, 1.0 if s.connected else 0.0)
        yield g
        g = _gauge(
            "flexmig_mqtt_outbox_events",
            "Events waiting in the persistent outbox for the broker's acknowledgement.",
            node,
        )
        g.add_metric(host, s.queued)
        yield g
        for name, doc, value in (
            ("flexmig_mqtt_events_sent", "Events the broker acknowledged (QoS 1 PUBACK).", s.sent_total),
            ("flexmig_mqtt_events_dropped", "Events the full outbox dropped, oldest first.", s.dropped_total),
            ("flexmig_mqtt_connect_failures", "Failed attempts to connect to the broker.", s.connect_failures_total),
        ):
            c = CounterMetricFamily(name, doc, labels=node)
            c.add_metric(host, value)
            yield c
        if self._emitted is not None:
            c = CounterMetricFamily(
                "flexmig_mqtt_events_emitted", "Events handed to the publisher (stored in the outbox), by kind.",
                labels=[*node, "kind"],
            )  # fmt: skip
            for kind, n in sorted(self._emitted().items()):
                c.add_metric([*host, kind], n)
            yield c
