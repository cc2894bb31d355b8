"""flexmigd as a process, scraped by a real Prometheus server; its exposition passes promtool; signals stop it.

The simulated node is deterministic (UUIDs and IDs follow from the spec and the seed), so the test installs the
same spec in this process to read the simulator's ground truth, then compares what Prometheus stored.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig import sim

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def wait_for(what: str, probe: object, timeout_s: float) -> object:
    """Call ``probe()`` until it returns something truthy without raising; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            got = probe()  # type: ignore[operator]
            if got:
                return got
        except (OSError, ValueError, KeyError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout_s} s (last error: {last})")


def ground_truth(spec: str) -> dict[str, tuple[int, int, str, int]]:
    """MIG UUID -> (GPU index, GI ID, profile, memory bytes), straight from the simulator's state."""
    node = sim.install(spec)
    try:
        return {
            ci.uuid: (g.index, gi.id, gi.profile.name, gi.memory_bytes)
            for g in node.gpus()
            for gi in g.gpu_instances
            for ci in gi.compute_instances
        }
    finally:
        sim.uninstall()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    log = (tmp_path / "flexmigd.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexmig.daemon", "--sim", SPEC, "--metrics-addr", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "NOTIFY_SOCKET": ""},
    )
    try:
        wait_for(
            "flexmigd metrics",
            lambda: b"flexmig_mig_memory_total_bytes" in http_get(f"http://127.0.0.1:{port}/metrics"),
            60,
        )
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()


@pytest.fixture
def prometheus(tmp_path: Path, daemon: tuple[subprocess.Popen[bytes], int]) -> Iterator[int]:
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus (Debian package prometheus) is not installed")
    _, target = daemon
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: flexmig\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target}']\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for("prometheus ready", lambda: http_get(f"http://127.0.0.1:{port}/-/ready"), 60)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def query(port: int, promql: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(http_get(url))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_prometheus_scrapes_a_series_per_mig_instance_matching_the_simulator(prometheus: int) -> None:
    truth = ground_truth(SPEC)
    assert len(truth) == 6
    results = wait_for(
        "one flexmig_mig_memory_total_bytes series per instance in Prometheus",
        lambda: (
            (r := query(prometheus, 'flexmig_mig_memory_total_bytes{job="flexmig"}')) and len(r) == len(truth) and r
        ),
        60,
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
        return bool(got) and int(float(got[0]["value"][1])) == len(truth)  # type: ignore[index]

    wait_for("a GPM activity series for every instance", all_active, 60)
    used = query(prometheus, "flexmig_mig_memory_used_bytes <= on(mig_uuid) flexmig_mig_memory_total_bytes")
    assert len(used) == len(truth)


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
