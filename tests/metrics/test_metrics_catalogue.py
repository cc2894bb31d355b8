"""The metric catalogue (flexmig.metrics.families) against what flexmigd serves, in every mode and at every detail.

A node is sampled through the daemon's own path (support.metrics_rig: the real NVML code over the simulator, the
telemetry store, the detection enricher), its snapshot gets a dcgm-exporter status and error counts, and the
exposition carries every extension flexmigd wires: detection's figures, the MQTT publisher's health and the
actuator's actions, fed as in modes observe (nothing planned or done), advise (planning rounds) and act (actions of
every outcome). What is checked is what a scrape gets (:class:`flexmig.metrics.scrape.Exposition`), with
prometheus_client's encoders over the same families as the reference:

* each exposition is valid OpenMetrics (prometheus_client's own parser, the format Prometheus asks for first) and
  valid classic text, and holds the same samples as prometheus_client's encoders write;
* at detail ``full`` the families exposed are exactly the catalogue's, each with the catalogue's type, help text
  and label names; at each lower detail exactly the catalogue's families of that level and below;
* the reference and budget tables in docs/metrics.md are the ones the catalogue generates.
"""

from __future__ import annotations

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

from flexmig.metrics import families as catalogue
from flexmig.metrics import reference
from flexmig.metrics.collector import SnapshotCollector, build_registry
from flexmig.metrics.families import Level
from flexmig.metrics.scrape import Exposition
from flexmig.telemetry.snapshot import Snapshot
from support.metrics_rig import MODES, extensions, sampled_node

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
# What Prometheus 2.42 sends: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def parse_openmetrics(text: str) -> list[Metric]:
    """prometheus_client's OpenMetrics parser (raises ValueError on invalid OpenMetrics)."""
    return list(om_parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    return sampled_node()


def served(snap: Snapshot, mode: str, *, openmetrics: bool = True, detail: Level = "full") -> str:
    """What a scrape of a node in ``mode`` at ``detail`` gets."""
    return Exposition(lambda: snap, extensions(mode), detail=detail).body(openmetrics=openmetrics).decode()


def registry(snap: Snapshot, mode: str, detail: Level = "full") -> CollectorRegistry:
    """The same families as prometheus_client families, for its encoders."""
    return build_registry(SnapshotCollector(lambda: snap, extensions(mode), detail=detail))


def families(text: str, *, openmetrics: bool) -> Iterator[tuple[str, str, str, frozenset[str]]]:
    """(name, type, help, label names over its samples) of each family of an exposition."""
    parse = parse_openmetrics if openmetrics else parse_text
    for f in parse(text):
        labels = frozenset(k for s in f.samples for k in s.labels if k not in ("le", "quantile"))
        yield f.name, f.type, f.documentation, labels


def samples(text: str, *, openmetrics: bool) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Every sample of an exposition (name, sorted labels, value), but the process's own, which move."""
    parse = parse_openmetrics if openmetrics else parse_text
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for f in parse(text)
        for s in f.samples
        if not s.name.startswith("process_")
    }


@pytest.mark.parametrize("detail", catalogue.LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_what_a_scrape_gets_is_valid_and_holds_prometheus_client_s_samples(
    snapshot: Snapshot, mode: str, detail: Level
) -> None:
    om = served(snapshot, mode, detail=detail)
    assert om.endswith("# EOF\n") and om.count("# EOF") == 1
    om_families = list(families(om, openmetrics=True))  # raises on invalid OpenMetrics
    assert len({f[0] for f in om_families}) == len(om_families), "a family name declared twice"
    text = served(snapshot, mode, openmetrics=False, detail=detail)
    assert samples(om, openmetrics=True) == samples(text, openmetrics=False)
    reference = registry(snapshot, mode, detail)
    assert samples(om, openmetrics=True) == samples(
        bytes(om_exposition.generate_latest(reference)).decode(),  # type: ignore[no-untyped-call]
        openmetrics=True,
    )
    assert samples(text, openmetrics=False) == samples(text_exposition(reference).decode(), openmetrics=False)


def test_prometheus_s_accept_header_gets_openmetrics(snapshot: Snapshot) -> None:
    _, content_type = choose_encoder(PROMETHEUS_ACCEPT)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    status: list[str] = []
    exposition = Exposition(lambda: snapshot, extensions("act"))
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "HTTP_ACCEPT": PROMETHEUS_ACCEPT}
    body = b"".join(exposition(environ, lambda s, h: status.append(dict(h)["Content-Type"])))
    assert status == [content_type]
    parse_openmetrics(body.decode())


def test_the_families_of_every_mode_are_the_catalogue_s_with_its_types_help_and_labels(snapshot: Snapshot) -> None:
    seen: dict[str, tuple[str, str, frozenset[str]]] = {}
    for mode in MODES:
        for name, kind, doc, labels in families(served(snapshot, mode), openmetrics=True):
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


@pytest.mark.parametrize("detail", ["minimal", "standard"])
def test_each_detail_exports_exactly_the_catalogue_s_families_of_its_level_and_below(
    snapshot: Snapshot, detail: Level
) -> None:
    rank = catalogue.LEVELS.index(detail)
    seen = {name for mode in MODES for name, *_ in families(served(snapshot, mode, detail=detail), openmetrics=True)}
    wanted = {f.name for f in catalogue.FAMILIES if catalogue.LEVELS.index(f.level) <= rank}
    assert seen - wanted == set(), f"exported at {detail}, though the catalogue says a higher level"
    assert wanted - seen == set(), f"the catalogue says {detail} or below, exported in no mode"


def test_a_finding_family_carries_the_absent_findings_from_its_zeros_level_on(snapshot: Snapshot) -> None:
    # the demo node has no finding active yet: every finding series there is a 0 judged absent
    by_level = {d: parse_openmetrics(served(snapshot, "act", detail=d)) for d in catalogue.LEVELS}
    for name, since in catalogue.ZEROS_FROM.items():
        for detail, got in by_level.items():
            zeros = [s for f in got if f.name == name for s in f.samples]
            assert all(s.value == 0 for s in zeros), (name, detail)
            if catalogue.LEVELS.index(detail) >= catalogue.LEVELS.index(since):
                assert zeros, f"{name} at {detail}: no 0 for the findings judged absent"
            else:
                assert not zeros, f"{name} at {detail}: a 0, though only active findings have a series there"
    assert catalogue.ZEROS_FROM["flexmig_gpu_finding"] == "standard"  # the node dashboard's "ok" at the default


def test_a_family_without_series_on_an_active_node_is_one_the_catalogue_says_waits_for_something(
    snapshot: Snapshot,
) -> None:
    text = served(snapshot, "act")
    empty = {name for name, _, _, labels in families(text, openmetrics=True) if not labels}
    empty -= {f.name for f in catalogue.FAMILIES if not f.labels}  # the process_* families have no labels
    # the simulator's pids are no host processes, no activity row came from DCGM, the demo layout is no finding
    # and no instance has been judged long enough for one; the served node's moves are journal rows, with no job
    # to report its first step after them
    assert empty == {
        "flexmig_job_downtime_seconds",
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
    text = served(snapshot, "observe")
    by_family = {f.name: f.samples for f in parse_openmetrics(text)}
    limit = {s.labels["gpu"]: s for s in by_family["flexmig_gpu_power_limit_watts"]}
    assert limit["1"].value == 700.0
    assert {k: v for k, v in limit["1"].labels.items() if k != "UUID"} == {
        "gpu": "1",
        "pci_bus_id": "00000000:2A:00.0",
        "device": "nvidia1",
        "model_name": "NVIDIA H200",
        "Hostname": "node-1",
    }
    (first, *_) = [s for s in by_family["flexmig_mig_memory_total_bytes"] if s.labels["gpu"] == "0"]
    assert set(first.labels) == set(catalogue.INSTANCE_LABELS)
    assert (first.labels["pci_bus_id"], first.labels["device"]) == ("00000000:18:00.0", "nvidia0")


def test_the_reference_table_in_docs_is_the_one_the_catalogue_generates() -> None:
    text = DOCS.read_text()
    begin, end = "<!-- metric table: generated -->\n", "<!-- end of metric table -->\n"
    assert begin in text and end in text, f"{DOCS}: the generated-table markers are missing"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == reference.markdown_table(), (
        "docs/metrics.md's metric table is stale: regenerate with python -m flexmig.metrics.reference --markdown"
    )


def test_the_levels_table_in_docs_is_the_one_the_catalogue_generates() -> None:
    text = DOCS.read_text()
    begin, end = "<!-- levels table: generated -->\n", "<!-- end of levels table -->\n"
    assert begin in text and end in text, f"{DOCS}: the generated levels-table markers are missing"
    assert text.split(begin, 1)[1].split(end, 1)[0] == reference.levels_table(), (
        "docs/metrics.md's levels table is stale: regenerate with python -m flexmig.metrics.reference --levels"
    )
    # what the prose promises for the default: the power limit, MIG mode and clocks at standard, and what is
    # creatable per profile now and if repacked at every level (node-wide)
    for name in ("flexmig_gpu_power_limit_watts", "flexmig_gpu_mig_mode", "flexmig_gpu_sm_clock_hertz",
                 "flexmig_gpu_memory_clock_hertz", "flexmig_gpu_fragmentation_external_ratio"):  # fmt: skip
        assert catalogue.by_name(name).level == "standard", name
    for name in ("flexmig_node_creatable_instances", "flexmig_node_creatable_repacked_instances"):
        assert catalogue.by_name(name).level == "minimal", name


def test_the_budget_table_in_docs_is_the_one_the_catalogue_generates() -> None:
    text = DOCS.read_text()
    begin, end = "<!-- budget table: generated -->\n", "<!-- end of budget table -->\n"
    assert begin in text and end in text, f"{DOCS}: the generated budget-table markers are missing"
    assert text.split(begin, 1)[1].split(end, 1)[0] == reference.budget_table(), (
        "docs/metrics.md's budget table is stale: regenerate with python -m flexmig.metrics.reference --budget"
    )


@pytest.mark.parametrize("detail", catalogue.LEVELS)
def test_the_budget_counts_the_series_an_instance_and_a_gpu_really_get(detail: Level) -> None:
    # a node where every instance runs something and none is judged yet: the fewest series of each level
    snap = sampled_node(busy=6)
    got = parse_openmetrics(served(snap, "observe", detail=detail))
    one = [s for f in got for s in f.samples if s.labels.get("mig_uuid") == snap.gpus[0].instances[0].mig_uuid]
    gpu_uuid = snap.gpus[0].uuid
    gpu = [s for f in got for s in f.samples if s.labels.get("UUID") == gpu_uuid and "mig_uuid" not in s.labels]
    profiles = len(snap.gpus[0].creatable)
    unseen = 2 if detail == "full" else 0  # the simulator's processes are no host processes: no CPU, no RSS
    assert len(one) == reference.series_per_level(catalogue.INSTANCE_LABELS, profiles)[detail][0] - unseen
    assert len(gpu) == reference.series_per_level(catalogue.GPU_LABELS, profiles)[detail][0]


def test_the_catalogue_command_prints_the_tables() -> None:
    for flag, table in (
        ("--markdown", reference.markdown_table()),
        ("--budget", reference.budget_table()),
        ("--levels", reference.levels_table()),
    ):
        out = io.StringIO()
        with redirect_stdout(out):
            assert reference.main([flag]) == 0
        assert out.getvalue() == table


def test_no_two_families_share_a_name_or_a_sample_name() -> None:
    samples = [n for f in catalogue.FAMILIES for n in f.samples]
    assert len(samples) == len(set(samples))
    for f in catalogue.FAMILIES:
        others = {n for g in catalogue.FAMILIES if g is not f for n in g.samples}
        assert f.name not in others, f"{f.name} is also a sample name of another family"
