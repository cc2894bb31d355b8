"""Scrape cost: what a ``/metrics`` scrape costs flexmigd and returns, at each detail level and 1, 4 and 16 scrapers.

Part 1, in one process, on the same snapshot: a simulated node of 16 H200s with 7 x 1g.18gb each (112 MIG devices,
the size issue 23 measured: 54 ms and 897 KB per scrape), sampled through the daemon's path with detection, and
every extension flexmigd wires in mode act. Per detail level and per scrape, CPU of this thread
(``time.thread_time``, median of ``--repeat``):

* rival, **prometheus_client**: the same families as library ``Metric`` objects through its OpenMetrics encoder,
  rendered at every scrape (what flexmigd did before: build the families, encode every label of every sample);
* **flexmig, 1 / 4 / 16 scrapers**: :class:`flexmig.metrics.scrape.Exposition`, a new snapshot per sweep and that
  many scrapes of it (one render of the snapshot part, shared; the live part at every scrape), gzip asked as
  Prometheus asks it.

and the body per MIG instance, plain and gzipped. Goals (issue 23): at most 0.05 ms of CPU per MIG device per
scrape, and at most 4 KB of body per MIG instance at the default detail (standard).

Part 2: ``flexmigd --sim`` (8 H200s x 7 x 1g.18gb, 56 MIG devices, the demo workload, the default detail) as a
process; its CPU (every thread's, ended ones included: ``procstat.proc_cpu_s``, /proc/PID/stat in clock ticks, over
windows of ``--seconds``) is read with no scraper for
``--seconds``, then with 1, 4 and 16 concurrent scrapers
each scraping once per sweep (1 s) as Prometheus does (OpenMetrics, gzip); the CPU a scrape adds is the difference
over the scrapes made.

Run: ``.venv/bin/python bench/scrape.py [--quick] [--repeat N] [--seconds S] [--skip-daemon] [--markdown FILE]``.
``--quick``: 10 repeats, 8 s per daemon phase. The machine and the load average are printed first.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics import exposition as om

from flexmig.metrics.collector import SnapshotCollector, build_registry
from flexmig.metrics.families import LEVELS, Level
from flexmig.metrics.scrape import Exposition
from machine import machine
from procstat import free_port, proc_cpu_s

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support.metrics_rig import extensions, sampled_node  # noqa: E402

BIG = "h200x16:" + "+".join(f"1g.18gb@{i}" for i in range(7))
NODE = "h200x8:" + "+".join(f"1g.18gb@{i}" for i in range(7))
PROMETHEUS = {
    "HTTP_ACCEPT": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "HTTP_ACCEPT_ENCODING": "gzip",
}
GOAL_CPU_MS = 0.05
GOAL_BODY = 4096
SCRAPERS = (1, 4, 16)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_of(fn: Callable[[], object], repeat: int) -> float:
    """Median CPU seconds of this thread per call of ``fn`` (after one untimed call)."""
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        out.append(time.thread_time() - t0)
    return statistics.median(out)


def scrape(app: Exposition) -> bytes:
    """One scrape as Prometheus makes it (OpenMetrics, gzip)."""
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", **PROMETHEUS}
    return b"".join(app(env, lambda _s, _h: None))


@dataclasses.dataclass(frozen=True)
class Row:
    """One detail level in process: CPU per scrape (s) of the rival and of flexmig at each scraper count, and the
    body per instance."""

    level: Level
    rival_s: float
    shared_s: dict[int, float]
    body: int
    gzipped: int


def in_process(repeat: int) -> tuple[int, list[Row]]:
    """Part 1: the MIG device count and one row per detail level."""
    snap = sampled_node(BIG, busy=112)
    devices = sum(len(g.instances) for g in snap.gpus)
    ext = extensions("act")
    rows = []
    for level in LEVELS:
        registry = build_registry(SnapshotCollector(lambda: snap, ext, detail=level))
        rival = cpu_of(lambda registry=registry: om.generate_latest(registry), repeat)  # type: ignore[misc]
        latest = [snap]
        app = Exposition(lambda latest=latest: latest[0], ext, detail=level)  # type: ignore[misc]
        shared: dict[int, float] = {}
        for k in SCRAPERS:

            def sweep(k: int = k, latest: list[Any] = latest, app: Exposition = app) -> None:
                latest[0] = dataclasses.replace(latest[0], taken_at=latest[0].taken_at + 1.0)  # a new sweep
                for _ in range(k):
                    scrape(app)

            shared[k] = cpu_of(sweep, repeat) / k
        body = app.body(openmetrics=True)
        rows.append(Row(level, rival, shared, len(body) // devices, len(gzip.compress(body)) // devices))
    return devices, rows


def daemon(seconds: float) -> tuple[int, list[tuple[int, int, float, int]]]:
    """Part 2: (MIG devices, rows of (scrapers, scrapes, CPU ms added per scrape, body bytes))."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    headers = {"Accept": PROMETHEUS["HTTP_ACCEPT"], "Accept-Encoding": "gzip"}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "flexmig.toml"
        config.write_text("")
        config.chmod(0o600)
        argv = [
            sys.executable,
            "-m",
            "flexmig.daemon",
            "--sim",
            NODE,
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--config",
            str(config),
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            body = _wait_up(url, headers, proc)
            time.sleep(3.0)  # windows filling, first GPM samples
            rows: list[tuple[int, int, float, int]] = []
            t0, c0 = time.monotonic(), proc_cpu_s(proc.pid)
            time.sleep(seconds)
            idle_rate = (proc_cpu_s(proc.pid) - c0) / (time.monotonic() - t0)
            for k in SCRAPERS:
                done = [0]
                stop = threading.Event()

                def scraper(offset: float, stop: threading.Event = stop, done: list[int] = done) -> None:
                    time.sleep(offset)
                    while not stop.is_set():
                        req = urllib.request.Request(url, headers=headers)
                        with urllib.request.urlopen(req, timeout=10) as resp:
                            resp.read()
                        done[0] += 1
                        stop.wait(1.0)

                threads = [threading.Thread(target=scraper, args=(i / k,), daemon=True) for i in range(k)]
                t0, c0 = time.monotonic(), proc_cpu_s(proc.pid)
                for t in threads:
                    t.start()
                time.sleep(seconds)
                stop.set()
                for t in threads:
                    t.join(15)
                spent = proc_cpu_s(proc.pid) - c0 - idle_rate * (time.monotonic() - t0)
                rows.append((k, done[0], 1000.0 * spent / max(1, done[0]), len(body)))
            return 56, rows
        finally:
            proc.terminate()
            proc.wait(20)


def _wait_up(url: str, headers: dict[str, str], proc: subprocess.Popen[bytes]) -> bytes:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers={"Accept": headers["Accept"]}), timeout=5
            ) as resp:
                body = resp.read()
                if b"flexmig_mig_memory_used_bytes" in body:
                    return bytes(body)
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("flexmigd --sim did not start")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30, help="timed sweeps per case in part 1 (median)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per daemon phase in part 2")
    parser.add_argument("--skip-daemon", action="store_true", help="part 1 only")
    parser.add_argument("--quick", action="store_true", help="10 repeats, 8 s per daemon phase")
    parser.add_argument("--markdown", type=Path, help="also write the section of docs/results.md to this file")
    args = parser.parse_args(argv)
    repeat, seconds = (10, 8.0) if args.quick else (args.repeat, args.seconds)
    started = datetime.now(UTC)
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    devices, rows = in_process(repeat)
    print(f"\n[1] one scrape of {BIG.split(':')[0]} ({devices} MIG devices), OpenMetrics, mode act; CPU per scrape")
    for r in rows:
        cells = "  ".join(f"{k:2d} scraper(s) {1000 * s / devices:.4f}" for k, s in r.shared_s.items())
        print(
            f"  {r.level:8} prometheus_client {1000 * r.rival_s / devices:.4f} ms/device ({1000 * r.rival_s:.1f} ms);"
            f" flexmig {cells} ms/device; body {r.body} B/instance ({r.gzipped} B gzipped)"
        )
    std = next(r for r in rows if r.level == "standard")
    worst = max(std.shared_s.values()) * 1000 / devices
    print(
        f"  goals at standard: CPU <= {GOAL_CPU_MS} ms/device per scrape: {worst:.4f} "
        f"({'met' if worst <= GOAL_CPU_MS else 'MISSED'}); body <= {GOAL_BODY} B/instance: {std.body} "
        f"({'met' if std.body <= GOAL_BODY else 'MISSED'})"
    )
    live: list[tuple[int, int, float, int]] = []
    node_devices = 0
    if not args.skip_daemon:
        node_devices, live = daemon(seconds)
        print(
            f"\n[2] flexmigd --sim {NODE.split(':')[0]} ({node_devices} MIG devices), standard, {seconds:.0f} s a phase"
        )
        for k, n, ms, body in live:
            print(
                f"  {k:2d} scraper(s): {n} scrapes, {ms:.2f} ms CPU per scrape ({ms / node_devices:.4f} ms/device);"
                f" body {body / node_devices:.0f} B/instance"
            )
    print(f"\nload average after: {load_average()}")
    if args.markdown:
        args.markdown.write_text(markdown(devices, rows, node_devices, live, started, args.quick))
    return 0


def markdown(
    devices: int,
    rows: list[Row],
    node_devices: int,
    live: list[tuple[int, int, float, int]],
    started: datetime,
    quick: bool,
) -> str:
    """The "Scrape cost" section of docs/results.md."""
    cmd = ".venv/bin/python bench/scrape.py" + (" --quick" if quick else "")
    out = [
        "## Scrape cost",
        "",
        f"`{cmd}` ({started:%Y-%m-%d %H:%M} UTC; {machine()}; load average {load_average()} at the end). "
        f"In one process, one simulated node of {devices} MIG devices (16 H200s, 7 x 1g.18gb each) with every "
        "extension of mode act; CPU of the scraping thread per scrape, per MIG device, OpenMetrics with gzip as "
        "Prometheus asks; the rival is prometheus_client's encoder over the same families at every scrape. "
        "1 / 4 / 16 scrapers: that many scrapes of each sweep's snapshot, sharing its one render:",
        "",
        "| detail | prometheus_client (ms/device) | flexmig, 1 / 4 / 16 scrapers (ms/device) | body per instance "
        "(gzipped) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        shared = " / ".join(f"{1000 * s / devices:.4f}" for s in r.shared_s.values())
        out.append(f"| {r.level} | {1000 * r.rival_s / devices:.4f} | {shared} | {r.body} B ({r.gzipped} B) |")
    std = next(r for r in rows if r.level == "standard")
    worst = max(std.shared_s.values()) * 1000 / devices
    out += [
        "",
        f"- goal CPU at most {GOAL_CPU_MS} ms per MIG device per scrape (standard): {worst:.4f} ms "
        f"({'met' if worst <= GOAL_CPU_MS else 'missed'}); goal body at most 4 KB per MIG instance (standard): "
        f"{std.body} B ({'met' if std.body <= GOAL_BODY else 'missed'})",
    ]
    if live:
        out += [
            f"- `flexmigd --sim` with {node_devices} MIG devices at the default detail, CPU the daemon adds per scrape "
            "(from /proc, less its CPU without scrapers): "
            + "; ".join(
                f"{k} scraper(s) {ms:.2f} ms ({ms / node_devices:.4f} ms/device, {n} scrapes)" for k, n, ms, _ in live
            )
        ]
    out += [
        "",
        "<!-- glance -->",
        f"| `/metrics` scrape, {devices} MIG devices, default detail (`bench/scrape.py`) | {worst:.4f} ms CPU per "
        f"device, {std.body} B per instance (prometheus_client: {1000 * std.rival_s / devices:.3f} ms) "
        "| <= 0.05 ms, <= 4 KB |",
        "<!-- /glance -->",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
