"""The metrics port cannot take the daemon down.

flexmigd in mode ``act`` on a simulated node, with a real job running and ``LimitNOFILE=1024`` (prlimit), is held
under a slowloris attack on its metrics port: a separate process keeps 1,100 half-open connections (a request line
and headers trickled every 2 s, never the blank line that ends the head), reopening each one the server closes,
for 60 s. Meanwhile this test scrapes ``/metrics``, asks the control socket for ``status`` and ``plan``, and checks
that planning rounds go on. Pass: every probe answered within its bounded wait (1 s), the daemon's RSS stayed under
80 MB, it never ran out of descriptors, and it is alive with no traceback at the end. The latencies, RSS and
descriptor counts are printed (they are measurements, not part of the verdict).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from flexmig.act.client import ControlClient
from support.flexmigd import act_node, sample, short_base
from support.jobs import counter_spec, write_spec
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.timeout(300)]

SLOWLORIS = Path(__file__).resolve().parents[1] / "support" / "slowloris.py"
CONNECTIONS = 1100
ATTACK_S = 60.0
BOUND_S = 1.0  # every probe must be answered within this
RSS_LIMIT = 80 * 1024 * 1024
NOFILE = 1024


def timed(probe: Callable[[], Any]) -> tuple[float, Any, str | None]:
    """(seconds, result, error) of one probe."""
    t0 = time.monotonic()
    try:
        result = probe()
    except Exception as exc:  # a timeout, a refused or reset connection, an error answer: all failures
        return time.monotonic() - t0, None, f"{type(exc).__name__}: {exc}"
    return time.monotonic() - t0, result, None


def summary(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs) * 1000:.1f} ms, max {max(xs) * 1000:.1f} ms (n={len(xs)})"


def test_a_slowloris_on_the_metrics_port_leaves_metrics_control_and_planning_answering() -> None:
    with short_base("fm-slow-") as base, act_node(base, "h200x2:1g.18gb@0+1g.18gb@1", nofile=NOFILE) as node:
        assert node.proc is not None
        daemon = psutil.Process(node.proc.pid)
        assert daemon.rlimit(psutil.RLIMIT_NOFILE) == (NOFILE, NOFILE)
        client = ControlClient(node.sock, timeout_s=BOUND_S)
        spec = write_spec(base / "train.toml", counter_spec(base, "train", step_time=0.05))
        assert ControlClient(node.sock, timeout_s=60).call("jobs.submit", path=str(spec))["ok"]
        wait_until(lambda: node.jobs().get("train", {}).get("state") == "running", what="the job runs")

        def scrape() -> str:
            with urllib.request.urlopen(node.url, timeout=BOUND_S) as resp:
                return str(resp.read().decode())

        stats_file = base / "slowloris.json"
        attacker = subprocess.Popen(
            [sys.executable, str(SLOWLORIS), "--port", str(node.port), "--connections", str(CONNECTIONS),
             "--seconds", str(ATTACK_S), "--stats", str(stats_file)],
        )  # fmt: skip
        latencies: dict[str, list[float]] = {"metrics": [], "status": [], "plan": []}
        failures: list[str] = []
        rss: list[int] = []
        fds: list[int] = []
        rounds: list[tuple[float, float]] = []  # (time, planner runs)
        moved: list[Any] = []
        mover = threading.Thread(
            target=lambda: moved.append(
                timed(lambda: ControlClient(node.sock, timeout_s=60).call("jobs.migrate", name="train"))
            ),
            daemon=True,
        )
        sweeps_before = sample(scrape(), "flexmig_sweeps_total") or 0.0
        cpu_before = sum(daemon.cpu_times()[:2])
        try:
            started = time.monotonic()
            while attacker.poll() is None:
                if not mover.is_alive() and not moved and time.monotonic() > started + ATTACK_S / 3:
                    mover.start()  # a migration in the middle of the attack: a checkpoint, new instances, a launch
                for name, probe in (
                    ("metrics", scrape),
                    ("status", lambda: client.call("status")),
                    ("plan", lambda: client.call("plan")),
                ):
                    took, result, error = timed(probe)
                    latencies[name].append(took)
                    if error is not None or took > BOUND_S:
                        failures.append(f"{time.monotonic() - started:5.1f} s {name}: {error or f'{took:.2f} s'}")
                    elif name == "metrics":
                        rounds.append((time.monotonic(), sample(result, "flexmig_planner_runs_total") or 0.0))
                rss.append(daemon.memory_info().rss)
                fds.append(daemon.num_fds())
                time.sleep(0.25)
        finally:
            if attacker.poll() is None:
                attacker.kill()
            attacker.wait(30)
        cpu = sum(daemon.cpu_times()[:2]) - cpu_before
        attack = json.loads(stats_file.read_text())
        _, after, error = timed(scrape)
        text = after or ""
        if error is not None:
            failures.append(f"after the attack, metrics: {error}")
        print(
            f"\nslowloris: {attack} | flexmigd alive: {node.proc.poll() is None}, open fds max {max(fds)} of {NOFILE}"
            f", RSS max {max(rss) / 2**20:.1f} MB, CPU {cpu:.1f} s in {ATTACK_S:.0f} s"
            f" | metrics {summary(latencies['metrics'])} | status {summary(latencies['status'])}"
            f" | plan {summary(latencies['plan'])} | server: evicted"
            f" {sample(text, 'flexmig_metrics_connections_evicted_total')}, refused"
            f" {sample(text, 'flexmig_metrics_connections_refused_total')}, timed out"
            f" {sample(text, 'flexmig_metrics_connections_timed_out_total')}"
        )
        mover.join(60)
        assert moved and moved[0][2] is None and moved[0][1]["ok"], f"the migration during the attack: {moved}"
        assert node.jobs()["train"]["generation"] == 2 and node.jobs()["train"]["state"] == "running"
        assert (sample(text, "flexmig_sweeps_total") or 0) > sweeps_before + ATTACK_S / 4, "sampling went on"
        assert not sample(text, "flexmig_source_errors_total", source="host"), "host reads never failed"
        assert attack["held_max"] == CONNECTIONS and attack["cycles"] >= ATTACK_S / 2 - 1, attack
        assert not failures, "probes not answered within 1 s:\n" + "\n".join(failures[:20])
        assert max(rss) < RSS_LIMIT, f"RSS reached {max(rss) / 2**20:.1f} MB"
        assert node.proc.poll() is None, "flexmigd is alive"
        # Planning went on through the attack: a round in every 10 s of it.
        for t in range(0, int(ATTACK_S) - 10, 10):
            window = [runs for at, runs in rounds if started + t <= at <= started + t + 12]
            assert window and max(window) > min(window), f"no planning round between {t} s and {t + 12} s"
        log = node.log.read_text()
        for bad in ("Traceback", "never retrieved", "Too many open files"):
            assert bad not in log, log[-3000:]
        assert os.path.exists(node.sock)
