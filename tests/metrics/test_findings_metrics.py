"""Detection's figures and findings as Prometheus series, read from a running daemon's /metrics.

Each value is checked against a hand-worked figure and against what ``flexmig.detect`` computes for the same
layout, so the exporter can neither invent nor drop a figure; unknown figures must be absent series.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from typing import Any

import pytest

from flexmig.config import Config, DetectConfig, PrometheusConfig, SamplingConfig
from flexmig.daemon import Daemon
from flexmig.detect import DEFAULT_DEMAND, DemandMix, gpu_fragmentation
from flexmig.metrics.findings import PublisherMetrics
from flexmig.mig import H200, Layout
from flexmig.mqtt.publisher import PublisherStats
from flexmig.telemetry.snapshot import SamplingStats, Snapshot
from support.daemon import Series, by_label, exposition, nvml_of, parse, running, scrape, sim_node, sweeps, values
from support.wait import until

pytestmark = pytest.mark.timeout(120)

GIB = 2**30
SAMPLING = SamplingConfig(interval_s=0.05, retention_s=60.0)
FULL = PrometheusConfig(detail="full")  # these tests read families of every detail level


def config(**detect: Any) -> Config:
    return Config(node_name="node-1", sampling=SAMPLING, prometheus=FULL, detect=DetectConfig(**detect))


async def until_metric(daemon: Daemon, name: str, limit_s: float = 20.0, **match: str) -> Series:
    """Scrape until ``name{match}`` has a sample equal to 1; returns that scrape."""

    async def scraped() -> Series | None:
        series = await scrape(daemon)
        return series if 1.0 in values(series, name, **match) else None

    series: Series = await until(scraped, limit_s, f"{name}{match} to become 1")
    return series


# ------------------------------------------------------------------------------------------ fragmentation


@pytest.mark.integration
def test_four_free_slices_that_cannot_host_a_3g_export_detections_fragmentation_figures() -> None:
    """GPU 0: 2g.35gb@0 + 1g.18gb@4 (four compute slices free, no 3g or 4g fits); GPU 1 emptied."""

    async def scenario() -> Series:
        cfg = config(fragmentation_threshold=0.3, fragmentation_exit=0.2, fragmentation_window_s=0)
        async with running("h200x2:2g.35gb@0+1g.18gb@4", cfg) as daemon:
            nvml = nvml_of(daemon)
            for gi in list(sim_node(daemon).gpu(1).gpu_instances):
                await daemon.worker.call(nvml.destroy_instance, 1, gi.id)
            await sweeps(daemon, 2)
            return await scrape(daemon)

    series = asyncio.run(scenario())
    expected = gpu_fragmentation(0, Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)]), DemandMix(DEFAULT_DEMAND))
    g0, g1 = {"gpu": "0"}, {"gpu": "1"}

    # hand-checked (docs/detection.md worked example) ...
    assert values(series, "flexmig_gpu_free_compute_slices", **g0) == [4.0]
    assert by_label(series, "flexmig_gpu_creatable_instances", "profile", **g0)["3g.71gb"] == 0
    assert by_label(series, "flexmig_gpu_creatable_repacked_instances", "profile", **g0)["3g.71gb"] == 1
    stranded = by_label(series, "flexmig_gpu_stranded_instances", "profile", **g0)
    assert {p: n for p, n in stranded.items() if n} == {"2g.35gb": 1, "3g.71gb": 1, "4g.71gb": 1}
    assert values(series, "flexmig_gpu_fragmentation_external_slices", **g0) == [pytest.approx(1.6)]
    assert values(series, "flexmig_gpu_fragmentation_external_ratio", **g0) == [pytest.approx(0.4)]
    assert values(series, "flexmig_gpu_stranded_compute_slices", **g0) == [4.0]
    assert values(series, "flexmig_gpu_stranded_ratio", **g0) == [pytest.approx(4 / 7)]
    # ... and equal to what detect computes for the same layout
    assert values(series, "flexmig_gpu_fragmentation_external_ratio", **g0) == [expected.external_score]
    assert by_label(series, "flexmig_gpu_creatable_repacked_instances", "profile", **g0) == {
        c.profile: c.creatable_repacked for c in expected.capacity
    }
    assert by_label(series, "flexmig_gpu_stranded_instances", "profile", **g0) == {
        c.profile: c.stranded for c in expected.capacity
    }

    # the emptied GPU: nothing fragmented, a whole GPU creatable
    assert values(series, "flexmig_gpu_fragmentation_external_ratio", **g1) == [0.0]
    assert values(series, "flexmig_gpu_stranded_compute_slices", **g1) == [0.0]
    assert by_label(series, "flexmig_gpu_creatable_repacked_instances", "profile", **g1)["7g.141gb"] == 1

    # the node sums fragments and free slices over its GPUs
    assert values(series, "flexmig_node_fragmentation_external_slices") == [pytest.approx(1.6)]
    assert values(series, "flexmig_node_fragmentation_external_ratio") == [pytest.approx(1.6 / (4 + 7))]
    assert values(series, "flexmig_node_stranded_compute_slices") == [4.0]
    assert values(series, "flexmig_node_stranded_ratio") == [pytest.approx(4 / 14)]

    # what is creatable per profile, now and if repacked, summed over the GPUs: node-wide, at every detail
    for node, gpu in (
        ("flexmig_node_creatable_instances", "flexmig_gpu_creatable_instances"),
        ("flexmig_node_creatable_repacked_instances", "flexmig_gpu_creatable_repacked_instances"),
    ):
        per_gpu = [by_label(series, gpu, "profile", **g) for g in (g0, g1)]
        assert by_label(series, node, "profile") == {p: per_gpu[0][p] + per_gpu[1][p] for p in per_gpu[0]}
    assert by_label(series, "flexmig_node_creatable_instances", "profile")["3g.71gb"] == 2  # GPU 1's two
    assert by_label(series, "flexmig_node_creatable_repacked_instances", "profile")["3g.71gb"] == 3

    # a repack would make room for a 4g on GPU 0 (recoverable 4 of 7 slices), for nothing on the empty GPU 1; the
    # node sums them
    assert values(series, "flexmig_gpu_recoverable_compute_slices", **g0) == [4.0]
    assert values(series, "flexmig_gpu_recoverable_ratio", **g0) == [pytest.approx(4 / 7)]
    assert values(series, "flexmig_gpu_recoverable_compute_slices", **g1) == [0.0]
    assert values(series, "flexmig_node_recoverable_compute_slices") == [4.0]

    # recoverable 0.57 >= threshold 0.3 with no wait: GPU 0 is a fragmentation finding, GPU 1 is not
    assert values(series, "flexmig_gpu_finding", finding="fragmentation", **g0) == [1.0]
    assert values(series, "flexmig_gpu_finding", finding="fragmentation", **g1) == [0.0]
    assert len(values(series, "flexmig_gpu_finding_duration_seconds", **g0)) == 1
    assert values(series, "flexmig_gpu_finding_duration_seconds", **g1) == []
    assert values(series, "flexmig_detect_failures_total") == [0.0]
    assert len(values(series, "flexmig_detect_duration_seconds")) == 1


# ------------------------------------------------------------------------------------------ instances


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_idle_and_oversized_instances_are_findings_and_a_busy_one_is_not() -> None:
    """3g.71gb@0 runs a job at 20% SM and 5 GiB (fits a 1g.18gb); 2g.35gb@4 is busy; 1g.18gb@6 runs nothing."""

    async def scenario() -> tuple[dict[int, str], str]:
        cfg = config(underuse_window_s=1, oversize_window_s=1)
        async with running("h200:3g.71gb@0+2g.35gb@4+1g.18gb@6", cfg) as daemon:
            node = sim_node(daemon)
            by_start = {gi.start: gi.compute_instances[0].uuid for gi in node.gpu(0).gpu_instances}
            node.start_process(by_start[0], memory_bytes=5 * GIB)
            node.set_activity(by_start[0], sm=0.2)
            node.start_process(by_start[4], memory_bytes=20 * GIB)
            node.set_activity(by_start[4], sm=0.8)
            await until_metric(daemon, "flexmig_mig_finding", finding="idle", GPU_I_PROFILE="1g.18gb")
            await until_metric(daemon, "flexmig_mig_finding", finding="oversized", GPU_I_PROFILE="3g.71gb")
            await sweeps(daemon, 1)
            text = await exposition(daemon)
            return by_start, text

    by_start, text = asyncio.run(scenario())
    series = parse(text)
    idle = {"mig_uuid": by_start[6]}
    oversized = {"mig_uuid": by_start[0]}
    busy = {"mig_uuid": by_start[4]}

    assert by_label(series, "flexmig_mig_finding", "finding", **idle) == {"idle": 1, "underused": 0, "oversized": 0}
    assert by_label(series, "flexmig_mig_finding", "finding", **oversized) == {
        "idle": 0, "underused": 0, "oversized": 1,
    }  # fmt: skip
    assert by_label(series, "flexmig_mig_finding", "finding", **busy) == {"idle": 0, "underused": 0, "oversized": 0}
    assert set(by_label(series, "flexmig_mig_finding_duration_seconds", "finding", **idle)) == {"idle"}
    assert by_label(series, "flexmig_mig_finding_duration_seconds", "finding", **busy) == {}
    assert by_label(series, "flexmig_mig_suggested_profile_info", "suggested_profile", **oversized) == {"1g.18gb": 1}

    # internal fragmentation: 20% of 3 compute slices needs 1 (2 idle); 5 GiB of ~17.4 GiB slices needs 1 (3 idle)
    assert values(series, "flexmig_mig_internal_fragmentation_compute_slices", **oversized) == [2.0]
    assert values(series, "flexmig_mig_internal_fragmentation_memory_slices", **oversized) == [3.0]
    # an instance with no process needs nothing: everything it holds is idle
    assert values(series, "flexmig_mig_internal_fragmentation_compute_slices", **idle) == [1.0]

    check = subprocess.run(
        ["promtool", "check", "metrics"], check=False, input=text, capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr


# ------------------------------------------------------------------------------------------ absent series


@pytest.mark.integration
def test_a_lost_gpu_has_no_fragmentation_or_finding_series() -> None:
    async def scenario() -> Series:
        async with running("h200x2:3g.71gb@0+1g.18gb@4", config()) as daemon:
            await sweeps(daemon, 1)
            sim_node(daemon).lose_gpu(1)
            await sweeps(daemon, 2)
            return await scrape(daemon)

    series = asyncio.run(scenario())
    assert values(series, "flexmig_gpu_lost", gpu="1") == [1.0]
    for name in (
        "flexmig_gpu_fragmentation_external_ratio",
        "flexmig_gpu_stranded_compute_slices",
        "flexmig_gpu_creatable_repacked_instances",
        "flexmig_gpu_finding",
        "flexmig_mig_finding",
        "flexmig_mig_internal_fragmentation_memory_slices",
    ):
        assert values(series, name, gpu="1") == [], name
        assert values(series, name, gpu="0") != [], name


@pytest.mark.integration
def test_without_per_instance_activity_the_compute_figure_is_absent_but_memory_is_not() -> None:
    """An A100 without dcgm-exporter: NVML gives memory per instance but no activity."""

    async def scenario() -> tuple[str, Series]:
        async with running("a100-40:3g.20gb@0", config()) as daemon:
            node = sim_node(daemon)
            uuid = node.gpu(0).gpu_instances[0].compute_instances[0].uuid
            node.start_process(uuid, memory_bytes=3 * GIB)
            node.set_activity(uuid, sm=0.5)
            await sweeps(daemon, 3)
            return uuid, await scrape(daemon)

    uuid, series = asyncio.run(scenario())
    assert values(series, "flexmig_mig_sm_active_ratio", mig_uuid=uuid) == []
    assert values(series, "flexmig_mig_internal_fragmentation_compute_slices", mig_uuid=uuid) == []
    assert values(series, "flexmig_mig_internal_fragmentation_memory_slices", mig_uuid=uuid) == [3.0]  # 1 of 4


@pytest.mark.integration
def test_a_gpu_without_mig_has_no_fragmentation_series() -> None:
    async def scenario() -> Series:
        async with running("a100-40:-", config()) as daemon:
            return await scrape(daemon)

    series = asyncio.run(scenario())
    assert values(series, "flexmig_gpu_mig_mode", gpu="0") == [0.0]
    assert values(series, "flexmig_gpu_fragmentation_external_ratio") == []
    assert values(series, "flexmig_node_fragmentation_external_ratio") == [0.0]  # a node with no MIG GPU: nothing


# ------------------------------------------------------------------------------------------ publisher


def test_publisher_metrics_show_the_publisher_counters() -> None:
    stats = PublisherStats(
        connected=False, queued=7, sent_total=40, connect_failures_total=3, dropped_total=2, last_error="refused"
    )
    snap = Snapshot(
        taken_at=1e9, monotonic=5.0, hostname="node-1", driver_version=None, nvml_version=None, window_s=60.0,
        gpus=(), stats=SamplingStats(0, 0.0, 0.0, 0.0, 0, {}, {}),
    )  # fmt: skip
    families = PublisherMetrics(lambda: stats, lambda: {"instance_created": 9}).collect(snap)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    node = (("Hostname", "node-1"),)
    assert got == {
        ("flexmig_mqtt_connected", node): 0,
        ("flexmig_mqtt_outbox_events", node): 7,
        ("flexmig_mqtt_events_sent_total", node): 40,
        ("flexmig_mqtt_events_dropped_total", node): 2,
        ("flexmig_mqtt_connect_failures_total", node): 3,
        ("flexmig_mqtt_events_emitted_total", (*node, ("kind", "instance_created"))): 9,
    }
