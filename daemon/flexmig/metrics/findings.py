"""Prometheus families for detection's figures and findings, and for the MQTT publisher's health.

Both are :class:`~flexmig.metrics.collector.SnapshotMetrics` extensions of the one snapshot collector, so they
share its rules: no I/O in a scrape, ``flexmig_`` names in base units, dcgm-exporter identity labels (reused
through :func:`gpu_label_set`/:func:`instance_label_set`, so ``on(gpu, GPU_I_ID)`` joins keep working), and a figure
nobody knows is an absent series, never 0.

* :class:`FindingsMetrics` reads the :class:`~flexmig.detect.Report` that the daemon's detection enricher put in
  ``Snapshot.findings`` (see :func:`report_of`); a snapshot without one (detection failed or is not wired) exports
  none of these series.
* :class:`PublisherMetrics` reads :meth:`MqttPublisher.stats` (through a callable, so a test can pass any stats).

Finding series: ``flexmig_mig_finding{finding="idle"|"underused"|"oversized"}`` and
``flexmig_gpu_finding{finding="fragmentation"}`` are 1 while the finding is active and 0 for the kinds detection
judged and found absent: a GPU's from detail ``standard`` on, an instance's at ``full`` only (below, only active
findings have a series: what alerts compare, and a third of an instance's series otherwise); an instance detection
could not judge (no telemetry window yet, a lost GPU) has no series at all.

Detection's families depend on the snapshot alone, so they are :class:`~flexmig.metrics.collector.SnapshotFamilies`
written once per snapshot; the publisher's health changes between sweeps and is collected at every scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import Metric

from flexmig.detect import FragmentationFinding, OversizedFinding, Report, UnderuseFinding
from flexmig.metrics.collector import gpu_label_set, instance_label_set, node_label_set
from flexmig.metrics.exposition import FamilyWriter, LabelSet, Writer
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

    def write(self, snapshot: Snapshot, out: Writer) -> None:
        """Every detection family for ``snapshot``, at ``out``'s detail."""
        self._detect_cost(snapshot, out)
        report = report_of(snapshot)
        if report is None:
            return
        gpus = {g.index: g for g in snapshot.gpus}
        _node_families(snapshot, report, out)
        _gpu_families(snapshot, report, gpus, out)
        _instance_families(snapshot, report, gpus, out)

    def _detect_cost(self, snapshot: Snapshot, out: Writer) -> None:
        if self._detect_stats is None:
            return
        last_s, failures = self._detect_stats()
        host = node_label_set(snapshot, out)
        fam = out.family("flexmig_detect_duration_seconds")
        if last_s is not None and fam is not None:
            fam.add(host, last_s)
        fam = out.family("flexmig_detect_failures")
        if fam is not None:
            fam.add(host, failures)


def _node_families(snap: Snapshot, report: Report, out: Writer) -> None:
    frag = report.fragmentation
    host = node_label_set(snap, out)
    for name, value in (
        ("flexmig_node_fragmentation_external_ratio", frag.external_score),
        ("flexmig_node_fragmentation_external_slices", frag.external_fragment),
        ("flexmig_node_stranded_compute_slices", frag.stranded_compute_slices),
        ("flexmig_node_stranded_ratio", frag.stranded_score),
        ("flexmig_node_recoverable_compute_slices", frag.recoverable_compute_slices),
    ):
        fam = out.family(name)
        if fam is not None:
            fam.add(host, value)
    now: dict[str, int] = {}
    repacked: dict[str, int] = {}
    for g in frag.gpus:
        for c in g.capacity:
            now[c.profile] = now.get(c.profile, 0) + c.creatable_now
            repacked[c.profile] = repacked.get(c.profile, 0) + c.creatable_repacked
    for name, totals in (
        ("flexmig_node_creatable_instances", now),
        ("flexmig_node_creatable_repacked_instances", repacked),
    ):
        fam = out.family(name)
        if fam is not None:
            for profile, n in totals.items():
                fam.add(host.extend(("profile",), (profile,)), n)


def _gpu_families(snap: Snapshot, report: Report, gpus: Mapping[int, GpuSnapshot], out: Writer) -> None:
    judged = [
        (g, gpu_label_set(snap, gpus[g.gpu], out))
        for g in report.fragmentation.gpus
        if g.gpu in gpus and not gpus[g.gpu].lost
    ]
    for name, attr in (
        ("flexmig_gpu_fragmentation_external_ratio", "external_score"),
        ("flexmig_gpu_fragmentation_external_slices", "external_fragment"),
        ("flexmig_gpu_stranded_compute_slices", "stranded_compute_slices"),
        ("flexmig_gpu_stranded_ratio", "stranded_score"),
        ("flexmig_gpu_recoverable_compute_slices", "recoverable_compute_slices"),
        ("flexmig_gpu_recoverable_ratio", "recoverable_score"),
    ):
        fam = out.family(name)
        if fam is not None:
            for g, labels in judged:
                fam.add(labels, getattr(g, attr))
    fam = out.family("flexmig_gpu_instance_changes")
    if fam is not None:
        for g, labels in judged:
            for change in ("created", "destroyed"):
                fam.add(labels.extend(("change",), (change,)), report.instance_changes.get((g.gpu, change), 0))
    for name, attr in (
        ("flexmig_gpu_creatable_repacked_instances", "creatable_repacked"),
        ("flexmig_gpu_stranded_instances", "stranded"),
    ):
        fam = out.family(name)
        if fam is not None:
            for g, labels in judged:
                for c in g.capacity:
                    fam.add(labels.extend(("profile",), (c.profile,)), getattr(c, attr))
    active = {f.gpu: f for f in report.active if isinstance(f, FragmentationFinding)}
    finding = out.family("flexmig_gpu_finding")
    finding_s = out.family("flexmig_gpu_finding_duration_seconds")
    for g, labels in judged:
        f = active.get(g.gpu)
        kind = labels.extend(("finding",), ("fragmentation",))
        if finding is not None and (f is not None or out.zeros("flexmig_gpu_finding")):
            finding.add(kind, 1.0 if f is not None else 0.0)
        if f is not None and finding_s is not None:
            finding_s.add(kind, max(0.0, report.now - f.since))


def _instance_families(snap: Snapshot, report: Report, gpus: Mapping[int, GpuSnapshot], out: Writer) -> None:
    idle_c = out.family("flexmig_mig_internal_fragmentation_compute_slices")
    idle_m = out.family("flexmig_mig_internal_fragmentation_memory_slices")
    finding = out.family("flexmig_mig_finding")
    finding_s = out.family("flexmig_mig_finding_duration_seconds")
    suggested = out.family("flexmig_mig_suggested_profile")
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
            labels = instance_label_set(snap, inst, out)
            if internal.compute_idle is not None and idle_c is not None:
                idle_c.add(labels, internal.compute_idle)
            if internal.memory_idle is not None and idle_m is not None:
                idle_m.add(labels, internal.memory_idle)
            _instance_findings(labels, found, report.now, out, finding=finding, age=finding_s, suggested=suggested)


def _instance_findings(
    labels: LabelSet,
    found: Mapping[str, UnderuseFinding | OversizedFinding],
    now: float,
    out: Writer,
    *,
    finding: FamilyWriter | None,
    age: FamilyWriter | None,
    suggested: FamilyWriter | None,
) -> None:
    """One instance's findings: each kind active (1 and its age), or judged absent (0, at full detail only)."""
    for kind in INSTANCE_FINDINGS:
        hit = found.get(kind)
        if hit is None and not out.zeros("flexmig_mig_finding"):
            continue
        which = labels.extend(("finding",), (kind,))
        if finding is not None:
            finding.add(which, 1.0 if hit is not None else 0.0)
        if hit is None:
            continue
        if age is not None:
            age.add(which, max(0.0, now - hit.since))
        if isinstance(hit, OversizedFinding) and suggested is not None:
            suggested.info(labels, (hit.suggested,))


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
