"""Detection inside the running daemon: one ``observe`` step per snapshot, fed from the snapshot, with the
configured thresholds, live reloads, monotonic time, and no way for a detection bug to stop telemetry."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from ctypes import byref
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.act.nodeview import NodeView
from flexmig.config import Config, DetectConfig, PrometheusConfig, SamplingConfig, load_config, parse_config
from flexmig.daemon import Daemon
from flexmig.detect import DetectSettings, FragmentationFinding, InstanceUsage, Report
from flexmig.metrics.findings import report_of
from flexmig.status import status_document
from flexmig.telemetry import TelemetrySettings
from flexmig.telemetry.observation import usage_of
from flexmig.telemetry.ring import WindowStats
from flexmig.telemetry.snapshot import GpuSnapshot, InstanceSnapshot, SamplingStats, Snapshot
from flexmig.wiring import Detector, detect_settings
from support.daemon import (
    LOOPBACK_ANY,
    Series,
    by_label,
    nvml_of,
    running,
    scrape,
    sim_node,
    started,
    sweeps,
    until_snapshot,
    values,
)
from support.wait import until

pytestmark = pytest.mark.timeout(120)

SAMPLING = SamplingConfig(interval_s=0.05, retention_s=60.0)
FULL = PrometheusConfig(detail="full")  # these tests read families of every detail level
GIB = 2**30


# ------------------------------------------------------------------------------------------ settings


def test_a_daemon_without_a_detect_table_detects_with_the_documented_defaults() -> None:
    assert detect_settings(parse_config("", "flexmig.toml").detect) == DetectSettings()


def test_every_key_of_the_detect_table_reaches_detection() -> None:
    text = """
[detect]
underuse_activity = 0.01
underuse_activity_exit = 0.02
underuse_memory = 0.03
underuse_memory_exit = 0.04
underuse_window_s = 5
underuse_exit_window_s = 6
oversize_margin = 0.07
oversize_window_s = 8
fragmentation_threshold = 0.9
fragmentation_exit = 0.1
fragmentation_window_s = 11
[detect.demand_mix]
1g = 1.0
2g = 0.0
3g = 0.0
4g = 0.0
7g = 3.0
"""
    s = detect_settings(parse_config(text, "flexmig.toml").detect)
    u, f = s.underuse, s.fragmentation
    assert (u.activity_enter, u.activity_exit, u.memory_enter, u.memory_exit) == (0.01, 0.02, 0.03, 0.04)
    assert (u.enter_after_s, u.exit_after_s, u.oversize_margin, u.oversize_after_s) == (5, 6, 0.07, 8)
    assert (f.enter, f.exit, f.enter_after_s, f.exit_after_s) == (0.9, 0.1, 11, 11)
    assert dict(f.demand) == {"1g": 1.0, "2g": 0.0, "3g": 0.0, "4g": 0.0, "7g": 3.0}


@pytest.mark.integration
def test_a_reload_applies_new_detection_thresholds_at_once(tmp_path: Path) -> None:
    """Read as a user would: the node's fragmentation (a 2g and a 1g leaving no room for a 4g, score 0.57) is no
    finding under a threshold of 0.9, and is one from the first sweep after a reload lowers it to 0.35."""
    path = tmp_path / "flexmig.toml"
    detect = "[detect]\nfragmentation_window_s = 0\nfragmentation_exit = 0.3\nfragmentation_threshold = {}\n"
    path.write_text("[sampling]\ninterval_s = 0.1\nstall_s = 30\n" + detect.format(0.9))
    path.chmod(0o600)

    def fragmented(snap: Snapshot) -> bool:
        report = report_of(snap)
        return report is not None and any(isinstance(f, FragmentationFinding) for f in report.active)

    async def scenario() -> bool:
        daemon = Daemon(load_config(path), sim_spec="h200:2g.35gb@0+1g.18gb@4", config_path=path,
                        sim_workload=False, metrics_addr=LOOPBACK_ANY)  # fmt: skip
        async with started(daemon):
            await sweeps(daemon, 3)
            before = fragmented(daemon.latest())  # type: ignore[arg-type]  # a sweep was published
            path.write_text("[sampling]\ninterval_s = 0.1\nstall_s = 30\n" + detect.format(0.35))
            assert daemon.reload()
            await until_snapshot(daemon, fragmented, "a fragmentation finding after the reload")
            return before

    assert not asyncio.run(scenario()), "no finding under a threshold above the 0.57 of this layout"


# ------------------------------------------------------------------------------------------ in the daemon


@pytest.mark.integration
def test_instances_created_and_destroyed_while_running_are_reported_once_each() -> None:
    async def scenario() -> list[Report]:
        reports: list[Report] = []
        cfg = Config(node_name="node-1", sampling=SAMPLING, prometheus=FULL)
        async with running("h200x2:3g.71gb@0+2g.35gb@4", cfg) as daemon:
            daemon.hub.subscribe(lambda snap: reports.append(r) if (r := report_of(snap)) else None)
            nvml, node = nvml_of(daemon), sim_node(daemon)
            gone = next(gi for gi in node.gpu(1).gpu_instances if gi.start == 4)
            await daemon.worker.call(nvml.destroy_instance, 1, gone.id)
            await sweeps(daemon, 2)
            await daemon.worker.call(nvml.create_instance, 1, "1g.18gb", 5)
            await daemon.worker.call(nvml.create_instance, 0, "1g.18gb", 6)
            await sweeps(daemon, 2)
        return reports

    reports = asyncio.run(scenario())
    destroyed = [(c.gpu, c.start, c.profile) for r in reports for c in r.destroyed]
    created = sorted((c.gpu, c.start, c.profile) for r in reports for c in r.created)
    assert destroyed == [(1, 4, "2g.35gb")]
    assert created == [(0, 6, "1g.18gb"), (1, 5, "1g.18gb")]
    assert all(not r.ignored for r in reports)  # every telemetry window matched an instance of the layouts
    assert [r.now for r in reports] == sorted(r.now for r in reports)


@pytest.mark.integration
def test_detection_runs_on_the_snapshot_the_exporter_reads() -> None:
    async def scenario() -> tuple[Snapshot | None, Detector]:
        cfg = Config(node_name="node-1", sampling=SAMPLING, prometheus=FULL, detect=DetectConfig(underuse_window_s=1))
        async with running("h200:3g.71gb@0+1g.18gb@4", cfg) as daemon:
            await sweeps(daemon, 2)
            return daemon.latest(), daemon.components.detector

    snap, detector = asyncio.run(scenario())
    assert snap is not None
    report = report_of(snap)
    assert report is not None and report.now == detector.now_of(snap)
    assert [g.layout for g in report.fragmentation.gpus] == ["3g.71gb@0+1g.18gb@4"]
    assert {(i.gpu, i.start, i.profile) for i in report.internal} == {(0, 0, "3g.71gb"), (0, 4, "1g.18gb")}
    assert detector.stats()[1] == 0


def _gpu_instance_without_compute_instance(gpu: int, start: int) -> None:
    """``nvidia-smi mig -i GPU -cgi 3g.71gb:START`` without ``-C``: a 3g GPU instance and no MIG device."""
    handle = N.nvmlDeviceGetHandleByIndex(gpu)
    profile = N.nvmlDeviceGetGpuInstanceProfileInfo(handle, N.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    placement = N.c_nvmlGpuInstancePlacement_t(start, 4)
    N.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.id, byref(placement))


@pytest.mark.integration
def test_a_gpu_instance_without_a_compute_instance_holds_its_slices_in_every_figure() -> None:
    async def scenario() -> tuple[Snapshot, Series, NodeView]:
        cfg = Config(node_name="node-1", sampling=SAMPLING, prometheus=FULL)
        fast = TelemetrySettings(interval_s=0.05, inventory_interval_s=0.1)  # re-inventory soon after the create
        daemon = Daemon(cfg, sim_spec="h200:3g.71gb@0", sim_workload=False, metrics_addr=LOOPBACK_ANY, telemetry=fast)
        async with started(daemon):
            before = daemon.latest()
            assert before is not None
            await daemon.worker.call(_gpu_instance_without_compute_instance, 0, 4)
            await until(
                lambda: (snap := daemon.latest()) is not None and snap.stats.inventories > before.stats.inventories,
                20,
                "a re-inventory",
            )
            await sweeps(daemon, 2)
            snap = daemon.latest()
            assert snap is not None
            planners_view = NodeView.of(await daemon.worker.call(nvml_of(daemon).inventory))
            return snap, await scrape(daemon), planners_view

    snap, series, planners_view = asyncio.run(scenario())
    gpu = snap.gpus[0]
    assert [(i.start, i.profile_name) for i in gpu.instances] == [(0, "3g.71gb")]  # one MIG device...
    assert [(g.start, g.profile_name, g.compute_instances) for g in gpu.gpu_instances] == [
        (0, "3g.71gb", 1),
        (4, "3g.71gb", 0),  # ...and a GPU instance that has none
    ]
    assert (gpu.free_memory_slices, gpu.free_compute_slices, gpu.creatable["1g.18gb"]) == (0, 1, 0)
    report = report_of(snap)
    assert report is not None
    frag = report.fragmentation.gpus[0]
    assert frag.layout == "3g.71gb@0+3g.71gb@4"
    assert (frag.free_memory_slices, frag.free_compute_slices) == (0, 1)
    assert frag.creatable()["3g.71gb"] == 0 and frag.creatable()["1g.18gb"] == 0
    assert values(series, "flexmig_gpu_free_memory_slices") == [0.0]
    assert by_label(series, "flexmig_gpu_creatable_repacked_instances", "profile")["3g.71gb"] == 0.0
    status = status_document(snap, report, source="test", mode="observe")
    assert status["gpus"][0]["layout"] == "3g.71gb@0+3g.71gb@4"
    assert status["fragmentation"]["free_memory_slices"] == 0
    layout = planners_view.layout(0)
    assert layout is not None and layout.spec() == "3g.71gb@0+3g.71gb@4"  # the planner creates nothing there


# ------------------------------------------------------------------------------------------ inputs


def _snapshot(taken_at: float, monotonic: float, gpus: tuple[GpuSnapshot, ...] = ()) -> Snapshot:
    return Snapshot(
        taken_at=taken_at, monotonic=monotonic, hostname="node-1", driver_version=None, nvml_version=None,
        window_s=60.0, gpus=gpus, stats=SamplingStats(1, 0.0, 0.0, 0.0, 1, {}, {}),
    )  # fmt: skip


def _instance(**kw: object) -> InstanceSnapshot:
    base: dict[str, object] = {
        "gpu_index": 0, "gpu_uuid": "GPU-0", "model_name": "NVIDIA H200", "mig_uuid": "MIG-0", "mig_index": 0,
        "gpu_instance_id": 2, "compute_instance_id": 0, "profile_id": 9, "profile_name": "3g.71gb", "start": 0,
        "memory_slices": 4, "compute_slices": 3, "memory_total_bytes": 70 * GIB, "memory_used_bytes": 0,
        "processes": (), "activity": None, "sm_active_window": WindowStats(60.0, 60, 59.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        "memory_used_window": WindowStats(60.0, 60, 59.0, 5 * GIB, 0.0, 20 * GIB, 19 * GIB, 0.0),
        "idle_seconds": 2.0, "first_seen": 0.0,
    }  # fmt: skip
    base.update(kw)
    return InstanceSnapshot(**base)  # type: ignore[arg-type]


def test_a_job_that_exited_two_seconds_ago_is_idle_for_two_seconds_not_the_whole_window() -> None:
    usage = usage_of(_instance(), at=100.0)
    assert usage.processes == 0
    assert usage.window_s == 2.0
    assert usage.since == 98.0


def test_an_instance_is_judged_by_its_peak_memory_and_p95_activity() -> None:
    usage = usage_of(_instance(processes=None, idle_seconds=None), at=100.0)
    assert usage.memory_used_bytes == 20 * GIB  # the window's peak, not its mean (5 GiB) nor the last reading (0)
    assert usage.window_s == 59.0  # what the readings cover
    assert usage.processes is None  # unknown stays unknown


def test_an_instance_window_is_the_longer_of_its_two_windows_and_either_alone_counts() -> None:
    sm, mem = WindowStats(60.0, 30, 29.0, 0.5, 0.0, 1.0, 0.9, 0.5), WindowStats(60.0, 60, 59.0, GIB, 0.0, GIB, GIB, 0.0)
    busy = {"processes": None, "idle_seconds": None}
    assert usage_of(_instance(sm_active_window=sm, memory_used_window=mem, **busy), at=100.0).window_s == 59.0
    assert usage_of(_instance(sm_active_window=mem, memory_used_window=sm, **busy), at=100.0).window_s == 59.0
    assert usage_of(_instance(sm_active_window=sm, memory_used_window=None, **busy), at=100.0).window_s == 29.0
    only_memory = usage_of(_instance(sm_active_window=None, memory_used_window=sm, **busy), at=100.0)
    assert only_memory.window_s == 29.0 and only_memory.activity is None
    # neither window yet (the first sweep): an instant, never zero (InstanceUsage refuses a window of 0)
    assert usage_of(_instance(sm_active_window=None, memory_used_window=None, **busy), at=100.0).window_s == 1e-3


@pytest.mark.parametrize("field", ["activity_mean", "activity_p95"])
def test_a_usage_window_refuses_an_activity_that_is_no_ratio_and_names_it(field: str) -> None:
    good = InstanceUsage(3, 4, "3g.71gb", 1.0, 1.0, 0.5, 0.5, None, None, None)
    ratio: dict[str, Any] = {field: 1.5}
    assert dataclasses.replace(good, **ratio).activity is not None  # DCGM reads a little above 1.0 (#152)
    for bad in (-0.01, 1.51, 150.0):
        with pytest.raises(ValueError, match=f"GPU 3 slice 4: {field}={bad} is not a ratio"):
            dataclasses.replace(good, **{**ratio, field: bad})


def test_detection_time_follows_the_monotonic_clock_when_the_wall_clock_steps_back() -> None:
    detector = Detector(DetectSettings())
    first = detector.now_of(_snapshot(taken_at=1_700_000_000.0, monotonic=50.0))
    later = detector.now_of(_snapshot(taken_at=1_600_000_000.0, monotonic=51.0))  # NTP stepped the clock back
    assert first == 1_700_000_000.0
    assert later == 1_700_000_001.0


def test_a_detection_bug_leaves_the_snapshot_unchanged_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="flexmig.wiring.detection")
    gpu = GpuSnapshot(
        index=0, uuid="GPU-0", model_name="NVIDIA H200", memory_total_bytes=None, power_w=None, temperature_c=None,
        sm_clock_mhz=None, mem_clock_mhz=None, mig_current=True, lost=False, free_compute_slices=None,
        free_memory_slices=None, creatable={}, instances=(None,),  # type: ignore[arg-type]
    )  # fmt: skip
    detector = Detector(DetectSettings())
    snaps = [_snapshot(1e9 + i, float(i), (gpu,)) for i in range(3)]
    out = [detector.enrich(s) for s in snaps]
    assert out == snaps  # published as they were, without findings
    assert detector.stats()[1] == 3
    assert len([r for r in caplog.records if "detection failed" in r.getMessage()]) == 1


def test_a_snapshot_keeps_what_it_carried_and_gains_the_report() -> None:
    gpu = GpuSnapshot(
        index=0, uuid="GPU-0", model_name="NVIDIA H200", memory_total_bytes=None, power_w=None, temperature_c=None,
        sm_clock_mhz=None, mem_clock_mhz=None, mig_current=True, lost=False, free_compute_slices=1,
        free_memory_slices=0, creatable={}, instances=(_instance(start=4), _instance(start=0, gpu_instance_id=1)),
    )  # fmt: skip
    snap = dataclasses.replace(_snapshot(1e9, 10.0, (gpu,)), findings=("another layer's",))
    out = Detector(DetectSettings()).enrich(snap)
    assert out.findings[0] == "another layer's"
    report = report_of(out)
    assert report is not None
    assert [g.layout for g in report.fragmentation.gpus] == ["3g.71gb@0+3g.71gb@4"]
