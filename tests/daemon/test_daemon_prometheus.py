"""flexmigd as a process, scraped by a real Prometheus server; its exposition passes promtool; signals stop it.

The simulated node is deterministic (UUIDs and IDs follow from the spec and the seed), so the test installs the
same spec in this process to read the simulator's ground truth, then compares what Prometheus stored.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics import parser as om_parser

from support.flexmigd import running_daemon
from support.prometheus import (
    PROMETHEUS,
    PROMTOOL,
    SPEC,
    api,
    ground_truth,
    http_get,
    query,
)
from support.prometheus import prometheus as run_prometheus
from support.wait import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# What Prometheus 2.42 sends when it scrapes: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    with running_daemon(tmp_path, SPEC) as d:
        yield d.proc, d.port


@pytest.fixture
def prometheus(tmp_path: Path, daemon: tuple[subprocess.Popen[bytes], int]) -> Iterator[int]:
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus (Debian package prometheus) is not installed")
    _, target = daemon
    with run_prometheus(tmp_path, {"flexmig": [f"127.0.0.1:{target}"]}) as port:
        yield port


def test_prometheus_scrapes_a_series_per_mig_instance_matching_the_simulator(prometheus: int) -> None:
    truth = ground_truth(SPEC)
    assert len(truth) == 6
    results = wait_until(
        lambda: (
            (r := query(prometheus, 'flexmig_mig_memory_total_bytes{job="flexmig"}')) and len(r) == len(truth) and r
        ),
        60,
        "one flexmig_mig_memory_total_bytes series per instance in Prometheus",
        every_s=0.2,
    )
    assert isinstance(results, list)
    seen = {}
    for r in results:
        labels = r["metric"]
        assert isinstance(labels, dict)
        value = r["value"]
        assert isinstance(value, list)
        seen[labels["mig_uuid"]] = (
            int(labels["gpu"]),
            int(labels["GPU_I_ID"]),
            labels["GPU_I_PROFILE"],
            int(float(value[1])),
        )
        assert labels["UUID"].startswith("GPU-") and labels["model_name"] == "NVIDIA H200"
    assert seen == truth

    # the activity figures flow too (the demo workload drives them), joined on the same identity labels
    def all_active() -> bool:
        got = query(prometheus, "count(flexmig_mig_sm_active_ratio)")
        return bool(got) and int(float(got[0]["value"][1])) == len(truth)

    wait_until(all_active, 60, "a GPM activity series for every instance", every_s=0.2)
    used = query(prometheus, "flexmig_mig_memory_used_bytes <= on(mig_uuid) flexmig_mig_memory_total_bytes")
    assert len(used) == len(truth)


def test_prometheus_scrapes_flexmigd_without_error_in_the_openmetrics_it_asks_for_first(prometheus: int) -> None:
    def scraped() -> list[dict[str, Any]]:
        targets = api(prometheus, "targets", state="active")["activeTargets"]
        return targets if targets and all(t["lastScrape"].startswith("2") for t in targets) else []

    (target,) = wait_until(scraped, 60, "a scrape of flexmigd", every_s=0.2)
    assert (target["health"], target["lastError"]) == ("up", "")
    # what Prometheus got is OpenMetrics (its Accept header asks for that first), and valid to prometheus_client too
    request = urllib.request.Request(target["scrapeUrl"], headers={"Accept": PROMETHEUS_ACCEPT})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        body = resp.read().decode()
    families = list(om_parser.text_string_to_metric_families(body))  # type: ignore[no-untyped-call]
    assert {"flexmig_last_sweep_cpu_seconds", "flexmig_sweep_cpu_seconds"} <= {f.name for f in families}


def test_the_live_exposition_passes_promtool(daemon: tuple[subprocess.Popen[bytes], int]) -> None:
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool (Debian package prometheus) is not installed")
    _, port = daemon
    text = http_get(f"http://127.0.0.1:{port}/metrics")
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_stop_the_daemon_cleanly(daemon: tuple[subprocess.Popen[bytes], int], sig: int) -> None:
    proc, port = daemon
    proc.send_signal(sig)
    assert proc.wait(20) == 0
    with pytest.raises(OSError):
        http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_or_sim_the_daemon_says_so_and_exits_1() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flexmig.daemon", "--metrics-addr", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert b"no NVIDIA driver found" in done.stderr


def test_a_non_loopback_metrics_address_is_refused_without_allow_remote() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flexmig.daemon", "--sim", "h200", "--metrics-addr", "0.0.0.0:9400"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert b"not loopback" in done.stderr


def test_a_taken_metrics_port_is_named_with_the_usual_culprit_and_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "flexmig.daemon", "--sim", "h200", "--metrics-addr", f"127.0.0.1:{port}"],
            capture_output=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
    assert done.returncode == 1
    line = done.stderr.decode().strip().splitlines()[-1]
    assert f"cannot serve metrics on 127.0.0.1:{port}" in line
    assert "--metrics-addr" in line and "dcgm-exporter" in line
