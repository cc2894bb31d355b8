"""The daemon's cost: real ``flexmigd --sim`` processes, their CPU over a window, split by a profile into flexmig's own
work and the simulated library's.

Each run starts ``flexmigd --sim h200x8:1g.18gb@0+...+1g.18gb@6`` (8 H200s, 7 x 1g.18gb each: 56 MIG devices) at its
default 1 s interval with an empty configuration, lets it settle, and measures it for ``--seconds``: its CPU time
(user + system, from ``/proc/PID/stat``) over the window, its resident memory at the end and at its peak, with a
scrape of ``/metrics`` every 15 s as Prometheus would. Two workloads: the simulated demo workload (instances' load
and processes change every second), and ``--no-sim-workload`` (nothing on the node changes at all).

The simulated libnvidia-ml is Python and runs inside the daemon, where a real driver's calls are C. To say what is
flexmig's own, each run attaches ``py-spy record --nonblocking --gil`` (it reads the process's memory and never
stops it) and sorts every sample of the thread holding the GIL, that is running Python, by its stack:

* **simulated library**: the sample is inside a call into the simulated libnvidia-ml: a ``flexmig/sim/`` frame below
  a ``pynvml`` frame (pynvml's own Python, which wraps the real C library too, stays flexmig's);
* **simulated workload**: a ``flexmig/sim/`` frame that no pynvml call reached: the demo workload stepping the
  simulated node (with real GPUs, the jobs themselves);
* **flexmig**: everything else: the event loop, sampling, snapshots, detection, metrics, MQTT, the actuator.

Flexmig's own share is the window's CPU (from /proc: exact) times the share of the samples in that class. This is
sound where py-spy's sampling is unbiased across code (it samples on a timer, not on events) and enough samples are
taken: the figures print the sample counts, and the CPU the samples account for beside /proc's. Samples of the GIL
holder, not of every thread the kernel calls runnable: on a busy machine a thread just woken from ``epoll_wait`` or
a queue is runnable while it waits for a core, and counting it would charge the waiting to the event loop (the
kernel's own time in system calls, made without the GIL, is shared out in proportion). Subtracting
the library's measured in-call time instead would need a timer around each of the ~500 calls a sweep makes, whose
own cost (two clock reads a call) is of the order of what is measured.

Each figure is the median of ``--runs`` runs, with the load average at the end of each run beside it; the machine is
printed first. Goals (issue #45): flexmig's own work < 0.5 % of a core with the workload, < 0.2 % when nothing
changes; RSS < 60 MB.

Run: ``.venv/bin/python bench/daemon.py [--runs N] [--seconds S] [--rate HZ] [--quick] [--markdown FILE]``.
``--quick``: one run of 20 s each. Needs py-spy (``pip install flexmig[bench]``); without it, ``--no-profile``
measures the totals only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
BIG = "h200x8:" + "+".join(f"1g.18gb@{i}" for i in range(7))
WORKLOADS = {"simulated workload": (), "nothing changes (--no-sim-workload)": ("--no-sim-workload",)}
OWN_GOAL = {"simulated workload": 0.5, "nothing changes (--no-sim-workload)": 0.2}
RSS_GOAL_MB = 60.0
SETTLE_S = 8.0


@dataclass(frozen=True)
class Run:
    """One measured window of one daemon."""

    cpu_pct: float  # % of one core, from /proc
    rss_mib: float
    peak_mib: float
    load: str
    samples: Counter[str]  # on-CPU samples by class (empty without a profile)
    stacks: Counter[str]  # on-CPU samples by flexmig's innermost own function, for the report
    rate: int
    seconds: float

    def share(self, kind: str) -> float | None:
        """``kind``'s part of the CPU, % of one core (None without a profile)."""
        total = sum(self.samples.values())
        return None if not total else self.cpu_pct * self.samples[kind] / total

    def sampled_pct(self) -> float:
        """The CPU the samples account for, % of one core (beside /proc's, to judge the profile)."""
        return 100.0 * sum(self.samples.values()) / self.rate / self.seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_status_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def load_average() -> str:
    """The load average now, as /proc/loadavg gives it."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def classify(stack: str) -> str:
    """The class of one sampled stack (root first, frames separated by ``;``): see the module's docstring."""
    frames = stack.split(";")
    in_pynvml = False
    for frame in frames:
        where = frame.rsplit("(", 1)[-1]
        if where.startswith("pynvml"):
            in_pynvml = True
        elif where.startswith("flexmig/sim/"):
            return "simulated library" if in_pynvml else "simulated workload"
        elif frame.startswith("demo_workload_loop.<locals>.step "):
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
    port = _free_port()
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


def measure(extra: tuple[str, ...], seconds: float, rate: int, profile: bool) -> Run:
    """One daemon, one window of ``seconds`` after the settle, with a profile when ``profile``."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(extra, Path(tmp))
        spy: subprocess.Popen[bytes] | None = None
        raw = Path(tmp) / "profile.txt"
        try:
            time.sleep(SETTLE_S)  # the first inventory, windows filling, the first GPM samples
            if profile:
                spy = subprocess.Popen(
                    [_py_spy(), "record", "--pid", str(proc.pid), "--nonblocking", "--gil", "--rate", str(rate),
                     "--duration", str(round(seconds)), "--format", "raw", "--output", str(raw)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )  # fmt: skip
            cpu0, t0 = _proc_cpu_s(proc.pid), time.monotonic()
            next_scrape = t0
            while (now := time.monotonic()) < t0 + seconds:
                if now >= next_scrape:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        resp.read()
                    next_scrape += 15.0
                time.sleep(min(1.0, t0 + seconds - now))
            cpu1, t1 = _proc_cpu_s(proc.pid), time.monotonic()
            rss, peak = _proc_status_mib(proc.pid, "VmRSS"), _proc_status_mib(proc.pid, "VmHWM")
            classes: Counter[str] = Counter()
            sites: Counter[str] = Counter()
            if spy is not None:
                spy.wait(seconds + 60)
                classes, sites = parse_profile(raw.read_text()) if raw.exists() else (Counter(), Counter())
            return Run(100.0 * (cpu1 - cpu0) / (t1 - t0), rss, peak, load_average(), classes, sites, rate, t1 - t0)
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
        raise SystemExit("daemon: py-spy is not installed (pip install flexmig[bench]); or run with --no-profile")
    return found


def _median(runs: list[Run], kind: str) -> float | None:
    got = [s for r in runs if (s := r.share(kind)) is not None]
    return statistics.median(got) if got else None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}%"


def report(name: str, runs: list[Run]) -> None:
    """Print one workload's runs and medians."""
    print(f"\n{name}:")
    for i, r in enumerate(runs, 1):
        parts = ", ".join(f"{k} {_pct(r.share(k))}" for k in ("flexmig", "simulated library", "simulated workload"))
        prof = f"; {parts}; {sum(r.samples.values())} samples ({r.sampled_pct():.2f}% sampled)" if r.samples else ""
        print(f"  run {i}: total {r.cpu_pct:.2f}% of a core, RSS {r.rss_mib:.1f} MiB (peak {r.peak_mib:.1f}){prof}; "
              f"load {r.load}")  # fmt: skip
    own = _median(runs, "flexmig")
    total = statistics.median(r.cpu_pct for r in runs)
    rss = statistics.median(r.rss_mib for r in runs)
    goal = OWN_GOAL[name]
    verdict = "" if own is None else f" (goal < {goal}%: {'met' if own < goal else 'MISSED'})"
    library = _pct(_median(runs, "simulated library"))
    print(f"  median: flexmig's own {_pct(own)}{verdict}, simulated library {library}, "
          f"simulated workload {_pct(_median(runs, 'simulated workload'))}, total {total:.2f}%; RSS {rss:.1f} MiB "
          f"(goal < {RSS_GOAL_MB:.0f} MB: {'met' if rss * 2**20 < RSS_GOAL_MB * 1e6 else 'MISSED'})")  # fmt: skip
    sites: Counter[str] = Counter()
    for r in runs:
        sites.update(r.stacks)
    if sites:
        n = sum(sites.values())
        print("  flexmig's own samples by innermost flexmig function (all runs):")
        for site, count in sites.most_common(12):
            print(f"    {100 * count / n:5.1f}%  {site}")


def markdown(results: dict[str, list[Run]], started: datetime, cmd: str, seconds: float) -> str:
    """The "Daemon cost" section of docs/results.md."""
    out = [
        "## Daemon cost",
        "",
        f"`{cmd}` ({started:%Y-%m-%d %H:%M} UTC; {machine()}). `flexmigd --sim` on 8 H200s with 7 x 1g.18gb each "
        f"(56 MIG devices), its default 1 s interval, an empty configuration, scraped every 15 s; CPU over "
        f"{seconds:.0f} s from /proc after a settle, split by a py-spy profile of the same window: *flexmig* is everything but "
        "the simulated libnvidia-ml's Python inside NVML calls (*library*, C on a real node) and the demo workload "
        "stepping the simulated node (*workload*). Median of the runs; each run's load average at its end beside it.",
        "",
        "| workload | flexmig's own (goal) | library | workload | total | RSS (peak) | load average of the runs |",
        "|---|---|---|---|---|---|---|",
    ]
    glance = []
    for name, runs in results.items():
        own = _median(runs, "flexmig")
        goal = OWN_GOAL[name]
        ok = "" if own is None else (": met" if own < goal else ": missed")
        total = statistics.median(r.cpu_pct for r in runs)
        rss = statistics.median(r.rss_mib for r in runs)
        peak = statistics.median(r.peak_mib for r in runs)
        loads = "; ".join(r.load for r in runs)
        out.append(
            f"| {name} | {_pct(own)} (< {goal}%{ok}) | {_pct(_median(runs, 'simulated library'))} | "
            f"{_pct(_median(runs, 'simulated workload'))} | {total:.2f}% | {rss:.1f} MiB ({peak:.1f}) | {loads} |"
        )
        glance.append(
            f"| flexmigd at a 1 s interval, 56 MIG devices, {name} (`bench/daemon.py`) | flexmig's own "
            f"{_pct(own)} of one core (total with the simulated library {total:.2f}%), {rss:.1f} MiB RSS | "
            f"< {goal}%, < {RSS_GOAL_MB:.0f} MB |"
        )
    out += ["", "<!-- glance -->", *glance, "<!-- /glance -->"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure both workloads and print the figures; exit status 1 when a goal is missed."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="runs per workload (median reported)")
    p.add_argument("--seconds", type=float, default=40.0, help="measured window per run")
    p.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    p.add_argument("--no-profile", action="store_true", help="totals only (no py-spy)")
    p.add_argument("--quick", action="store_true", help="one run of 20 s per workload")
    p.add_argument("--markdown", type=Path, help="also write the section of docs/results.md to this file")
    args = p.parse_args(argv)
    runs, seconds = (1, 20.0) if args.quick else (args.runs, args.seconds)
    if not 1 <= runs <= 20 or not 5.0 <= seconds <= 600.0 or not 10 <= args.rate <= 2000:
        p.error("--runs 1-20, --seconds 5-600, --rate 10-2000")
    started = datetime.now(UTC)
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    results: dict[str, list[Run]] = {name: [] for name in WORKLOADS}
    for _ in range(runs):  # the workloads alternate, so both see the same machine
        for name, extra in WORKLOADS.items():
            results[name].append(measure(extra, seconds, args.rate, not args.no_profile))
    missed = False
    for name, got in results.items():
        report(name, got)
        own = _median(got, "flexmig")
        missed |= (own is not None and own >= OWN_GOAL[name]) or statistics.median(r.rss_mib for r in got) * 2**20 >= (
            RSS_GOAL_MB * 1e6
        )
    print(f"\nload average after: {load_average()}")
    if args.markdown:
        cmd = ".venv/bin/python bench/daemon.py" + (" --quick" if args.quick else "")
        args.markdown.write_text(markdown(results, started, cmd, seconds))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
