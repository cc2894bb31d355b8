"""Malleable jobs must never hurt: flex with malleable jobs against flex without, on traces the rule was not tuned on.

The traces are the sets fixed in ``bench/malleable_sets.toml`` (committed before the rule was tuned): synthetic pod
lists drawn from the Alibaba trace's statistics (:mod:`flexmig.replay.synth`: shapes of one pod list, observed run
times, four arrival processes) at several loads and seeds, plus, in the evaluation set, the held-out trace of issue
23. Each trace is replayed on h200x8 under EASY with replay's costs, by flex and by flex with ``--malleable``, in one
process pool; a cell is (scenario, load), its figure the geometric mean over its seeds of the per-seed ratio
(``+m`` / flex) of mean JCT and of p95 bounded slowdown.

Goals (issue 23), on the evaluation set: ``+m`` at most 1.0x flex in both figures in every cell, and at most 0.6x
in mean JCT in at least half the cells at load 0.7-0.9. The report gives every cell, the worst cell of each figure,
the worst single seed, and how many cells meet each goal.

Run: ``.venv/bin/python bench/malleable.py [--set tuning|evaluation] [--quick] [--processes N] [--json FILE]
[--markdown FILE]``. ``--quick``: the first seed of each cell, loads 0.7 and 0.9 only. The machine and the load
average are printed first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flexmig.mig.nodespec import parse_node_spec
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.load import cap_runtime
from flexmig.replay.run import Prepared, ReplayConfig, prepare, run_policy
from flexmig.replay.synth import load_pools, scenario, synthesize
from flexmig.replay.trace import map_trace
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "bench" / "traces" / "alibaba-gpu-v2023"
SETS = ROOT / "bench" / "malleable_sets.toml"
HELDOUT = "heldout"
sys.path.insert(0, str(ROOT / "tests"))
from support.heldout import heldout_trace  # noqa: E402

Task = tuple[str, float, int, bool]  # scenario, load, seed, malleable


def load_set(name: str) -> dict[str, Any]:
    """The named set of ``bench/malleable_sets.toml`` with the file's common keys."""
    doc = tomllib.loads(SETS.read_text())
    out = dict(doc[name])
    for key in ("node", "jobs", "discipline"):
        out[key] = doc[key]
    return out


_PREPARED: dict[tuple[str, float, int], Prepared] = {}


def prepared(spec: dict[str, Any], name: str, load: float, seed: int) -> Prepared:
    """The jobs of one trace of the set (memoised per worker process)."""
    key = (name, load, seed)
    got = _PREPARED.get(key)
    if got is not None:
        return got
    node = parse_node_spec(spec["node"])
    if name == HELDOUT:
        with tempfile.TemporaryDirectory() as tmp:
            path = heldout_trace(Path(tmp) / "heldout.csv")
            got = prepare(ReplayConfig(path, node=spec["node"], load=load, seed=seed))
    else:
        pools = _pools(node.model)
        rows = synthesize(
            pools, scenario(name), model=node.model, gpus=node.count, load=load, seed=seed, jobs=spec["jobs"]
        )
        jobs = tuple(cap_runtime(map_trace(rows, node.model).jobs, 86400.0))
        got = Prepared(node, jobs, {"scenario": name, "load": load, "seed": seed, "jobs": len(jobs)})
    _PREPARED[key] = got
    return got


_POOLS: dict[str, Any] = {}


def _pools(model: Any) -> Any:
    got = _POOLS.get(model.key)
    if got is None:
        got = _POOLS[model.key] = load_pools(TRACES, model)
    return got


def run(spec: dict[str, Any], task: Task) -> tuple[Task, dict[str, Any], float]:
    """Replay one trace of the set under flex, with or without malleable jobs; its figures and CPU seconds."""
    name, load, seed, malleable = task
    prep = prepared(spec, name, load, seed)
    settings = replace(REPLAY_SETTINGS, discipline=spec["discipline"])
    t0 = time.process_time()
    fig = run_policy(prep, "flex", settings, malleable=malleable).to_json()
    return task, fig, time.process_time() - t0


@dataclass(frozen=True)
class CellResult:
    """One cell: per-seed ratios (+m / flex) of mean JCT and p95 bounded slowdown, and their geometric means."""

    scenario: str
    load: float
    jct: tuple[float, ...]
    bsld: tuple[float, ...]
    jct_h: tuple[float, ...]  # flex's mean JCT, hours, per seed (for context)

    @property
    def jct_gm(self) -> float:
        return geomean(self.jct)

    @property
    def bsld_gm(self) -> float:
        return geomean(self.bsld)


def geomean(xs: tuple[float, ...]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def cells_of(spec: dict[str, Any], results: dict[Task, dict[str, Any]]) -> list[CellResult]:
    """Every (scenario, load) cell of the results."""
    out = []
    for name in spec["scenarios"] + ([HELDOUT] if spec.get("heldout") else []):
        for load in spec["loads"]:
            pairs = [
                (results[(name, load, s, False)], results[(name, load, s, True)])
                for s in spec["seeds"]
                if (name, load, s, False) in results and (name, load, s, True) in results
            ]
            if not pairs:
                continue
            out.append(
                CellResult(
                    name,
                    load,
                    tuple(m["mean_jct_s"] / f["mean_jct_s"] for f, m in pairs),
                    tuple(m["p95_bounded_slowdown"] / f["p95_bounded_slowdown"] for f, m in pairs),
                    tuple(f["mean_jct_s"] / 3600 for f, _ in pairs),
                )
            )
    return out


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Replay the set and print the report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=("tuning", "evaluation"), default="evaluation")
    parser.add_argument("--quick", action="store_true", help="first seed, loads 0.7 and 0.9")
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--scenarios", help="comma-separated subset of the set's scenarios")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--markdown", type=Path, help="also write the section of docs/results.md to this file")
    args = parser.parse_args(argv)
    spec = load_set(args.set)
    if args.quick:
        spec["seeds"] = spec["seeds"][:1]
        spec["loads"] = [x for x in spec["loads"] if x in (0.7, 0.9)]
    if args.scenarios:
        wanted = args.scenarios.split(",")
        spec["heldout"] = spec.get("heldout", False) and HELDOUT in wanted
        spec["scenarios"] = [s for s in spec["scenarios"] if s in wanted]
    names = spec["scenarios"] + ([HELDOUT] if spec.get("heldout") else [])
    loads, seeds = spec["loads"], spec["seeds"]
    tasks: list[Task] = [(n, x, s, m) for n in names for x in loads for s in seeds for m in (False, True)]
    started = datetime.now(UTC)
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    print(
        f"set {args.set}: {len(names)} trace families x loads {spec['loads']} x seeds {spec['seeds']},"
        f" {spec['jobs']} jobs each, {spec['node']}, {spec['discipline']}; {len(tasks)} replays on"
        f" {args.processes} process(es)",
        flush=True,
    )
    results: dict[Task, dict[str, Any]] = {}
    cpu = 0.0
    t0 = time.perf_counter()
    if args.processes > 1:
        with ProcessPoolExecutor(max_workers=args.processes) as pool:
            futures = [pool.submit(run, spec, t) for t in tasks]
            for n, fut in enumerate(as_completed(futures), 1):
                task, fig, secs = fut.result()
                results[task] = fig
                cpu += secs
                _tick(n, len(tasks), task, fig)
    else:
        for n, t in enumerate(tasks, 1):
            task, fig, secs = run(spec, t)
            results[task] = fig
            cpu += secs
            _tick(n, len(tasks), task, fig)
    wall = time.perf_counter() - t0
    cells = cells_of(spec, results)
    summary = report(cells)
    print(f"\n{len(tasks)} replays: {cpu:.0f} s CPU, {wall:.0f} s wall; load average after: {load_average()}")
    if args.json:
        rows = [
            {"scenario": n, "load": x, "seed": s, "malleable": m, **fig}
            for (n, x, s, m), fig in sorted(results.items())
        ]
        args.json.write_text(json.dumps({"machine": machine(), "set": args.set, "results": rows}, indent=1))
    if args.markdown:
        cmd = "bench/malleable.py" + (f" --set {args.set}" if args.set != "evaluation" else "")
        cmd += " --quick" if args.quick else ""
        args.markdown.write_text(markdown(cells, summary, spec, cmd, started))
    return 0


def _tick(n: int, total: int, task: Task, fig: dict[str, Any]) -> None:
    name, load, seed, m = task
    print(
        f"[{n}/{total}] {name} {load} seed {seed}{' +m' if m else ''}: mean JCT {fig['mean_jct_s'] / 3600:.2f} h,"
        f" p95 BSLD {fig['p95_bounded_slowdown']:.1f}, narrow {fig['narrow_starts']}, re-splits {fig['resplits']}",
        file=sys.stderr,
        flush=True,
    )


def report(cells: list[CellResult]) -> dict[str, Any]:
    """Print every cell and the goals; return the summary."""
    print(f"\n   {'cell':24} {'flex JCT h':>10} {'JCT +m/flex':>12} {'(seeds)':>20}", end="")
    print(f" {'BSLD +m/flex':>13} {'(seeds)':>20}")
    for c in cells:
        print(
            f"   {c.scenario + ' ' + str(c.load):24} {geomean(c.jct_h):10.2f} {c.jct_gm:12.3f}"
            f" {' '.join(f'{x:.2f}' for x in c.jct):>20} {c.bsld_gm:13.3f} {' '.join(f'{x:.2f}' for x in c.bsld):>20}"
        )
    worst_jct = max(cells, key=lambda c: c.jct_gm)
    worst_bsld = max(cells, key=lambda c: c.bsld_gm)
    seed_jct = max(x for c in cells for x in c.jct)
    seed_bsld = max(x for c in cells for x in c.bsld)
    never = sum(1 for c in cells if c.jct_gm <= 1.0 and c.bsld_gm <= 1.0)
    mid = [c for c in cells if 0.7 <= c.load <= 0.9]
    big = sum(1 for c in mid if c.jct_gm <= 0.6)
    summary = {
        "cells": len(cells),
        "worst_jct": (worst_jct.scenario, worst_jct.load, worst_jct.jct_gm),
        "worst_bsld": (worst_bsld.scenario, worst_bsld.load, worst_bsld.bsld_gm),
        "worst_seed_jct": seed_jct,
        "worst_seed_bsld": seed_bsld,
        "never_worse": never,
        "mid_cells": len(mid),
        "mid_at_most_0_6": big,
    }
    ok1 = never == len(cells)
    ok2 = big * 2 >= len(mid)
    print(
        f"\n   worst cell, mean JCT: {worst_jct.scenario} {worst_jct.load}: {worst_jct.jct_gm:.3f}"
        f" (worst single seed {seed_jct:.3f})"
    )
    print(
        f"   worst cell, p95 bounded slowdown: {worst_bsld.scenario} {worst_bsld.load}: {worst_bsld.bsld_gm:.3f}"
        f" (worst single seed {seed_bsld:.3f})"
    )
    print(f"   {'met   ' if ok1 else 'MISSED'} +m <= 1.0x flex in both figures: {never} of {len(cells)} cells")
    print(f"   {'met   ' if ok2 else 'MISSED'} +m <= 0.6x flex in mean JCT at load 0.7-0.9: {big} of {len(mid)} cells")
    summary["met_never_worse"] = ok1
    summary["met_half_0_6"] = ok2
    return summary


def markdown(cells: list[CellResult], s: dict[str, Any], spec: dict[str, Any], cmd: str, started: datetime) -> str:
    """The "Malleable jobs" section of docs/results.md."""
    loads = sorted({c.load for c in cells})
    names = list(dict.fromkeys(c.scenario for c in cells))
    at = {(c.scenario, c.load): c for c in cells}
    out = [
        "## Malleable jobs on traces they were not tuned on",
        "",
        f"`.venv/bin/python {cmd}` ({started:%Y-%m-%d %H:%M} UTC; {machine()}; load average {load_average()} at "
        f"the end). Traces of the evaluation set fixed in `bench/malleable_sets.toml` before the rule was tuned "
        f"(synthetic, {spec['jobs']} jobs each, drawn from the Alibaba trace's statistics; and the held-out trace "
        f"of issue 23), seeds {spec['seeds']}, {spec['node']}, EASY, replay's costs. Per cell: flex +m / flex, "
        "geometric mean over the seeds, mean JCT / p95 bounded slowdown:",
        "",
        "| trace | " + " | ".join(f"load {x}" for x in loads) + " |",
        "|---|" + "---|" * len(loads),
    ]
    for n in names:
        row = [f"{at[(n, x)].jct_gm:.2f} / {at[(n, x)].bsld_gm:.2f}" if (n, x) in at else "" for x in loads]
        out.append(f"| {n} | " + " | ".join(row) + " |")
    wj, wb = s["worst_jct"], s["worst_bsld"]
    out += [
        "",
        f"- worst cell, mean JCT: {wj[0]} at {wj[1]}: **{wj[2]:.2f}** (worst single seed {s['worst_seed_jct']:.2f});"
        f" p95 bounded slowdown: {wb[0]} at {wb[1]}: **{wb[2]:.2f}** (worst single seed {s['worst_seed_bsld']:.2f})",
        f"- +m at most 1.0x flex in both figures: {s['never_worse']} of {s['cells']} cells"
        f" ({'met' if s['met_never_worse'] else 'missed'})",
        f"- +m at most 0.6x flex in mean JCT at load 0.7-0.9: {s['mid_at_most_0_6']} of {s['mid_cells']} cells"
        f" (goal: half; {'met' if s['met_half_0_6'] else 'missed'})",
        "",
        "<!-- glance -->",
        f"| malleable jobs: flex +m / flex, worst cell of {s['cells']} (`bench/malleable.py`, held-out traces) "
        f"| mean JCT {wj[2]:.2f}x, p95 bounded slowdown {wb[2]:.2f}x; <= 0.6x in {s['mid_at_most_0_6']} of "
        f"{s['mid_cells']} cells at load 0.7-0.9 | <= 1.0x every cell; <= 0.6x in half |",
        "<!-- /glance -->",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
