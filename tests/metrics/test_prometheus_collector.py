"""The Prometheus collector over one snapshot: names, units, labels, absent series, promtool's lint."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterable

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from flexmig.metrics.collector import (
    INSTANCE_LABELS,
    MetricsServer,
    SnapshotCollector,
    build_registry,
    instance_labels,
)
from flexmig.metrics.families import LEVELS, Level
from flexmig.metrics.scrape import Exposition
from flexmig.telemetry.ring import WindowStats
from flexmig.telemetry.snapshot import (
    GpuSnapshot,
    HostProcess,
    InstanceActivity,
    InstanceSnapshot,
    ProcessSnapshot,
    SamplingStats,
    Snapshot,
)

GIB = 1 << 30


def _instance(gi: int, *, memory_used: int | None, activity: InstanceActivity | None) -> InstanceSnapshot:
    return InstanceSnapshot(
        gpu_index=0,
        gpu_uuid="GPU-0000",
        model_name="NVIDIA H200",
        mig_uuid=f"MIG-{gi:04d}",
        mig_index=gi,
        gpu_instance_id=gi,
        compute_instance_id=0,
        profile_id=9,
        profile_name="3g.71gb",
        start=0 if gi == 1 else 4,
        memory_slices=4,
        compute_slices=3,
        memory_total_bytes=71 * GIB,
        memory_used_bytes=memory_used,
        processes=(ProcessSnapshot(4242, 2 * GIB, HostProcess(4242, "alice", ("python",), "/", 1.5, 3 * GIB)),)
        if memory_used
        else (),
        activity=activity,
        sm_active_window=WindowStats(60.0, 10, 9.0, 0.5, 0.25, 0.75, 0.7, 0.6) if activity else None,
        memory_used_window=None,
        idle_seconds=0.0 if memory_used else 42.0,
        first_seen=0.0,
    )


def _snapshot() -> Snapshot:
    busy = _instance(1, memory_used=2 * GIB, activity=InstanceActivity("gpm", 1.0, 0.6, 0.3, 0.2, None))
    unknown = _instance(2, memory_used=None, activity=None)
    gpu = GpuSnapshot(
        index=0,
        uuid="GPU-0000",
        model_name="NVIDIA H200",
        memory_total_bytes=141 * GIB,
        power_w=None,
        temperature_c=35.0,
        sm_clock_mhz=1980,
        mem_clock_mhz=None,
        mig_current=True,
        lost=False,
        free_compute_slices=1,
        free_memory_slices=0,
        creatable={"1g.18gb": 0},
        instances=(busy, unknown),
    )
    stats = SamplingStats(5, 0.01, 0.002, 0.01, 1, {("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED"): 5}, {"dcgm": 2})
    return Snapshot(1.7e9, 100.0, "node1", "570.124.06", "12.570", 60.0, (gpu,), stats)


def _text(snapshot: Snapshot | None, extensions: Iterable[object] = ()) -> str:
    registry = build_registry(SnapshotCollector(lambda: snapshot, list(extensions)), process_metrics=False)
    return generate_latest(registry).decode()


def _sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_instance_series_carry_dcgm_exporter_identity_labels_plus_ours() -> None:
    text = _text(_snapshot())
    assert _sample(text, "flexmig_mig_memory_total_bytes", GPU_I_ID="1") == 71 * GIB
    line = next(ln for ln in text.splitlines() if ln.startswith("flexmig_mig_memory_total_bytes{"))
    for label in ("gpu", "UUID", "model_name", "GPU_I_ID", "GPU_I_PROFILE", "Hostname", "GPU_CI_ID", "mig_uuid"):
        assert f'{label}="' in line
    assert set(INSTANCE_LABELS) >= {"gpu", "UUID", "model_name", "GPU_I_ID", "GPU_I_PROFILE", "Hostname"}


def test_unavailable_figures_are_absent_series_never_zero() -> None:
    text = _text(_snapshot())
    assert _sample(text, "flexmig_mig_memory_used_bytes", GPU_I_ID="2") is None
    assert _sample(text, "flexmig_mig_sm_active_ratio", GPU_I_ID="2") is None
    assert _sample(text, "flexmig_mig_tensor_active_ratio", GPU_I_ID="1") is None  # GPM gave no tensor figure
    assert _sample(text, "flexmig_gpu_power_watts", gpu="0") is None
    assert _sample(text, "flexmig_gpu_memory_clock_hertz", gpu="0") is None


def test_units_are_base_units() -> None:
    text = _text(_snapshot())
    assert _sample(text, "flexmig_gpu_sm_clock_hertz", gpu="0") == 1980e6
    assert _sample(text, "flexmig_mig_sm_active_ratio", GPU_I_ID="1") == 0.6
    assert _sample(text, "flexmig_mig_sm_active_mean_ratio", GPU_I_ID="1") == 0.5
    assert _sample(text, "flexmig_mig_processes_resident_memory_bytes", GPU_I_ID="1") == 3 * GIB
    assert _sample(text, "flexmig_mig_idle_seconds", GPU_I_ID="2") == 42.0


def test_own_cost_and_errors_are_metrics() -> None:
    text = _text(_snapshot())
    assert _sample(text, "flexmig_sweeps_total") == 5
    assert _sample(text, "flexmig_nvml_errors_total", call="nvmlDeviceGetPowerUsage", error="NOT_SUPPORTED") == 5
    assert _sample(text, "flexmig_source_errors_total", source="dcgm") == 2
    assert _sample(text, "flexmig_sweep_cpu_seconds_total") == 0.01


def test_before_the_first_sweep_nothing_is_exported() -> None:
    assert "flexmig_" not in _text(None)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
@pytest.mark.parametrize("detail", LEVELS)
def test_promtool_check_metrics_passes_on_what_a_scrape_gets(detail: Level) -> None:
    text = Exposition(_snapshot, detail=detail).body(openmetrics=False)
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


class _Findings:
    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        g = GaugeMetricFamily("flexmig_test_extension", "An extension family.", labels=list(INSTANCE_LABELS))
        for inst in snapshot.instances():
            g.add_metric(instance_labels(snapshot, inst), 1.0)
        yield g


class _Broken:
    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        raise RuntimeError("bug in an extension")


def test_extensions_add_families_on_our_labels_and_a_broken_one_costs_only_itself() -> None:
    text = _text(_snapshot(), [_Broken(), _Findings()])
    assert _sample(text, "flexmig_test_extension", GPU_I_ID="2", GPU_I_PROFILE="3g.71gb") == 1.0
    assert _sample(text, "flexmig_mig_memory_total_bytes", GPU_I_ID="1") == 71 * GIB


@pytest.mark.integration
def test_metrics_server_serves_the_snapshot_and_stops() -> None:
    server = MetricsServer(Exposition(_snapshot), "127.0.0.1", 0)
    _, port = server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            body = resp.read().decode()
        assert "flexmig_mig_memory_used_bytes" in body, "the default detail, standard"
        assert "flexmig_mig_tensor_active_ratio" not in body, "a family of detail full"
        assert "process_resident_memory_bytes" in body
    finally:
        server.stop()
        server.stop()
