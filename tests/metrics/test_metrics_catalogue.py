"""The metric catalogue (flexmig.metrics.families) against what the collectors really expose, in every mode.

A node is sampled through the daemon's own path (the real NVML code over the simulator, the telemetry store, the
detection enricher), its snapshot gets a dcgm-exporter status and error counts, and the registry carries every
extension flexmigd wires: detection's figures, the MQTT publisher's health and the actuator's actions, fed as in
modes observe (nothing planned or done), advise (planning rounds) and act (actions of every outcome). Then:

* each exposition is valid OpenMetrics (prometheus_client's own parser, the format Prometheus asks for first) and
  valid classic text;
* the families exposed are exactly the catalogue's, each with the catalogue's type, help text and label names;
* the reference table in docs/metrics.md is the one the catalogue generates.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from prometheus_client import generate_latest as text_exposition
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics import parser as om_parser
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import CollectorRegistry

from flexmig.act.durable import Durable
from flexmig.config.schema import DCGM_EXPORTER_PORT
from flexmig.detect import DetectSettings
from flexmig.metrics import families as catalogue
from flexmig.metrics.actions import ActionMetrics
from flexmig.metrics.collector import SnapshotCollector, SnapshotMetrics, build_registry
from flexmig.metrics.findings import FindingsMetrics, PublisherMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.metrics.runtime import JournalWriteMetrics, ServerMetrics, TaskMetrics
from flexmig.metrics.server import ServerStats
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.nvml import GpmWindows, Nvml
from flexmig.sim import install, uninstall
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import DcgmStatus, SamplingStats, Snapshot
from flexmig.telemetry.store import TelemetryStore
from flexmig.wiring.detection import Detector
from support.event_samples import act_events, facts

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
MODES = ("observe", "advise", "act")
# What Prometheus 2.42 sends: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def openmetrics_exposition(registry: CollectorRegistry) -> bytes:
    """What flexmigd answers a scrape that asks for OpenMetrics (prometheus_client's encoder)."""
    return bytes(om_exposition.generate_latest(registry))  # type: ignore[no-untyped-call]


def parse_openmetrics(text: str) -> list[Metric]:
    """prometheus_client's OpenMetrics parser (raises ValueError on invalid OpenMetrics)."""
    return list(om_parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


@dataclasses.dataclass(frozen=True)
class Stats:
    connected: bool = True
    queued: int = 2
    sent_total: int = 40
    connect_failures_total: int = 1
    dropped_total: int = 0
    unsaved_dropped_total: int = 0
    outbox_corruptions_total: int = 0
    outbox_lost_total: int = 0


@dataclasses.dataclass(frozen=True)
class CommandStats:
    results_dropped: int = 0


def sampled_node() -> Snapshot:
    """Three sweeps a second apart of a simulated 2xH200 (one busy instance, idle ones) through the daemon's path:
    NVML inventory and sample with GPM windows, the telemetry store, the detection enricher."""
    clock = [100.0]
    node = install("h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6", clock=lambda: clock[0])
    try:
        uuids = node.mig_uuids()
        node.start_process(uuids[0], memory_bytes=8 << 30)
        node.set_activity(uuids[0], sm=0.6, occupancy=0.3, tensor=0.2, dram=0.4)
        with Nvml.open() as nvml:
            gpm = GpmWindows(clock=lambda: clock[0])
            store = TelemetryStore(TelemetrySettings(), "node-1")
            detector = Detector(DetectSettings())
            snap = None
            for sweep in (1, 2, 3):
                clock[0] += 1.0
                store.set_inventory(nvml.inventory())
                stats = SamplingStats(
                    sweep, 0.01, 0.004, 0.008, 1, {("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED"): 2}, {"dcgm": 1}
                )
                samples = nvml.sample(gpm)
                snap = detector.enrich(store.build(samples, now=clock[0], wall=1e9 + clock[0], stats=stats))
            gpm.close()
    finally:
        uninstall()
    assert snap is not None
    return dataclasses.replace(
        snap, dcgm=DcgmStatus(f"http://127.0.0.1:{DCGM_EXPORTER_PORT}/metrics", True, "4.9", 6, 0.5)
    )


def actions(mode: str) -> ActionMetrics:
    """The actuator's families as a node in ``mode`` has them (every mode wires the actuator)."""
    m = ActionMetrics()
    m.set_jobs({"running": 1})
    if mode in ("advise", "act"):
        m.record_plan(["create_instance", "migrate"], 12.0)
        m.record_plan_failure()
    if mode == "act":
        for e in act_events():
            m.record(e, facts(e.action_id or 0).downtime_s if e.kind == "action_completed" else None)
    return m


def slurm() -> SlurmMetrics:
    """The Slurm agent's families as an acting Slurm node has them: a read, a decision, a hook job moved."""
    m = SlurmMetrics()
    m.read_ok(pending=3, running=1, movable=1, in_sync=True, registered={"1g.18gb": 3, "4g.71gb": 1})
    m.decided(drain_s=4.0, gain=5394.0, cost=12.0, go=True)
    for action in ("signalled", "requeued", "released"):
        m.job_action(action)
    m.drained(2.5)
    return m


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    return sampled_node()


def registry(snap: Snapshot, mode: str) -> CollectorRegistry:
    extensions: list[SnapshotMetrics] = [
        FindingsMetrics(lambda: (0.002, 0)),
        PublisherMetrics(Stats, lambda: {"instance_created": 3}),
        actions(mode),
        LossMetrics(Stats, CommandStats, lambda: 0),
        TaskMetrics({"mqtt": 1} if mode == "act" else {}),
        ServerMetrics(lambda: ServerStats(limit=64, open=1, served=2)),
        JournalWriteMetrics(lambda: Durable("/var/lib/flexmig/journal.sqlite3") if mode == "act" else None),
    ]
    if mode == "act":  # a Slurm node ([slurm] enabled) acts
        extensions.append(slurm())
    return build_registry(SnapshotCollector(lambda: snap, extensions))


def families(text: str, *, openmetrics: bool) -> Iterator[tuple[str, str, str, frozenset[str]]]:
    """(name, type, help, label names over its samples) of each family of an exposition."""
    parse = parse_openmetrics if openmetrics else parse_text
    for f in parse(text):
        labels = frozenset(k for s in f.samples for k in s.labels if k not in ("le", "quantile"))
        yield f.name, f.type, f.documentation, labels


@pytest.mark.parametrize("mode", MODES)
def test_the_exposition_of_every_mode_is_valid_openmetrics_and_classic_text(snapshot: Snapshot, mode: str) -> None:
    reg = registry(snapshot, mode)
    om = openmetrics_exposition(reg).decode()
    assert om.endswith("# EOF\n")
    om_families = list(families(om, openmetrics=True))  # raises on invalid OpenMetrics
    text = text_exposition(reg).decode()
    om_samples = {s.name for f in parse_openmetrics(om) for s in f.samples}
    assert om_samples == {s.name for f in parse_text(text) for s in f.samples}
    assert len({f[0] for f in om_families}) == len(om_families), "a family name declared twice"


def test_prometheus_s_accept_header_gets_openmetrics(snapshot: Snapshot) -> None:
    encoder, content_type = choose_encoder(PROMETHEUS_ACCEPT)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    list(parse_openmetrics(encoder(registry(snapshot, "act")).decode()))


def test_the_families_of_every_mode_are_the_catalogue_s_with_its_types_help_and_labels(snapshot: Snapshot) -> None:
    seen: dict[str, tuple[str, str, frozenset[str]]] = {}
    for mode in MODES:
        for name, kind, doc, labels in families(
            openmetrics_exposition(registry(snapshot, mode)).decode(), openmetrics=True
        ):
            old = seen.get(name)
            seen[name] = (kind, doc, labels | (old[2] if old else frozenset()))
    declared = {f.name: f for f in catalogue.FAMILIES}
    assert set(seen) - set(declared) == set(), "exposed, not in the catalogue"
    assert set(declared) - set(seen) == set(), "in the catalogue, exposed in no mode"
    for name, (kind, doc, labels) in seen.items():
        f = declared[name]
        assert (kind, doc) == (f.kind, f.help), name
        if labels:  # a family without samples says nothing about its labels
            assert labels == set(f.labels) | set(f.info_labels), name


def test_a_family_without_series_on_an_active_node_is_one_the_catalogue_says_waits_for_something(
    snapshot: Snapshot,
) -> None:
    text = openmetrics_exposition(registry(snapshot, "act")).decode()
    empty = {name for name, _, _, labels in families(text, openmetrics=True) if not labels}
    empty -= {f.name for f in catalogue.FAMILIES if not f.labels}  # the process_* families have no labels
    # the simulator's pids are no host processes, no activity row came from DCGM, the demo layout is no finding
    # and no instance has been judged long enough for one
    assert empty == {
        "flexmig_mig_processes_cpu_ratio",
        "flexmig_mig_processes_resident_memory_bytes",
        "flexmig_mig_gr_engine_active_ratio",
        "flexmig_gpu_finding_duration_seconds",
        "flexmig_mig_finding_duration_seconds",
        "flexmig_mig_suggested_profile",
    }
    for name in empty:
        assert catalogue.by_name(name).when, f"{name} has no series and the catalogue says it always has"


def test_gpu_and_instance_series_carry_dcgm_exporter_s_identity_labels(snapshot: Snapshot) -> None:
    text = openmetrics_exposition(registry(snapshot, "observe")).decode()
    samples = {f.name: f.samples for f in parse_openmetrics(text)}
    limit = {s.labels["gpu"]: s for s in samples["flexmig_gpu_power_limit_watts"]}
    assert limit["1"].value == 700.0
    assert {k: v for k, v in limit["1"].labels.items() if k != "UUID"} == {
        "gpu": "1",
        "pci_bus_id": "00000000:2A:00.0",
        "device": "nvidia1",
        "model_name": "NVIDIA H200",
        "Hostname": "node-1",
    }
    (first, *_) = [s for s in samples["flexmig_mig_memory_total_bytes"] if s.labels["gpu"] == "0"]
    assert set(first.labels) == set(catalogue.INSTANCE_LABELS)
    assert (first.labels["pci_bus_id"], first.labels["device"]) == ("00000000:18:00.0", "nvidia0")


def test_the_reference_table_in_docs_is_the_one_the_catalogue_generates() -> None:
    text = DOCS.read_text()
    begin, end = "<!-- metric table: generated -->\n", "<!-- end of metric table -->\n"
    assert begin in text and end in text, f"{DOCS}: the generated-table markers are missing"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == catalogue.markdown_table(), (
        "docs/metrics.md's metric table is stale: regenerate with python -m flexmig.metrics.families --markdown"
    )


def test_the_catalogue_command_prints_the_table() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert catalogue.main(["--markdown"]) == 0
    assert out.getvalue() == catalogue.markdown_table()


def test_no_two_families_share_a_name_or_a_sample_name() -> None:
    samples = [n for f in catalogue.FAMILIES for n in f.samples]
    assert len(samples) == len(set(samples))
    for f in catalogue.FAMILIES:
        others = {n for g in catalogue.FAMILIES if g is not f for n in g.samples}
        assert f.name not in others, f"{f.name} is also a sample name of another family"
