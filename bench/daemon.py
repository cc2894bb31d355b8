"""The daemon's cost: real ``flexmigd --sim`` processes, their CPU over a window, and flexmig's own share of it.

Each run starts ``flexmigd --sim h200x8:1g.18gb@0+...+1g.18gb@6`` (8 H200s, 7 x 1g.18gb each: 56 MIG devices) at its
default 1 s interval with an empty configuration, lets it settle, and measures it for ``--seconds``: its CPU time
over the window (every thread's ``/proc/PID/task/TID/schedstat``, in ns: ``/proc/PID/stat``'s 10 ms clock ticks are
0.05 % of a core over 20 s, a quarter of the goal; the ticks are used only if a thread ended in the window), its
resident memory at the end and at its peak, with a
scrape of ``/metrics`` every 15 s as Prometheus would. Two workloads: the simulated demo workload (instances' load
and processes change every second), and ``--no-sim-workload`` (nothing on the node changes at all).

The simulated libnvidia-ml is Python and runs inside the daemon, where a real driver's calls are C; the demo
workload that moves the simulated node is Python too. Flexmig's own share is the total less both:

* **simulated library**: the CPU the simulated library spends inside NVML calls, measured in this process on the
  same node, the same workload and the same clock step (one second a sweep): every C entry point pynvml resolved
  is wrapped in a thread-CPU timer, the timer's own cost (calibrated on an empty function) taken off each call.
  One sweep's calls are ``Nvml.sample`` with GPM, plus an inventory every 30 sweeps (the sampler's every 60 s and
  the planning round's every 60 s); the library is deterministic given the node's state, so its cost here is its
  cost in the daemon.
* **simulated workload**: one step of the demo workload and of the jobs' footprint (``--no-sim-workload``: the
  jobs' only), timed the same way. The sampler steps it on the NVML thread right before each sweep's reads, in the
  sweep's own trip there (on real hardware there is no step, and the trip is the same).

Flexmig's own = total (exact, from /proc) - (library + workload per sweep) x sweeps a second. pynvml's own Python,
which wraps the real C library too, stays flexmig's. Subtracting is sound where the in-process calls cost what the
daemon's do: same code, same node state, same machine; a loaded machine slows both alike (CPU time, not wall).

Where flexmig's own time goes, by area (NVML reads, the snapshot, detection, host facts, the ``/metrics`` render, the
rest), is measured apart, in this process (``bench/daemon_stages.py``): the same sweep path, each area timed.

``--profile`` also attaches ``py-spy record --nonblocking --gil`` to each run (it reads the process's memory, never
stops it) and prints where flexmig's own samples fall (by innermost flexmig function): on a busy machine a thread
holding the GIL while it waits for a core is sampled too, so these shares say where, not how much.

Each figure is the median of ``--runs`` runs, with the load average at the end of each run beside it; the machine is
printed first. Goals (issue #45): flexmig's own work < 0.5 % of a core with the workload, < 0.2 % when nothing
changes; RSS < 60 MB.

Run: ``.venv/bin/python bench/daemon.py [--runs N] [--seconds S] [--profile [--rate HZ]] [--quick] [--markdown
FILE]``. ``--quick``: one run of 20 s each. ``--profile`` needs py-spy (``pip install flexmig[bench]``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from daemon_stages import AREAS, GC, stages
from flexmig import sim
from flexmig.nvml import GpmWindows, Nvml
from machine import machine
from procstat import free_port, proc_cpu_s, proc_status_bytes, threads_cpu_s, window_cpu_s

BIG = "h200x8:" + "+".join(f"1g.18gb@{i}" for i in range(7))
WORKLOADS = {"simulated workload": (), "nothing changes (--no-sim-workload)": ("--no-sim-workload",)}
OWN_GOAL = {"simulated workload": 0.5, "nothing changes (--no-sim-workload)": 0.2}
RSS_GOAL_MB = 60.0
SETTLE_S = 8.0
INVENTORY_EVERY = 30  # sweeps: the sampler's inventory every 60 s and the planning round's every 60 s


@dataclass(frozen=True)
class Run:
    """One measured window of one daemon."""

    cpu_pct: float  # % of one core: every thread's schedstat (ns), /proc/PID/stat (10 ms ticks) if one ended
    main_pct: float  # of which the main thread's (the event loop: snapshot, detection, timers), schedstat
    rss_mib: float
    peak_mib: float
    load: str
    sites: Counter[str] = field(default_factory=Counter)  # py-spy samples of flexmig's own, by innermost function


@dataclass(frozen=True)
class SimCost:
    """CPU seconds a sweep spends in the simulated library and in stepping the simulated workload."""

    library_s: float
    workload_s: float
    calls: float  # NVML calls a sweep

    def pct(self) -> float:
        """Both, as % of one core at one sweep a second."""
        return 100.0 * (self.library_s + self.workload_s)


class FakeClock:
    """The simulator's and GPM's clock: one second a sweep, as at the daemon's interval."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _timer_cost(n: int = 20000) -> float:
    """What one wrapped call adds inside its own timing (the clock read between start and end), in seconds."""
    acc = [0.0]
    fn = _timed(lambda *a: 0, acc)
    for _ in range(n):
        fn()
    return acc[0] / n


def _timed(fn: Callable[..., Any], acc: list[float]) -> Callable[..., Any]:
    tt = time.thread_time

    def timed(*args: Any) -> Any:
        t0 = tt()
        try:
            return fn(*args)
        finally:
            acc[0] += tt() - t0

    return timed


def sim_cost(workload: bool, sweeps: int) -> SimCost:
    """The simulated library's and workload's CPU per sweep, measured in this process (see the module docstring)."""
    clock = FakeClock()
    node = sim.install(BIG, clock=clock)
    nvml = Nvml.open()
    try:
        gpm = GpmWindows(clock=clock)
        jobs = sim.JobLoad(node)

        def step(now: float) -> None:
            if workload:
                node.step_workload(now)
            jobs(now)

        for _ in range(3):  # every entry point a sweep and an inventory use gets resolved
            clock.t += 1.0
            step(clock.t)
            nvml.sample(gpm)
        nvml.inventory()
        acc, calls = [0.0], [0]
        cache = N._nvmlGetFunctionPointer_cache
        for name, fn in list(cache.items()):
            cache[name] = _counted(_timed(fn, acc), calls)
        per_call = _timer_cost()
        stepping = 0.0
        for i in range(sweeps):
            clock.t += 1.0
            t0 = time.thread_time()
            step(clock.t)
            stepping += time.thread_time() - t0
            nvml.sample(gpm)
            if i % INVENTORY_EVERY == 0:
                nvml.inventory()
        library = max(0.0, acc[0] - calls[0] * per_call)
        return SimCost(library / sweeps, stepping / sweeps, calls[0] / sweeps)
    finally:
        nvml.close()
        sim.uninstall()


def _counted(fn: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    def counted(*args: Any) -> Any:
        calls[0] += 1
        return fn(*args)

    return counted


def load_average() -> str:
    """The load average now, as /proc/loadavg gives it."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def classify(stack: str) -> str:
    """The class of one sampled stack (root first, frames separated by ``;``): inside a call into the simulated
    library (a ``flexmig/sim/`` frame below a pynvml frame), stepping the simulated workload, or flexmig's own."""
    for frame in stack.split(";"):
        where = frame.rsplit("(", 1)[-1]
        if where.startswith("pynvml"):
            return "simulated library" if "(flexmig/sim/" in stack.split(frame, 1)[1] else "flexmig"
        if where.startswith("flexmig/sim/") or frame.startswith("demo_workload_loop.<locals>.step "):
            return "simulated workload"
    return "flexmig"


def own_site(stack: str) -> str:
    """The innermost flexmig frame of a stack of flexmig's own (where its time is spent, for the report)."""
    frames = stack.split(";")
    for frame in reversed(frames):
        if "(flexmig/" in frame:
            name, where = frame.rsplit(" (", 1)
            return f"{name} ({where.split(':')[0]})"
    leaf = frames[-1]
    return leaf.rsplit(":", 1)[0] + ")" if ":" in leaf else leaf


def parse_profile(text: str) -> tuple[Counter[str], Counter[str]]:
    """(samples by class, samples of flexmig's own work by innermost flexmig function) of a py-spy raw profile."""
    classes: Counter[str] = Counter()
    sites: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        kind = classify(stack)
        classes[kind] += int(count)
        if kind == "flexmig":
            sites[own_site(stack)] += int(count)
    return classes, sites


def _start(extra: tuple[str, ...], workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    config = workdir / "flexmig.toml"
    config.write_text("")
    config.chmod(0o600)
    cmd = [sys.executable, "-m", "flexmig.daemon", "--sim", BIG, "--metrics-addr", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [*cmd, "--config", str(config), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "NOTIFY_SOCKET": ""},
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
                raise RuntimeError(f"flexmigd --sim {BIG} {' '.join(extra)} did not start") from None
            time.sleep(0.2)


def measure(extra: tuple[str, ...], seconds: float, rate: int | None) -> Run:
    """One daemon, one window of ``seconds`` after the settle, with a py-spy profile at ``rate`` Hz (None: none)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(extra, Path(tmp))
        spy: subprocess.Popen[bytes] | None = None
        raw = Path(tmp) / "profile.txt"
        try:
            time.sleep(SETTLE_S)  # the first inventory, windows filling, the first GPM samples
            if rate is not None:
                spy = subprocess.Popen(
                    [_py_spy(), "record", "--pid", str(proc.pid), "--nonblocking", "--gil", "--rate", str(rate),
                     "--duration", str(round(seconds)), "--format", "raw", "--output", str(raw)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )  # fmt: skip
            cpu0, threads0, t0 = proc_cpu_s(proc.pid), threads_cpu_s(proc.pid), time.monotonic()
            next_scrape = t0
            while (now := time.monotonic()) < t0 + seconds:
                if now >= next_scrape:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        resp.read()
                    next_scrape += 15.0
                time.sleep(min(1.0, t0 + seconds - now))
            cpu1, threads1, t1 = proc_cpu_s(proc.pid), threads_cpu_s(proc.pid), time.monotonic()
            rss, peak = proc_status_bytes(proc.pid, "VmRSS") / 2**20, proc_status_bytes(proc.pid, "VmHWM") / 2**20
            sites: Counter[str] = Counter()
            if spy is not None:
                spy.wait(seconds + 60)
                sites = parse_profile(raw.read_text())[1] if raw.exists() else Counter()
            span = t1 - t0
            exact = window_cpu_s(threads0, threads1)  # /proc/PID/stat's 10 ms ticks are 0.05 % of 20 s
            cpu = cpu1 - cpu0 if exact is None else exact
            main = threads1[proc.pid] - threads0[proc.pid]
            return Run(100.0 * cpu / span, 100.0 * main / span, rss, peak, load_average(), sites)
        finally:
            if spy is not None and spy.poll() is None:
                spy.kill()
                spy.wait(10)
            proc.terminate()
            proc.wait(20)


def _py_spy() -> str:
    here = Path(sys.executable).parent / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("daemon: --profile needs py-spy (pip install flexmig[bench])")
    return found


@dataclass(frozen=True)
class Figures:
    """One workload's medians."""

    own: float
    total: float
    main: float  # the main thread's share of ``total`` (the rest: the NVML thread with the simulation, HTTP)
    sim: SimCost
    rss: float
    peak: float
    loads: tuple[str, ...]


def figures(runs: list[Run], cost: SimCost) -> Figures:
    """The medians of one workload's runs, flexmig's own share being each run's total less the simulation's."""
    return Figures(
        own=statistics.median(r.cpu_pct - cost.pct() for r in runs),
        total=statistics.median(r.cpu_pct for r in runs),
        main=statistics.median(r.main_pct for r in runs),
        sim=cost,
        rss=statistics.median(r.rss_mib for r in runs),
        peak=statistics.median(r.peak_mib for r in runs),
        loads=tuple(r.load for r in runs),
    )


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(name: str, runs: list[Run], f: Figures) -> None:
    """Print one workload's runs and medians."""
    print(f"\n{name}:")
    print(f"  simulation, measured in this process: library {f.sim.library_s * 1e3:.2f} ms a sweep "
          f"({f.sim.calls:.0f} NVML calls), workload {f.sim.workload_s * 1e3:.2f} ms: "
          f"{f.sim.pct():.2f}% of a core")  # fmt: skip
    for i, r in enumerate(runs, 1):
        print(f"  run {i}: total {r.cpu_pct:.2f}% of a core (main thread {r.main_pct:.2f}%), flexmig's own "
              f"{r.cpu_pct - f.sim.pct():.2f}%, "
              f"RSS {r.rss_mib:.1f} MiB (peak {r.peak_mib:.1f}); load {r.load}")  # fmt: skip
    goal = OWN_GOAL[name]
    print(f"  median: flexmig's own {f.own:.2f}% (goal < {goal}%: {_met(f.own < goal)}), total {f.total:.2f}%; "
          f"RSS {f.rss:.1f} MiB (goal < {RSS_GOAL_MB:.0f} MB: {_met(f.rss * 2**20 < RSS_GOAL_MB * 1e6)})")  # fmt: skip
    sites: Counter[str] = Counter()
    for r in runs:
        sites.update(r.sites)
    if sites:
        n = sum(sites.values())
        print(f"  flexmig's own py-spy samples by innermost flexmig function ({n}, all runs):")
        for site, count in sites.most_common(12):
            print(f"    {100 * count / n:5.1f}%  {site}")


def stage_table(where: dict[str, dict[str, float]]) -> list[str]:
    """Markdown lines: flexmig's own CPU per sweep by area (``bench/daemon_stages.py``), one column per workload."""
    names = list(where)
    out = [
        "| area | " + " | ".join(f"{n}: ms a sweep (share)" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for area in (*AREAS, GC, "own"):
        label = "flexmig's own, in all" if area == "own" else area
        cells = [f"{1e3 * where[n][area]:.2f} ({100 * where[n][area] / where[n]['own']:.0f}%)" for n in names]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def print_stages(where: dict[str, dict[str, float]]) -> None:
    """Print where flexmig's own CPU goes, per workload."""
    for name, got in where.items():
        print(f"\n{name}, in this process (bench/daemon_stages.py): flexmig's own {1e3 * got['own']:.2f} ms a sweep")
        for area in (*AREAS, GC):
            print(f"  {1e3 * got[area]:6.3f} ms {100 * got[area] / got['own']:5.1f}%  {area}")


def markdown(
    results: dict[str, Figures],
    started: datetime,
    cmd: str,
    seconds: float,
    runs: int,
    where: dict[str, dict[str, float]] | None = None,
) -> str:
    """The "Daemon cost" section of docs/results.md (``where``: the areas of ``stage_table``, when measured)."""
    out = [
        "## Daemon cost",
        "",
        f"`{cmd}` ({started:%Y-%m-%d %H:%M} UTC; {machine()}). `flexmigd --sim` on 8 H200s with 7 x 1g.18gb each "
        "(56 MIG devices), its default 1 s interval, an empty configuration, scraped every 15 s; CPU from each "
        "thread's /proc schedstat (ns) over "
        f"{seconds:.0f} s after a settle, median of {runs} run(s), the load average at the end of each beside it. "
        "*Flexmig's own* is the total less the simulation: the simulated libnvidia-ml's CPU inside NVML calls "
        "(C on a real node) and the demo workload's steps, both measured in the benchmark's process on the same "
        "node and workload (every C entry point timed; the timer's cost taken off).",
        "",
        "| workload | flexmig's own (goal) | simulated library + workload | total | RSS (peak) | load average |",
        "|---|---|---|---|---|---|",
    ]
    glance = []
    for name, f in results.items():
        goal = OWN_GOAL[name]
        ok = "met" if f.own < goal else "missed"
        sim_text = f"{100 * f.sim.library_s:.2f}% + {100 * f.sim.workload_s:.2f}%"
        out.append(
            f"| {name} | {f.own:.2f}% (< {goal}%: {ok}) | {sim_text} | {f.total:.2f}% | {f.rss:.1f} MiB "
            f"({f.peak:.1f}) | {'; '.join(f.loads)} |"
        )
        glance.append(
            f"| flexmigd at a 1 s interval, 56 MIG devices, {name} (`bench/daemon.py`) | flexmig's own {f.own:.2f}% "
            f"of one core (with the simulated library {f.total:.2f}%), {f.rss:.1f} MiB RSS | < {goal}%, "
            f"< {RSS_GOAL_MB:.0f} MB |"
        )
    sims = "; ".join(
        f"{name}: the library {1e3 * f.sim.library_s:.2f} ms a sweep ({f.sim.calls:.0f} NVML calls), the workload "
        f"{1e3 * f.sim.workload_s:.2f} ms"
        for name, f in results.items()
    )
    threads = "; ".join(
        f"{name}: the main thread {f.main:.2f}%, the others {f.total - f.main:.2f}% (the simulation "
        f"{f.sim.pct():.2f}% of it)"
        for name, f in results.items()
    )
    out += [
        "",
        f"The simulation, measured in the benchmark's process: {sims}.",
        "",
        "By thread (`/proc/PID/task/TID/schedstat`, medians, % of one core): the main thread runs the event loop, and "
        "with it the snapshot, detection and every timer of the daemon; the others are the NVML thread (flexmig's "
        "NVML reads, the simulated library, the workload's steps) and the metrics server's thread (the `/metrics` "
        f"render). {threads}.",
        "",
    ]
    if where:
        out += [
            "Where flexmig's own time goes: one sweep's path run in the benchmark's process (`bench/daemon_stages.py`: "
            "the sampling loop, the hub with detection, the NVML thread, one `/metrics` render every 15 sweeps, on "
            "the simulator's clock), each area's CPU timed around its call, the simulated library and workload taken "
            "off; *the rest* is the process's CPU less the areas. Garbage collection runs inside the areas and is "
            "shown apart. A sampling profiler (`--profile`, py-spy) agrees on the order but not on the shares on a "
            "shared machine: it also samples threads that wait for a core or for the GIL. The daemon's other "
            "components (the actuator's rounds and timers, the metrics server's thread) are outside the table: the "
            "difference between its total and the daemon's own share above.",
            "",
            *stage_table(where),
            "",
        ]
    out += ["<!-- glance -->", *glance, "<!-- /glance -->"]
    return "\n".join(out) + "\n"


def _shown(argv: list[str]) -> list[str]:
    """The arguments a run was given, as its section shows them: all but ``--markdown FILE`` (where it was written)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--markdown":
            skip = True
        elif not a.startswith("--markdown="):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure both workloads and print the figures; exit status 1 when a goal is missed."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="runs per workload (median reported)")
    p.add_argument("--seconds", type=float, default=40.0, help="measured window per run")
    p.add_argument("--sweeps", type=int, default=300, help="sweeps timed in this process for the simulation's cost")
    p.add_argument("--profile", action="store_true", help="also attach py-spy: where flexmig's own time goes")
    p.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    p.add_argument("--quick", action="store_true", help="one run of 20 s per workload, 60 sweeps")
    p.add_argument("--markdown", type=Path, help="also write the section of docs/results.md to this file")
    args = p.parse_args(argv)
    runs, seconds, sweeps = (1, 20.0, 60) if args.quick else (args.runs, args.seconds, args.sweeps)
    if not 1 <= runs <= 20 or not 5.0 <= seconds <= 600.0 or not 10 <= args.rate <= 2000 or not 10 <= sweeps <= 10000:
        p.error("--runs 1-20, --seconds 5-600, --rate 10-2000, --sweeps 10-10000")
    started = datetime.now(UTC)
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    costs = {name: sim_cost(not extra, sweeps) for name, extra in WORKLOADS.items()}
    where = {name: stages(BIG, not extra, sweeps) for name, extra in WORKLOADS.items()}
    got: dict[str, list[Run]] = {name: [] for name in WORKLOADS}
    for _ in range(runs):  # the workloads alternate, so both see the same machine
        for name, extra in WORKLOADS.items():
            got[name].append(measure(extra, seconds, args.rate if args.profile else None))
    results = {name: figures(got[name], costs[name]) for name in WORKLOADS}
    missed = False
    for name, f in results.items():
        report(name, got[name], f)
        missed |= f.own >= OWN_GOAL[name] or f.rss * 2**20 >= RSS_GOAL_MB * 1e6
    print_stages(where)
    print(f"\nload average after: {load_average()}")
    if args.markdown:
        cmd = " ".join([".venv/bin/python bench/daemon.py", *_shown(sys.argv[1:] if argv is None else argv)])
        args.markdown.write_text(markdown(results, started, cmd, seconds, runs, where))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
