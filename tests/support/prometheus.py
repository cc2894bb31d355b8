"""A real Prometheus scraping flexmigd (started with :func:`support.flexmigd.running_daemon`), for integration tests
(not a test module).

It listens on loopback at a free port, keeps its files under the test's directory, and is stopped by the context
manager that starts it; every wait is bounded. Used by ``test_daemon_prometheus.py`` and
``test_dashboards_prometheus.py``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from flexmig import sim
from support.wait import free_port, wait_until

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
START_S = 60.0  # the bound on waiting for a server to come up


def http_get(url: str, timeout: float = 5.0) -> bytes:
    """The body of ``url``."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


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


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    """Stop ``proc`` with ``sig``, then SIGKILL if it has not exited within ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def prometheus(
    workdir: Path, jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = (), interval: str = "1s"
) -> Iterator[int]:
    """A Prometheus on a free loopback port scraping ``jobs`` (job name -> targets) every ``interval``, with
    ``rule_files`` loaded and evaluated at the same interval; yields its port, terminates it on exit."""
    port = free_port()
    home = workdir / f"prometheus-{port}"
    home.mkdir(parents=True)
    config = home / "prometheus.yml"
    lines = [f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}"]
    if rule_files:
        lines.append("rule_files:\n" + "".join(f"  - {json.dumps(str(p))}\n" for p in rule_files).rstrip())
    lines.append("scrape_configs:")
    for job, targets in jobs.items():
        lines.append(
            f"  - job_name: {json.dumps(job)}\n    static_configs:\n      - targets: {json.dumps(list(targets))}"
        )
    config.write_text("\n".join(lines) + "\n")
    with (home / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={home / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bytes:
            if proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited with {proc.returncode}: {(home / 'prometheus.log').read_text()}"
                )
            return http_get(f"http://127.0.0.1:{port}/-/ready")

        try:
            wait_until(ready, START_S, "prometheus ready", every_s=0.2)
            yield port
        finally:
            stop(proc)


def api(port: int, path: str, **params: str | Sequence[str]) -> Any:
    """``data`` of a Prometheus HTTP API call (``/api/v1/<path>``); fails on an error status."""
    url = f"http://127.0.0.1:{port}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
    body = json.loads(http_get(url))
    assert body["status"] == "success", body
    return body["data"]


def query(port: int, promql: str) -> list[dict[str, Any]]:
    """The result vector of an instant query."""
    return list(api(port, "query", query=promql)["result"])
