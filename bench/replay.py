"""Trace replay: the five MIG policies side by side on a simulated 8 x H200 node.

For each trace (``openb_pod_list_default.csv``, ``openb_pod_list_gpushare40.csv``), each load RHO (0.7, 0.9, 1.1)
and each seed (0, 1, 2) the same thinned job set is replayed under ``static`` (best eligible candidate layout),
``drain``, ``flex`` (with replay's large-model action costs, ``flexmig.replay.costs.REPLAY_SETTINGS``: checkpoint
20 s, restart 30 s, create/destroy 2 s), ``flex`` with re-splitting off, ``fluid`` and the
``bound``. The table gives, per trace and load, the median over seeds of mean completion time (JCT) and makespan
per policy, and the ratios the goals are stated in, as median [min-max over seeds]:

* flex/drain and flex/static mean JCT (goal: flex never worse than drain; >= 5% lower on gpushare40 at 0.9 and
  1.1; >= 17% lower than static on gpushare40 at 0.9/1.1, >= 10% on default);
* flex/fluid makespan (goal <= 1.05) and mean JCT (goal <= 1.10);
* the same ratios for flex without re-splitting.

Every goal is checked on every seed and printed as met or missed, with the worst seed's figure.

Run: ``.venv/bin/python bench/replay.py [--trace-dir DIR] [--processes N] [--json FILE]``. Traces are looked for
in ``--trace-dir``, by default ``../shared/traces/alibaba-gpu-v2023`` relative to the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.run import Prepared, ReplayConfig, prepare, run_policy

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023"
TRACES = ("openb_pod_list_default.csv", "openb_pod_list_gpushare40.csv")
LOADS = (0.7, 0.9, 1.1)
SEEDS = (0, 1, 2)
POLICIES = ("bound", "fluid", "static", "drain", "flex", "flex-nr")

_CACHE: dict[tuple[str, float, int], Prepared] = {}


def machine() -> str:
    """CPU model, cores, Python: where the figures were measured."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def _task(args: tuple[str, str, float, int, str]) -> tuple[str, float, int, str, dict[str, Any], float]:
    trace_dir, trace, rho, seed, policy = args
    key = (trace, rho, seed)
    prep = _CACHE.get(key)
    if prep is None:
        prep = prepare(ReplayConfig(Path(trace_dir) / trace, node="h200x8", load=rho, seed=seed))
        _CACHE[key] = prep
    settings = REPLAY_SETTINGS
    if policy == "flex-nr":
        settings = replace(settings, resplit=False)
    t0 = time.perf_counter()
    result = run_policy(prep, "flex" if policy == "flex-nr" else policy, settings)
    return trace, rho, seed, policy, result.to_json(), time.perf_counter() - t0


def _fmt_ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace-dir", type=Path, default=DEFAULT_DIR, help=f"default {DEFAULT_DIR}")
    parser.add_argument("--processes", type=int, default=min(4, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--loads", default=",".join(map(str, LOADS)), help="comma-separated RHO values")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds")
    parser.add_argument("--traces", default=",".join(TRACES), help="comma-separated trace file names")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    traces = [t for t in args.traces.split(",") if t]
    for t in traces:
        if not (args.trace_dir / t).is_file():
            print(f"replay bench: trace {args.trace_dir / t} not found (use --trace-dir)", file=sys.stderr)
            return 2
    loads = [float(x) for x in args.loads.split(",") if x]
    seeds = [int(x) for x in args.seeds.split(",") if x]
    tasks = [(str(args.trace_dir), t, r, s, p) for t in traces for r in loads for s in seeds for p in POLICIES]
    # Long replays first, so the pool does not end on one straggler.
    tasks.sort(key=lambda a: (a[4] not in ("flex", "flex-nr", "drain"), -a[2]))
    print(f"machine: {machine()}")
    print(f"node h200x8, {len(tasks)} replays on {args.processes} process(es); replay costs: {REPLAY_SETTINGS}")
    start = time.perf_counter()
    results: dict[tuple[str, float, int, str], dict[str, Any]] = {}
    seconds: dict[str, list[float]] = {}
    if args.processes > 1:
        with ProcessPoolExecutor(max_workers=args.processes) as pool:
            for trace, rho, seed, policy, fig, secs in pool.map(_task, tasks, chunksize=1):
                results[(trace, rho, seed, policy)] = fig
                seconds.setdefault(policy, []).append(secs)
    else:
        for task in tasks:
            trace, rho, seed, policy, fig, secs = _task(task)
            results[(trace, rho, seed, policy)] = fig
            seconds.setdefault(policy, []).append(secs)
    wall = time.perf_counter() - start
    report(results, traces, loads, seeds)
    print(
        "\nreplay time per policy (s, median [max]): "
        + ", ".join(f"{p} {statistics.median(v):.1f} [{max(v):.1f}]" for p, v in seconds.items())
    )
    print(f"total wall time {wall:.0f}s")
    if args.json:
        rows = [{**fig, "trace": t, "load": r, "seed": s, "policy": p} for (t, r, s, p), fig in sorted(results.items())]
        args.json.write_text(json.dumps({"machine": machine(), "results": rows}, indent=1))
    return 0


def report(
    results: dict[tuple[str, float, int, str], dict[str, Any]],
    traces: list[str],
    loads: list[float],
    seeds: list[int],
) -> None:
    """Print the per-trace tables and the goal checks."""
    goals: list[str] = []
    for trace in traces:
        short = trace.removeprefix("openb_pod_list_").removesuffix(".csv")
        first = results[(trace, loads[0], seeds[0], "static")]
        print(f"\n== {short}: {first['rows_mapped']} GPU jobs mapped, skipped {first['rows_skipped']}")
        chosen = sorted({results[(trace, r, s, "static")]["static_layout"] for r in loads for s in seeds})
        print(f"   static layout chosen: {chosen}")
        head = f"{'RHO':>4} {'jobs':>5} | " + " ".join(f"{p:>9}" for p in POLICIES)
        print("   median mean JCT (h) per policy")
        print("   " + head)
        for rho in loads:
            jobs = statistics.median(results[(trace, rho, s, "flex")]["jobs"] for s in seeds)
            cells = [
                statistics.median(results[(trace, rho, s, p)]["mean_jct_s"] for s in seeds) / 3600 for p in POLICIES
            ]
            print(f"   {rho:>4} {jobs:>5.0f} | " + " ".join(f"{c:>9.1f}" for c in cells))
        print("   median makespan (days) per policy")
        print("   " + head)
        for rho in loads:
            jobs = statistics.median(results[(trace, rho, s, "flex")]["jobs"] for s in seeds)
            cells = [
                statistics.median(results[(trace, rho, s, p)]["makespan_s"] for s in seeds) / 86400 for p in POLICIES
            ]
            print(f"   {rho:>4} {jobs:>5.0f} | " + " ".join(f"{c:>9.2f}" for c in cells))
        print("   ratios, median [min-max] over seeds")
        print(
            f"   {'RHO':>4} | {'variant':8} | {'JCT/drain':>20} {'JCT/static':>20} {'JCT/fluid':>20} {'mksp/fluid':>20}"
        )
        for rho in loads:
            for variant in ("flex", "flex-nr"):

                def ratio(
                    other: str, key: str, variant: str = variant, rho: float = rho, trace: str = trace
                ) -> list[float]:
                    return [
                        results[(trace, rho, s, variant)][key] / results[(trace, rho, s, other)][key] for s in seeds
                    ]

                jd, js, jf = ratio("drain", "mean_jct_s"), ratio("static", "mean_jct_s"), ratio("fluid", "mean_jct_s")
                mf = ratio("fluid", "makespan_s")
                print(
                    f"   {rho:>4} | {variant:8} | {_fmt_ratio(jd):>20} {_fmt_ratio(js):>20} {_fmt_ratio(jf):>20}"
                    f" {_fmt_ratio(mf):>20}"
                )
                if variant != "flex":
                    continue
                gs = short == "gpushare40"
                goals.append(_goal(f"{short} {rho}: flex JCT <= drain", max(jd), 1.0))
                if gs and rho >= 0.9:
                    goals.append(_goal(f"{short} {rho}: flex JCT <= 0.95 x drain", max(jd), 0.95))
                if rho >= 0.9:
                    goals.append(
                        _goal(
                            f"{short} {rho}: flex JCT <= {0.83 if gs else 0.90} x static", max(js), 0.83 if gs else 0.90
                        )
                    )
                goals.append(_goal(f"{short} {rho}: flex makespan <= 1.05 x fluid", max(mf), 1.05))
                goals.append(_goal(f"{short} {rho}: flex JCT <= 1.10 x fluid", max(jf), 1.10))
        extra = [results[(trace, r, s, "flex")] for r in loads for s in seeds]
        print(
            "   flex moves per replay (median): migrations "
            f"{statistics.median(e['migrations'] for e in extra)}, "
            f"re-splits {statistics.median(e['resplits'] for e in extra)}, "
            f"spread starts {statistics.median(e['spread_starts'] for e in extra)}"
        )
    print("\n== goals (worst seed)")
    for line in goals:
        print("   " + line)


def _goal(name: str, worst: float, limit: float) -> str:
    verdict = "met   " if worst <= limit else "MISSED"
    return f"{verdict} {name}: worst {worst:.3f} (limit {limit:.2f})"


if __name__ == "__main__":
    sys.exit(main())
