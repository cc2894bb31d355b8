"""Sampling cost: flexmig's sweep against nvitop's API, and the daemon's own CPU and memory.

Part 1 (in one process, same simulated libnvidia-ml): a node of 8 H200s with 7 x 1g.18gb each (56 MIG devices),
one process per device. One sweep reads, for every GPU, power, temperature, SM and memory clocks and MIG mode,
and for every MIG device memory used/total, the compute processes, and utilization:

* flexmig: ``Nvml.sample(GpmWindows)`` (GPM SM/occupancy/DRAM/tensor activity per instance), and the full
  sampler step (the same plus building the immutable snapshot with its ring-buffer windows);
* nvitop: the ``Device`` API on the same fields (``memory_info``, ``processes``, ``gpu_utilization`` -- N/A on
  MIG, nvitop has no GPM -- and the GPU sensors), with device objects kept between sweeps (its cheapest use), and
  re-enumerating MIG devices each sweep (what following instance churn needs, as flexmig does).

Sweeps alternate between the rivals; each is timed with ``time.thread_time`` (CPU of this thread); the simulated
clock advances one second per sweep so GPM takes a real sample every time, as at the daemon's 1 s interval.

Part 2: ``flexmigd --sim`` runs as a subprocess at its default 1 s interval (demo workload on); its CPU time and
resident memory are read from /proc over a measurement period, with a scrape every 15 s as Prometheus would.
The simulated driver is Python and runs inside the daemon, so these figures include the driver's own cost.

Run: ``.venv/bin/python bench/sampling.py [--sweeps N] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from nvitop import PhysicalDevice

from flexmig import sim
from flexmig.mig import parse_node_spec
from flexmig.nvml import GpmWindows, Nvml
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import SamplingStats
from flexmig.telemetry.store import TelemetryStore
from machine import machine

BIG = "h200x8:" + "+".join(f"1g.18gb@{i}" for i in range(7))
DEMO = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
_STATS = SamplingStats(0, 0.0, 0.0, 0.0, 1, {}, {})


class FakeClock:
    """The simulator's and GPM's clock: one second per sweep, so every sweep is a full GPM window."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def thread_cpu(fn: Callable[[], object]) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def bench_sweeps(sweeps: int) -> dict[str, float]:
    clock = FakeClock()
    node = sim.install(BIG, clock=clock)
    nvml = Nvml.open()
    try:
        for i, uuid in enumerate(node.mig_uuids()):
            node.start_process(uuid, memory_bytes=(1 + i % 5) << 30)
            node.set_activity(uuid, sm=0.1 + (i % 9) / 10, dram=0.2, tensor=0.3)
        gpm = GpmWindows(clock=clock)
        settings = TelemetrySettings()
        store = TelemetryStore(settings, "bench")
        store.set_inventory(nvml.inventory())

        def flexmig_sample() -> None:
            nvml.sample(gpm)

        def flexmig_full() -> None:
            store.build(nvml.sample(gpm), now=clock.t, wall=clock.t, stats=_STATS)

        logging.getLogger("nvitop").setLevel(logging.CRITICAL)  # missing encoder/decoder calls are logged once
        devices = [PhysicalDevice(i) for i in range(PhysicalDevice.count())]
        kept = [(d, d.mig_devices()) for d in devices]
        assert sum(len(m) for _, m in kept) == 56, "expected 56 MIG devices"

        def read_gpu(d: PhysicalDevice) -> None:
            d.power_usage()
            d.temperature()
            d.sm_clock()
            d.memory_clock()
            d.is_mig_mode_enabled()

        def read_mig(m: object) -> None:
            m.memory_info()  # type: ignore[attr-defined]
            m.processes()  # type: ignore[attr-defined]
            m.gpu_utilization()  # type: ignore[attr-defined]

        def nvitop_kept() -> None:
            for d, migs in kept:
                read_gpu(d)
                for m in migs:
                    read_mig(m)

        def nvitop_enumerating() -> None:
            for d in devices:
                read_gpu(d)
                for m in d.mig_devices():
                    read_mig(m)

        rivals: dict[str, Callable[[], None]] = {
            "flexmig Nvml.sample (GPM)": flexmig_sample,
            "flexmig sampler (sample + snapshot)": flexmig_full,
            "nvitop, devices kept": nvitop_kept,
            "nvitop, re-enumerating": nvitop_enumerating,
        }
        for fn in rivals.values():  # warm-up: caches, first GPM samples, nvitop's one-time logging
            for _ in range(3):
                clock.t += 1.0
                fn()
        clock.t += 1.0
        check = [d for g in nvml.sample(gpm) for d in g.mig_devices]
        assert len(check) == 56 and all(d.activity is not None and d.processes for d in check), "sweep incomplete"
        times: dict[str, list[float]] = {name: [] for name in rivals}
        for _ in range(sweeps):
            for name, fn in rivals.items():
                clock.t += 1.0
                times[name].append(thread_cpu(fn))
        return {name: statistics.median(ts) for name, ts in times.items()}
    finally:
        nvml.close()
        sim.uninstall()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def bench_daemon(spec: str, seconds: float) -> tuple[float, int, int]:
    """(CPU % of one core, RSS bytes at the end, peak RSS bytes) of ``flexmigd --sim spec``."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexmig.daemon", "--sim", spec, "--metrics-addr", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    resp.read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"flexmigd --sim {spec} did not start") from None
                time.sleep(0.2)
        time.sleep(5.0)  # settle: windows filling, first GPM samples
        cpu0, t0 = _proc_cpu_s(proc.pid), time.monotonic()
        next_scrape = t0
        while (now := time.monotonic()) < t0 + seconds:
            if now >= next_scrape:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    resp.read()
                next_scrape += 15.0
            time.sleep(min(1.0, t0 + seconds - now))
        cpu1, t1 = _proc_cpu_s(proc.pid), time.monotonic()
        return 100.0 * (cpu1 - cpu0) / (t1 - t0), _proc_status(proc.pid, "VmRSS"), _proc_status(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait(20)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", type=int, default=200, help="timed sweeps per rival (median reported)")
    p.add_argument("--seconds", type=float, default=45.0, help="daemon measurement period per spec")
    p.add_argument("--skip-daemon", action="store_true", help="only the in-process sweep comparison")
    args = p.parse_args()

    print(f"machine: {machine()}")
    print(f"\n[1] one sweep of {BIG.split(':')[0]}, 7 x 1g.18gb per GPU (56 MIG devices), median of {args.sweeps}")
    med = bench_sweeps(args.sweeps)
    base = med["nvitop, devices kept"]
    for name, t in med.items():
        print(f"  {name:38s} {t * 1e3:8.2f} ms CPU   {t / base:5.2f}x nvitop (devices kept)")
    ratio = med["flexmig Nvml.sample (GPM)"] / base
    full = med["flexmig sampler (sample + snapshot)"] / base
    verdict = "meets" if ratio <= 0.5 else "MISSES"
    print(f"  ratio flexmig/nvitop: {ratio:.2f} (sample), {full:.2f} (with snapshot); goal <= 0.50: {verdict}")

    if not args.skip_daemon:
        print(f"\n[2] flexmigd --sim at 1 s interval, {args.seconds:.0f} s after a 5 s settle, scraped every 15 s")
        for spec in (DEMO, BIG):
            cpu, rss, hwm = bench_daemon(spec, args.seconds)
            goal = "meets" if cpu < 1.0 and rss < 80 * 2**20 else "MISSES"
            node = parse_node_spec(spec)
            devices = node.count * (0 if node.layout is None else len(node.layout))
            print(
                f"  {node.model.key}x{node.count} {devices:3d} MIG devices: CPU {cpu:5.2f}% of one core, "
                f"RSS {rss / 2**20:5.1f} MiB (peak {hwm / 2**20:5.1f} MiB); goal < 1% and < 80 MiB: {goal}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
