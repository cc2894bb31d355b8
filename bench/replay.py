"""Trace replay: every policy side by side on a simulated 8 x H200 node, under both queue disciplines, with and
without malleable jobs.

For each trace (by default the two vendored Alibaba pod lists, ``openb_pod_list_default.csv`` and
``openb_pod_list_gpushare40.csv``; ``--trace FILE`` takes any pod list of that format instead), each load RHO (0.7,
0.9, 1.1) and each seed (0, 1, 2), the same thinned job set is replayed under:

* ``bound`` (lower bounds), ``fluid`` (one pool of compute slices) and ``repack`` (whole instances re-packed for
  free at every event), under EASY and greedy;
* ``static`` (best eligible candidate layout), ``drain-first-fit`` (drain as flexmig first had it), ``drain`` (the
  strong drain) and ``flex``, under EASY and greedy, each without and with ``--malleable``;
* ``flex-repartition`` (flex with spreading and migration off: only its repartitioning of busy GPUs), under EASY,
  to show what each of flex's mechanisms adds.

Replay's own action costs apply (``flexmig.replay.costs.REPLAY_SETTINGS``: checkpoint 20 s, restart 30 s,
create/destroy 2 s, settling 600 s, gain margin 1). The report gives, per trace and load, the median over seeds of
mean JCT, the ratios against the strong drain (same discipline; ``+m``: malleable, against drain without), the worst
waits (all jobs, multi-GPU jobs) and the worst JCT, and checks the goals of issue 10 cell by cell:

1. flex / strong drain mean JCT, EASY: <= 0.80;
2. flex / repack mean JCT, EASY: <= 1.0;
3. flex malleable / flex, EASY: <= 0.6;
4. flex malleable / flex worst wait of multi-GPU jobs, EASY: <= 1.0;
5. flex malleable EASY / flex greedy mean JCT: <= 1.5.

Every replay's figures are printed per trace, load and seed too (mean JCT, its ratio to the strong drain, the worst
wait of all and of multi-GPU jobs). A line on stderr marks each finished replay.

Run: ``.venv/bin/python bench/replay.py [--quick] [--processes N] [--json FILE] [--markdown FILE]``. ``--quick``:
gpushare40 at 0.9, seed 0, the policies the goals name (a few minutes). ``--from-json FILE`` prints the report
(and writes ``--markdown``) from a file an earlier run wrote with ``--json``, without replaying. The machine is
printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flexmig.errors import TraceError
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.run import Prepared, ReplayConfig, prepare, run_policy
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
TRACE_DIR = ROOT / "bench" / "traces" / "alibaba-gpu-v2023"
TRACES = (TRACE_DIR / "openb_pod_list_default.csv", TRACE_DIR / "openb_pod_list_gpushare40.csv")
LOADS = (0.7, 0.9, 1.1)
SEEDS = (0, 1, 2)
MIG = ("static", "drain-first-fit", "drain", "flex")
REFERENCES = ("bound", "fluid", "repack")
Variant = tuple[str, str, bool]  # policy, discipline, malleable

_CACHE: dict[tuple[str, float, int], Prepared] = {}


def variants(quick: bool) -> list[Variant]:
    """Every (policy, discipline, malleable) to replay."""
    if quick:
        out: list[Variant] = [("repack", "easy", False), ("fluid", "easy", False)]
        out += [(p, d, False) for p in ("drain", "flex") for d in ("easy", "greedy")]
        return [*out, ("drain", "easy", True), ("flex", "easy", True), ("flex", "greedy", True)]
    out = [("bound", "easy", False)]
    out += [(p, d, False) for p in ("fluid", "repack") for d in ("easy", "greedy")]
    out += [(p, d, m) for p in MIG for d in ("easy", "greedy") for m in (False, True)]
    return [*out, ("flex-repartition", "easy", False)]


def name_of(v: Variant) -> str:
    """``flex greedy +m``."""
    policy, discipline, malleable = v
    return f"{policy} {discipline}{' +m' if malleable else ''}"


def _task(args: tuple[str, float, int, Variant]) -> tuple[str, float, int, Variant, dict[str, Any], float]:
    trace, rho, seed, v = args
    key = (trace, rho, seed)
    prep = _CACHE.get(key)
    if prep is None:
        prep = prepare(ReplayConfig(Path(trace), node="h200x8", load=rho, seed=seed))
        _CACHE[key] = prep
    policy, discipline, malleable = v
    settings = replace(REPLAY_SETTINGS, discipline=discipline)
    if policy == "flex-repartition":
        policy, settings = "flex", replace(settings, resplit=False, migrate=False)
    t0 = time.perf_counter()
    result = run_policy(prep, policy, settings, malleable=malleable)
    return trace, rho, seed, v, result.to_json(), time.perf_counter() - t0


Results = dict[tuple[str, float, int, Variant], dict[str, Any]]


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trace", type=Path, action="append", help="a pod-list CSV (repeatable; default: both vendored)"
    )
    parser.add_argument("--processes", type=int, default=min(4, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--loads", help="comma-separated RHO values (default 0.7,0.9,1.1)")
    parser.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--quick", action="store_true", help="gpushare40, RHO 0.9, seed 0, the goals' policies only")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--markdown", type=Path, help="also write the results tables (Markdown) to this file")
    parser.add_argument("--from-json", type=Path, help="report on the figures of an earlier --json run; no replays")
    args = parser.parse_args(argv)
    if args.from_json:
        return from_json(args.from_json, args.markdown)
    traces = [str(t) for t in (args.trace or ([TRACES[1]] if args.quick else TRACES))]
    for t in traces:
        if not Path(t).is_file():
            print(f"replay bench: trace {t} not found", file=sys.stderr)
            return 2
    loads = [float(x) for x in args.loads.split(",")] if args.loads else ([0.9] if args.quick else list(LOADS))
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else ([0] if args.quick else list(SEEDS))
    for t in traces:  # refuse a trace or load the replays would refuse, before starting any of them
        try:
            prepare(ReplayConfig(Path(t), node="h200x8", load=max(loads), seed=seeds[0]))
        except TraceError as exc:
            print(f"replay bench: {exc}", file=sys.stderr)
            return 2
    todo = variants(args.quick)
    tasks = [(t, r, s, v) for t in traces for r in loads for s in seeds for v in todo]
    # Long replays first, so the pool does not end on one straggler.
    tasks.sort(key=lambda a: (a[3][0] not in (*MIG, "flex-repartition"), a[3][1] != "easy", -a[1]))
    started = datetime.now(UTC)
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    print(f"node h200x8, {len(tasks)} replays on {args.processes} process(es); replay costs: {REPLAY_SETTINGS}")
    start = time.perf_counter()
    results: Results = {}
    seconds: dict[str, list[float]] = {}

    def done(trace: str, rho: float, seed: int, v: Variant, fig: dict[str, Any], secs: float) -> None:
        results[(trace, rho, seed, v)] = fig
        seconds.setdefault(name_of(v), []).append(secs)
        print(
            f"[{len(results)}/{len(tasks)}] {short(trace)} {rho} seed {seed} {name_of(v)}: {secs:.0f}s,"
            f" mean JCT {fig['mean_jct_s'] / 3600:.1f} h ({time.perf_counter() - start:.0f}s elapsed)",
            file=sys.stderr,
            flush=True,
        )

    if args.processes > 1:
        with ProcessPoolExecutor(max_workers=args.processes) as pool:
            for future in as_completed([pool.submit(_task, task) for task in tasks]):
                done(*future.result())
    else:
        for task in tasks:
            done(*_task(task))
    wall = time.perf_counter() - start
    goals = report(results, traces, loads, seeds, todo)
    print(
        "\nreplay time per variant (s, median [max]): "
        + ", ".join(f"{p} {statistics.median(v):.1f} [{max(v):.1f}]" for p, v in sorted(seconds.items()))
    )
    print(f"total wall time {wall:.0f}s; load average after: {load_average()}")
    if args.json:
        rows = [
            {**fig, "trace": Path(t).name, "load": r, "seed": s, "variant": name_of(v)}
            for (t, r, s, v), fig in sorted(
                results.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], name_of(kv[0][3]))
            )
        ]
        args.json.write_text(
            json.dumps({"machine": machine(), "wall_s": round(wall), "goals": goals, "results": rows}, indent=1)
        )
    if args.markdown:
        args.markdown.write_text(
            markdown(results, traces, loads, seeds, todo, goals, started=started, command=command(args))
        )
    return 0


def from_json(path: Path, markdown_to: Path | None) -> int:
    """Print the report (and write the Markdown tables) from a ``--json`` file of an earlier run."""
    try:
        doc = json.loads(path.read_text())
        rows = doc["results"]
        results: Results = {}
        for row in rows:
            policy, discipline, *rest = row["variant"].split()
            results[(row["trace"], float(row["load"]), int(row["seed"]), (policy, discipline, rest == ["+m"]))] = row
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"replay bench: {path}: not a --json file of this bench ({exc})", file=sys.stderr)
        return 2
    order = {v: i for i, v in enumerate(variants(False) + variants(True))}
    todo = sorted({k[3] for k in results}, key=lambda v: order.get(v, len(order)))
    traces = sorted({k[0] for k in results}, key=lambda t: [Path(x).name for x in TRACES].index(t)
                    if t in [Path(x).name for x in TRACES] else len(TRACES))  # fmt: skip
    loads = sorted({k[1] for k in results})
    seeds = sorted({k[2] for k in results})
    print(f"machine: {doc.get('machine')} (figures from {path}, wall time then {doc.get('wall_s')}s)")
    goals = report(results, traces, loads, seeds, todo)
    if markdown_to:
        markdown_to.write_text(markdown(results, traces, loads, seeds, todo, goals, started=datetime.now(UTC)))
    return 0


def command(args: argparse.Namespace) -> str:
    """The command line that chose what was replayed (traces, loads, seeds, --quick), for the results section."""
    out = ["bench/replay.py"]
    if args.quick:
        out.append("--quick")
    for t in args.trace or ():
        out += ["--trace", str(t)]
    if args.loads:
        out += ["--loads", args.loads]
    if args.seeds:
        out += ["--seeds", args.seeds]
    return " ".join(out)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (``uptime``'s)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def short(trace: str) -> str:
    """``gpushare40`` for openb_pod_list_gpushare40.csv."""
    return Path(trace).name.removeprefix("openb_pod_list_").removesuffix(".csv")


def med(results: Results, trace: str, rho: float, seeds: list[int], v: Variant, key: str) -> float:
    """Median over seeds of a figure."""
    return statistics.median(results[(trace, rho, s, v)][key] for s in seeds)


def multi_wait(fig: dict[str, Any]) -> float:
    """Worst wait of multi-GPU jobs (0 when there were none)."""
    got = fig.get("by_size", {}).get("multi")
    return float(got["max_wait_s"]) if got else 0.0


def ratio(results: Results, trace: str, rho: float, seeds: list[int], a: Variant, b: Variant, key: str) -> list[float]:
    """Per seed, ``a``'s figure over ``b``'s (``multi_wait``: the multi-GPU jobs' worst wait)."""
    out = []
    for s in seeds:
        fa, fb = results[(trace, rho, s, a)], results[(trace, rho, s, b)]
        va, vb = (multi_wait(fa), multi_wait(fb)) if key == "multi_wait" else (fa[key], fb[key])
        out.append(va / vb if vb else 1.0)
    return out


GOALS: tuple[tuple[str, Variant, Variant, str, float], ...] = (
    ("flex / strong drain, mean JCT, EASY", ("flex", "easy", False), ("drain", "easy", False), "mean_jct_s", 0.80),
    ("flex / repack, mean JCT, EASY", ("flex", "easy", False), ("repack", "easy", False), "mean_jct_s", 1.0),
    ("flex malleable / flex, mean JCT, EASY", ("flex", "easy", True), ("flex", "easy", False), "mean_jct_s", 0.6),
    (
        "flex malleable / flex, worst multi-GPU wait, EASY",
        ("flex", "easy", True),
        ("flex", "easy", False),
        "multi_wait",
        1.0,
    ),
    (
        "flex malleable EASY / flex greedy, mean JCT",
        ("flex", "easy", True),
        ("flex", "greedy", False),
        "mean_jct_s",
        1.5,
    ),
)


CONTEXT: tuple[tuple[str, Variant, Variant, str], ...] = (
    (
        "fluid / strong drain, mean JCT, EASY (no placement rule at all)",
        ("fluid", "easy", False),
        ("drain", "easy", False),
        "mean_jct_s",
    ),
    ("repack / strong drain, mean JCT, EASY", ("repack", "easy", False), ("drain", "easy", False), "mean_jct_s"),
    (
        "flex-repartition / strong drain, mean JCT, EASY",
        ("flex-repartition", "easy", False),
        ("drain", "easy", False),
        "mean_jct_s",
    ),
    (
        "flex greedy / strong drain greedy, mean JCT",
        ("flex", "greedy", False),
        ("drain", "greedy", False),
        "mean_jct_s",
    ),
    ("flex greedy / flex EASY, worst multi-GPU wait", ("flex", "greedy", False), ("flex", "easy", False), "multi_wait"),
)
"""Ratios printed beside the goals, to explain them (no limit)."""


def report(
    results: Results, traces: list[str], loads: list[float], seeds: list[int], todo: list[Variant]
) -> list[dict[str, Any]]:
    """Print the per-trace tables and the goal checks; returns the goals, cell by cell."""
    for trace in traces:
        first = results[(trace, loads[0], seeds[0], todo[0])]
        print(f"\n== {short(trace)}: {first['rows_mapped']} GPU jobs mapped, skipped {first['rows_skipped']}")
        statics = [v for v in todo if v[0] == "static"]
        if statics:
            chosen = sorted({results[(trace, r, s, v)]["static_layout"] for r in loads for s in seeds for v in statics})
            print(f"   static layout chosen: {chosen}")
        for rho in loads:
            jobs = statistics.median(results[(trace, rho, s, todo[0])]["jobs"] for s in seeds)
            print(f"\n   RHO {rho}, {jobs:.0f} jobs; medians over seeds {seeds}")
            print(
                f"   {'variant':22} {'JCT (h)':>8} {'/drain':>7} {'max JCT (d)':>11} {'max wait (d)':>12}"
                f" {'multi wait (d)':>14} {'p95 BSLD':>9} {'mksp (d)':>8} {'moves':>6} {'narrow':>6}"
            )
            for v in todo:
                base = ("drain", v[1] if v[0] != "bound" else "easy", False)
                rel = statistics.median(ratio(results, trace, rho, seeds, v, base, "mean_jct_s")) if base in todo else 0
                figs = [results[(trace, rho, s, v)] for s in seeds]
                print(
                    f"   {name_of(v):22} {med(results, trace, rho, seeds, v, 'mean_jct_s') / 3600:8.1f} {rel:7.3f}"
                    f" {med(results, trace, rho, seeds, v, 'max_jct_s') / 86400:11.2f}"
                    f" {med(results, trace, rho, seeds, v, 'max_wait_s') / 86400:12.2f}"
                    f" {statistics.median(multi_wait(f) for f in figs) / 86400:14.2f}"
                    f" {med(results, trace, rho, seeds, v, 'p95_bounded_slowdown'):9.0f}"
                    f" {med(results, trace, rho, seeds, v, 'makespan_s') / 86400:8.2f}"
                    f" {statistics.median(f['migrations'] + f['resplits'] for f in figs):6.0f}"
                    f" {statistics.median(f['narrow_starts'] for f in figs):6.0f}"
                )
    per_seed(results, traces, loads, seeds, todo)
    goals: list[dict[str, Any]] = []
    print("\n== goals (median over seeds per trace and load; met only if met in every cell)")
    for label, a, b, key, limit in GOALS:
        if a not in todo or b not in todo:
            continue
        cells = []
        for trace in traces:
            for rho in loads:
                values = ratio(results, trace, rho, seeds, a, b, key)
                cells.append({"trace": short(trace), "load": rho, "median": statistics.median(values),
                              "min": min(values), "max": max(values)})  # fmt: skip
        worst = max(c["median"] for c in cells)
        met = worst <= limit
        goals.append({"goal": label, "limit": limit, "met": met, "worst_cell": worst, "cells": cells})
        text = ", ".join(f"{c['trace']} {c['load']}: {c['median']:.2f}" for c in cells)
        print(f"   {'met   ' if met else 'MISSED'} {label} <= {limit}: {text}")
    print("\n== for context (median over seeds per trace and load)")
    for label, a, b, key in CONTEXT:
        if a in todo and b in todo:
            cells = [
                (short(t), r, statistics.median(ratio(results, t, r, seeds, a, b, key))) for t in traces for r in loads
            ]
            goals.append({"context": label, "cells": [{"trace": t, "load": r, "median": m} for t, r, m in cells]})
            print(f"   {label}: " + ", ".join(f"{t} {r}: {m:.2f}" for t, r, m in cells))
    return goals


def per_seed(results: Results, traces: list[str], loads: list[float], seeds: list[int], todo: list[Variant]) -> None:
    """Every replay: mean JCT (h), its ratio to the strong drain of the same discipline, the worst wait of all jobs
    and of multi-GPU jobs (d), per trace, load and seed."""
    print("\n== every replay: mean JCT h (/ strong drain, same discipline), worst wait d, worst multi-GPU wait d")
    for trace in traces:
        for rho in loads:
            print(f"\n   {short(trace)} RHO {rho}: " + " | ".join(f"seed {s}" for s in seeds))
            for v in todo:
                base = ("drain", v[1] if v[0] != "bound" else "easy", False)
                cells = []
                for s in seeds:
                    fig = results[(trace, rho, s, v)]
                    rel = ""
                    if base in todo and v != base:
                        rel = f" ({fig['mean_jct_s'] / results[(trace, rho, s, base)]['mean_jct_s']:.2f})"
                    jct, wait, multi = fig["mean_jct_s"] / 3600, fig["max_wait_s"] / 86400, multi_wait(fig) / 86400
                    cells.append(f"{jct:6.1f}{rel:7} {wait:5.2f} {multi:5.2f}")
                print(f"   {name_of(v):22} " + " | ".join(cells))


def markdown(
    results: Results,
    traces: list[str],
    loads: list[float],
    seeds: list[int],
    todo: list[Variant],
    goals: list[dict[str, Any]],
    *,
    started: datetime,
    command: str = "bench/replay.py",
) -> str:
    """The "Replay" section of docs/results.md: mean JCT (h) and worst waits per variant and cell, and the goals."""
    cells = [(t, r) for t in traces for r in loads]
    head = "| variant | " + " | ".join(f"{short(t)} {r}" for t, r in cells) + " |"
    rule = "|---|" + "---|" * len(cells)
    names = ", ".join(f"`{Path(t).name}`" for t in traces)
    lines = [
        "## Replay",
        "",
        f"`.venv/bin/python {command}` ({started:%Y-%m-%d %H:%M} UTC; {machine()}; "
        f"load average {load_average()} at the end) replays, per trace, load and seed, the same thinned job set "
        "under every policy and both queue disciplines, with and without malleable jobs (`+m`), on h200x8: traces "
        f"{names} (Alibaba `cluster-trace-gpu-v2023`, vendored under `bench/traces/`, CC BY 4.0); RHO "
        f"{', '.join(str(x) for x in loads)}; seeds {', '.join(str(x) for x in seeds)}. The policies are those of "
        "[The policies](replay.md#the-policies); the strong drain is the rival every ratio is taken against. The "
        "planner runs with replay's own costs (`flexmig.replay.costs.REPLAY_SETTINGS`: checkpoint 20 s, restart "
        "30 s, instance create/destroy 2 s, settling 600 s, gain margin 1), the estimates for large training jobs "
        "([Settings and costs](replay.md#settings-and-costs)). The per-seed figures are in the bench's text output.",
        "",
        "Median mean JCT in hours (in brackets: the ratio to the strong drain under the same discipline):",
        "",
        head,
        rule,
    ]
    for v in todo:
        row = []
        for t, r in cells:
            jct = med(results, t, r, seeds, v, "mean_jct_s") / 3600
            base = ("drain", v[1] if v[0] != "bound" else "easy", False)
            rel = statistics.median(ratio(results, t, r, seeds, v, base, "mean_jct_s")) if base in todo else None
            row.append(f"{jct:.1f}" + (f" ({rel:.2f})" if rel is not None and v != base else ""))
        lines.append(f"| {name_of(v)} | " + " | ".join(row) + " |")
    lines += ["", "Median worst wait, all jobs / multi-GPU jobs, in days:", "", head, rule]
    for v in todo:
        if v[0] == "bound":
            continue
        row = []
        for t, r in cells:
            figs = [results[(t, r, s, v)] for s in seeds]
            row.append(
                f"{statistics.median(f['max_wait_s'] for f in figs) / 86400:.1f} / "
                f"{statistics.median(multi_wait(f) for f in figs) / 86400:.1f}"
            )
        lines.append(f"| {name_of(v)} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Goals (median over seeds per cell):",
        "",
        "| goal | limit | worst cell | met | per cell |",
        "|---|---|---|---|---|",
    ]
    for g in goals:
        per = ", ".join(f"{c['trace']} {c['load']}: {c['median']:.2f}" for c in g["cells"])
        if "goal" in g:
            met = "yes" if g["met"] else "no"
            lines.append(f"| {g['goal']} | {g['limit']} | {g['worst_cell']:.2f} | {met} | {per} |")
    context = [g for g in goals if "context" in g]
    if context:
        lines += ["", "For context (median over seeds per cell):", "", "| ratio | per cell |", "|---|---|"]
        lines += [
            f"| {g['context']} | "
            + ", ".join(f"{c['trace']} {c['load']}: {c['median']:.2f}" for c in g["cells"])
            + " |"
            for g in context
        ]
    glance = {g["goal"]: g for g in goals if "goal" in g}
    lines += ["", "<!-- glance -->"]
    for label, what in (
        ("flex / strong drain, mean JCT, EASY", "flex vs the strong drain, mean JCT, EASY (`bench/replay.py`)"),
        ("flex / repack, mean JCT, EASY", "flex vs ideal free repacking of whole instances, EASY"),
        ("flex malleable / flex, mean JCT, EASY", "malleable jobs on the vendored traces: flex +m vs flex, EASY"),
    ):
        g = glance.get(label)
        if g is not None:
            lo = min(c["median"] for c in g["cells"])
            lines.append(f"| {what} | {lo:.2f}-{g['worst_cell']:.2f}x (medians per cell) | <= {g['limit']}x |")
    lines.append("<!-- /glance -->")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
