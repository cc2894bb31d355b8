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

Part 3: detection's cost per sweep, the daemon's own gauge ``flexmig_detect_duration_seconds`` read once a second
for ``--seconds`` from ``flexmigd --sim`` on the 56-device node (median).

``--against COMMIT`` (repeatable) answers whether the code or a published figure moved: it checks the commit out in
a temporary git worktree and runs parts 2 and 3 on that tree and on this one in the same run, alternating
``--rounds`` times (default 3), so both see the same machine and load, and prints the medians side by side.

Run: ``.venv/bin/python bench/sampling.py [--sweeps N] [--seconds S] [--against COMMIT] [--quick] [--markdown
FILE]``. ``--quick``: 50 sweeps, 15 s per daemon measurement, one round.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from nvitop import PhysicalDevice

from flexmig import sim
from flexmig.mig import parse_node_spec
from flexmig.nvml import GpmWindows, Nvml
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import SamplingStats
from flexmig.telemetry.store import TelemetryStore
from machine import machine
from procstat import free_port, proc_cpu_s, proc_status_bytes

ROOT = Path(__file__).resolve().parent.parent

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


def _env(tree: Path | None) -> dict[str, str]:
    """The environment of a daemon run from ``tree`` (a checkout; None: this one, as installed)."""
    env = {**os.environ, "NOTIFY_SOCKET": ""}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(tree / d) for d in ("daemon", "hook/src"))
    return env


def _start(spec: str, tree: Path | None, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``flexmigd --sim spec`` from ``tree`` with an empty configuration, serving on a free port; (process, URL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    config = workdir / "flexmig.toml"
    config.write_text("")
    config.chmod(0o600)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flexmig.daemon",
            "--sim",
            spec,
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--config",
            str(config),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(tree),
        cwd=workdir,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
            return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"flexmigd --sim {spec} did not start") from None
            time.sleep(0.2)


def bench_daemon(spec: str, seconds: float, tree: Path | None = None) -> tuple[float, int, int]:
    """(CPU % of one core, RSS bytes at the end, peak RSS bytes) of ``flexmigd --sim spec``, scraped every 15 s."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(spec, tree, Path(tmp))
        try:
            time.sleep(5.0)  # settle: windows filling, first GPM samples
            cpu0, t0 = proc_cpu_s(proc.pid), time.monotonic()
            next_scrape = t0
            while (now := time.monotonic()) < t0 + seconds:
                if now >= next_scrape:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        resp.read()
                    next_scrape += 15.0
                time.sleep(min(1.0, t0 + seconds - now))
            cpu1, t1 = proc_cpu_s(proc.pid), time.monotonic()
            return (
                100.0 * (cpu1 - cpu0) / (t1 - t0),
                proc_status_bytes(proc.pid, "VmRSS"),
                proc_status_bytes(proc.pid, "VmHWM"),
            )
        finally:
            proc.terminate()
            proc.wait(20)


def bench_detection(spec: str, seconds: float, tree: Path | None = None) -> float | None:
    """Median of ``flexmig_detect_duration_seconds`` read once a second (None: the daemon does not export it)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(spec, tree, Path(tmp))
        try:
            time.sleep(5.0)
            seen: list[float] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    text = resp.read().decode()
                for line in text.splitlines():
                    if line.startswith("flexmig_detect_duration_seconds"):
                        seen.append(float(line.rsplit(" ", 1)[1]))
                time.sleep(1.0)
            return statistics.median(seen) if seen else None
        finally:
            proc.terminate()
            proc.wait(20)


@contextlib.contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """``commit`` checked out in a temporary git worktree of this repository (removed afterwards)."""
    tmp = Path(tempfile.mkdtemp(prefix="flexmig-bench-"))
    tree = tmp / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True, capture_output=True
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False, capture_output=True
        )
        shutil.rmtree(tmp, ignore_errors=True)


def head() -> str:
    """This checkout's commit, short."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "this tree"


def compare(commits: list[str], seconds: float, rounds: int) -> list[tuple[str, float, float, float | None]]:
    """Parts 2 and 3 on each of ``commits`` and on this tree, alternating; (name, CPU %, RSS MiB, detection ms)."""
    with contextlib.ExitStack() as stack:
        trees: list[tuple[str, Path | None]] = [(c, stack.enter_context(checkout(c))) for c in commits]
        trees.append((f"{head()} (this tree)", None))
        got: dict[str, list[tuple[float, float, float | None]]] = {name: [] for name, _ in trees}
        for r in range(rounds):
            for name, tree in trees if r % 2 == 0 else list(reversed(trees)):
                cpu, rss, _ = bench_daemon(BIG, seconds, tree)
                det = bench_detection(BIG, seconds, tree)
                got[name].append((cpu, rss / 2**20, None if det is None else det * 1000))
                print(
                    f"  round {r + 1}: {name}: CPU {cpu:.2f}%, RSS {rss / 2**20:.1f} MiB, detection "
                    f"{'n/a' if det is None else f'{det * 1000:.2f} ms'}",
                    flush=True,
                )
    out = []
    for name, rows in got.items():
        dets = [d for _, _, d in rows if d is not None]
        out.append(
            (
                name,
                statistics.median(c for c, _, _ in rows),
                statistics.median(m for _, m, _ in rows),
                statistics.median(dets) if dets else None,
            )
        )
    return out


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Run the parts and print the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweeps", type=int, default=200, help="timed sweeps per rival (median reported)")
    p.add_argument("--seconds", type=float, default=45.0, help="daemon measurement period per spec")
    p.add_argument("--skip-daemon", action="store_true", help="only the in-process sweep comparison")
    p.add_argument("--against", action="append", default=[], metavar="COMMIT", help="also measure COMMIT's tree")
    p.add_argument("--rounds", type=int, default=3, help="alternations with --against (default 3)")
    p.add_argument("--quick", action="store_true", help="50 sweeps, 15 s per daemon measurement, one round")
    p.add_argument("--markdown", type=Path, help="also write the section of docs/results.md to this file")
    args = p.parse_args(argv)
    sweeps, seconds, rounds = (50, 15.0, 1) if args.quick else (args.sweeps, args.seconds, args.rounds)
    started = datetime.now(UTC)
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    print(f"\n[1] one sweep of {BIG.split(':')[0]}, 7 x 1g.18gb per GPU (56 MIG devices), median of {sweeps}")
    med = bench_sweeps(sweeps)
    base = med["nvitop, devices kept"]
    for name, t in med.items():
        print(f"  {name:38s} {t * 1e3:8.2f} ms CPU   {t / base:5.2f}x nvitop (devices kept)")
    ratio = med["flexmig Nvml.sample (GPM)"] / base
    full = med["flexmig sampler (sample + snapshot)"] / base
    verdict = "meets" if ratio <= 0.5 else "MISSES"
    print(f"  ratio flexmig/nvitop: {ratio:.2f} (sample), {full:.2f} (with snapshot); goal <= 0.50: {verdict}")

    daemons: list[tuple[str, int, float, float, float]] = []
    detection: float | None = None
    if not args.skip_daemon:
        print(f"\n[2] flexmigd --sim at 1 s interval, {seconds:.0f} s after a 5 s settle, scraped every 15 s")
        for spec in (DEMO, BIG):
            cpu, rss, hwm = bench_daemon(spec, seconds)
            goal = "meets" if cpu < 1.0 and rss < 80 * 2**20 else "MISSES"
            node = parse_node_spec(spec)
            devices = node.count * (0 if node.layout is None else len(node.layout))
            daemons.append((spec, devices, cpu, rss / 2**20, hwm / 2**20))
            print(
                f"  {node.model.key}x{node.count} {devices:3d} MIG devices: CPU {cpu:5.2f}% of one core, "
                f"RSS {rss / 2**20:5.1f} MiB (peak {hwm / 2**20:5.1f} MiB); goal < 1% and < 80 MiB: {goal}"
            )
        det = bench_detection(BIG, seconds)
        detection = None if det is None else det * 1000
        print(
            f"\n[3] detection per sweep, 56 MIG devices, median over {seconds:.0f} s: "
            f"{'n/a' if detection is None else f'{detection:.2f} ms'}"
        )
    compared: list[tuple[str, float, float, float | None]] = []
    if args.against:
        print(f"\n[4] this tree against {', '.join(args.against)}: parts 2 (56 MIG devices) and 3, {rounds} round(s)")
        compared = compare(args.against, seconds, rounds)
        for name, cpu, rss, det in compared:
            print(
                f"  {name:28s} CPU {cpu:5.2f}% of one core, RSS {rss:5.1f} MiB, detection "
                f"{'n/a' if det is None else f'{det:.2f} ms'} (medians)"
            )
    print(f"\nload average after: {load_average()}")
    if args.markdown:
        args.markdown.write_text(markdown(sweeps, med, daemons, detection, compared, started, args.quick))
    return 0


def markdown(
    sweeps: int,
    med: dict[str, float],
    daemons: list[tuple[str, int, float, float, float]],
    detection: float | None,
    compared: list[tuple[str, float, float, float | None]],
    started: datetime,
    quick: bool,
) -> str:
    """The "Sampling cost" section of docs/results.md."""
    cmd = ".venv/bin/python bench/sampling.py" + (" --quick" if quick else "")
    base = med["nvitop, devices kept"]
    out = [
        "## Sampling cost",
        "",
        f"`{cmd}` ({started:%Y-%m-%d %H:%M} UTC; {machine()}; load average {load_average()} at the end). The same "
        "simulated libnvidia-ml, the same process, sweeps alternating between rivals, CPU time of the sweeping "
        f"thread, median of {sweeps} sweeps of 8 H200s with 7 x 1g.18gb each (56 MIG devices). A sweep reads, per "
        "GPU, power, temperature, clocks and MIG mode, and per MIG device memory used/total, processes and "
        "utilization: flexmig with GPM activity, nvitop with what its API offers (no GPM; utilization N/A on MIG).",
        "",
        "| rival | CPU per sweep | vs nvitop |",
        "|---|---|---|",
    ]
    out += [f"| {name} | {t * 1e3:.2f} ms | {t / base:.2f}x |" for name, t in med.items()]
    if daemons:
        out += [
            "",
            "`flexmigd --sim` as a process at the default 1 s interval with the demo workload, scraped every 15 s, "
            "CPU and memory from /proc (the simulated driver is Python and runs inside the daemon; a real driver's "
            "calls are C):",
            "",
            "| node | CPU (% of one core) | RSS (peak) | goal |",
            "|---|---|---|---|",
        ]
        for spec, devices, cpu, rss, hwm in daemons:
            ok = "met" if cpu < 1.0 and rss < 80 else "missed"
            out.append(
                f"| `{spec}` ({devices} MIG devices) | {cpu:.2f}% | {rss:.1f} MiB ({hwm:.1f}) | < 1%, < 80 MB: {ok} |"
            )
    if detection is not None:
        out += [
            "",
            f"Detection per sweep on the 56-device node (the daemon's `flexmig_detect_duration_seconds`, "
            f"median): {detection:.2f} ms.",
        ]
    if compared:
        out += [
            "",
            "The same measurements on older trees, alternating with this one in the same run:",
            "",
            "| tree | CPU (% of one core) | RSS | detection |",
            "|---|---|---|---|",
        ]
        out += [
            f"| {name} | {cpu:.2f}% | {rss:.1f} MiB | {'n/a' if det is None else f'{det:.2f} ms'} |"
            for name, cpu, rss, det in compared
        ]
    ratio = med["flexmig Nvml.sample (GPM)"] / base
    out += [
        "",
        "<!-- glance -->",
        f"| one sampling sweep, 8 x H200 with 56 MIG devices (`bench/sampling.py`) | "
        f"{med['flexmig Nvml.sample (GPM)'] * 1e3:.2f} ms CPU, {ratio:.2f}x nvitop's API | <= 0.5x |",
    ]
    # flexmigd's own cost at 56 MIG devices has its rows from bench/daemon.py, which separates the simulation's
    if detection is not None:
        out.append(f"| detection per sweep, 56 MIG devices | {detection:.2f} ms median | |")
    out.append("<!-- /glance -->")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
