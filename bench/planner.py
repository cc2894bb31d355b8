"""Planning time: flexmig's planner against the drain baseline's, on the same node states, in one process, as the
node and its queue grow.

The sweep: GPUs (8, 16, 32, 64, 128) x pending requests (50, 200, 1,000) x malleable (off, on). Each node runs
6.25 one-slice jobs per GPU (50 on 8 GPUs, 400 on 64) placed by the planner itself, so they sit where flexmig would
have put them, and its queue is the next rows of the trace as mapped (mostly 7g, some 3g and smaller): the head is
blocked, so every plan does the whole pass (admission, the head's reservation, making room, backfilling, growing).
Malleable: the pending requests that the elastic rule marks elastic may start or be reserved narrow.

Each cell times ``--repeat`` plans of one warm planner (its geometry cache kept between plans, as the daemon keeps
it) with ``time.perf_counter`` and prints p50 and p99; the strong drain plans the same state in the same process
(the rival, p50). Then the growth: the exponents ``b`` and ``c`` of ``p99 ~ GPUs^b x pending^c`` fitted by least
squares over the grid (log-log), and the worst slope between neighbouring cells along each axis. Goals (issue 23):
p99 under 25 ms at 64 GPUs and 1,000 pending, malleable or not, and growth at most linear in either dimension
(``b``, ``c`` <= 1). A full replay of the default trace (arrivals as they are, h200x8) under flex and drain closes
the run (goal: <= 60 s).

Planner settings are replay's (``flexmig.replay.costs.REPLAY_SETTINGS``), so the replay case matches
bench/replay.py.

Run: ``.venv/bin/python bench/planner.py [--quick] [--repeat N] [--gpus 8,64] [--pending 50,1000] [--skip-replay]
[--markdown FILE]``. ``--quick``: 8, 32 and 64 GPUs x 50 and 1,000 pending, 20 plans per cell, no replay. The
machine and the load average are printed first; ``--markdown`` writes the section of docs/results.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

from flexmig.mig import H200, Layout
from flexmig.plan import NodeState, Planner, RunningJob, StartJob, validate_plan
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.engine import request_for
from flexmig.replay.managers import LayoutManager
from flexmig.replay.run import ReplayConfig, prepare, run_policy
from flexmig.replay.trace import TraceJob, map_trace, read_trace
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "bench" / "traces" / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
GPUS = (8, 16, 32, 64, 128)
PENDING = (50, 200, 1000)
RUNNING_PER_GPU = 6.25
GOAL_CELL = (64, 1000)
GOAL_P99_S = 0.025
GOAL_REPLAY_S = 60.0


def build_running(jobs: list[TraceJob], gpus: int, running: int) -> tuple[NodeState, int]:
    """``running`` one-slice jobs (the trace's first rows, with a 1g profile) placed one by one by the planner on
    ``gpus`` empty H200s; the state and how many trace rows were used."""
    planner = Planner(H200, REPLAY_SETTINGS)
    one = H200.profile_for_slices(1)
    layouts = tuple(Layout.empty(H200) for _ in range(gpus))
    holds: dict[str, RunningJob] = {}
    used = 0
    for job in jobs:
        if len(holds) >= running:
            break
        used += 1
        req = request_for(replace(job, profile=one, ranks=1, elastic=False))
        state = NodeState(H200, layouts, tuple(holds.values()), (req,), 0.0)
        plan = planner.plan(state)
        out = validate_plan(state, plan)
        if not any(isinstance(a, StartJob) for a in plan.actions):
            break  # the node is full
        layouts = out.layouts
        holds[req.name] = RunningJob(
            req.name, out.holds[req.name], req, last_moved_s=-3600.0, remaining_s=job.runtime_s
        )
    return NodeState(H200, layouts, tuple(holds.values()), (), 0.0), used


def with_queue(base: NodeState, rows: list[TraceJob], pending: int, *, malleable: bool) -> NodeState:
    """``base`` with the next ``pending`` trace rows queued."""
    queue = tuple(request_for(j, malleable=malleable) for j in rows[:pending])
    return replace(base, pending=queue)


def time_plans(plan: Callable[[NodeState], object], state: NodeState, repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (of this thread) per plan over ``repeat`` plans, after one untimed plan that fills the
    caches. On a quiet machine the two agree; on a loaded one the wall time also counts the waits for a core."""
    plan(state)
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        plan(state)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return wall, cpu


def p99(xs: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


@dataclass(frozen=True)
class Cell:
    """One point of the sweep, in seconds: flex's p50 and p99 in CPU time of the planning thread and in wall time,
    the drain's p50 (CPU), and how many actions the plan has."""

    gpus: int
    pending: int
    malleable: bool
    running: int
    p50: float
    p99: float
    wall_p50: float
    wall_p99: float
    drain_p50: float
    actions: int


def fit(cells: list[Cell]) -> tuple[float, float]:
    """Least-squares exponents (b, c) of p99 ~ a * GPUs^b * pending^c."""
    rows = [(math.log(c.gpus), math.log(c.pending), math.log(c.p99)) for c in cells]
    n = len(rows)
    mx = sum(r[0] for r in rows) / n
    my = sum(r[1] for r in rows) / n
    mz = sum(r[2] for r in rows) / n
    sxx = sum((r[0] - mx) ** 2 for r in rows)
    syy = sum((r[1] - my) ** 2 for r in rows)
    sxy = sum((r[0] - mx) * (r[1] - my) for r in rows)
    sxz = sum((r[0] - mx) * (r[2] - mz) for r in rows)
    syz = sum((r[1] - my) * (r[2] - mz) for r in rows)
    det = sxx * syy - sxy * sxy
    if det == 0:
        return (sxz / sxx if sxx else 0.0, syz / syy if syy else 0.0)
    return ((sxz * syy - syz * sxy) / det, (syz * sxx - sxz * sxy) / det)


def worst_slopes(cells: list[Cell]) -> tuple[float, float]:
    """The steepest log-log slope of p99 between neighbouring cells along GPUs and along pending."""
    at = {(c.gpus, c.pending): c.p99 for c in cells}
    gpus = sorted({c.gpus for c in cells})
    pend = sorted({c.pending for c in cells})
    along_g = [math.log(at[(b, p)] / at[(a, p)]) / math.log(b / a) for p in pend for a, b in pairwise(gpus)]
    along_p = [math.log(at[(g, b)] / at[(g, a)]) / math.log(b / a) for g in gpus for a, b in pairwise(pend)]
    return (max(along_g, default=0.0), max(along_p, default=0.0))


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (``uptime``'s), to judge how quiet the machine was."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE, help=f"pod-list CSV (default {TRACE.name}, vendored)")
    parser.add_argument("--repeat", type=int, default=100, help="plans timed per cell (default 100)")
    parser.add_argument("--gpus", help="comma-separated GPU counts (default 8,16,32,64,128)")
    parser.add_argument("--pending", help="comma-separated queue lengths (default 50,200,1000)")
    parser.add_argument("--skip-replay", action="store_true", help="leave out the full replay")
    parser.add_argument("--quick", action="store_true", help="8/32/64 GPUs x 50/1000 pending, 20 plans, no replay")
    parser.add_argument("--markdown", type=Path, help="also write the section of docs/results.md to this file")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        print(f"planner bench: trace {args.trace} not found (use --trace)", file=sys.stderr)
        return 2
    gpus = [int(x) for x in args.gpus.split(",")] if args.gpus else ([8, 32, 64] if args.quick else list(GPUS))
    pending = (
        [int(x) for x in args.pending.split(",")] if args.pending else ([50, 1000] if args.quick else list(PENDING))
    )
    repeat = 20 if args.quick else args.repeat
    jobs = list(map_trace(read_trace(args.trace), H200).jobs)
    started = datetime.now(UTC)
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    print(f"{repeat} plans per cell; running jobs: {RUNNING_PER_GPU} per GPU; replay costs: {REPLAY_SETTINGS}")
    cells: list[Cell] = []
    for g in gpus:
        base, used = build_running(jobs, g, round(RUNNING_PER_GPU * g))
        rows = jobs[used:]
        for malleable in (False, True):
            for p in pending:
                state = with_queue(base, rows, p, malleable=malleable)
                flex = Planner(H200, REPLAY_SETTINGS)
                drain = LayoutManager("drain", H200, state.layouts, REPLAY_SETTINGS).planner
                wall, cpu = time_plans(flex.plan, state, repeat)
                _, rival = time_plans(drain.plan, state, max(5, repeat // 4))
                plan = flex.plan(state)
                validate_plan(state, plan)
                cell = Cell(
                    g,
                    p,
                    malleable,
                    len(base.running),
                    p50=statistics.median(cpu),
                    p99=p99(cpu),
                    wall_p50=statistics.median(wall),
                    wall_p99=p99(wall),
                    drain_p50=statistics.median(rival),
                    actions=len(plan),
                )
                cells.append(cell)
                print(
                    f"  {g:4d} GPUs {len(base.running):4d} running {p:5d} pending{' malleable' if malleable else '':10}"
                    f" flex CPU p50 {ms(cell.p50):>6} p99 {ms(cell.p99):>6} ms (wall p50 {ms(cell.wall_p50):>6}"
                    f" p99 {ms(cell.wall_p99):>6} ms)  drain p50 {ms(cell.drain_p50):>6} ms"
                    f"  ({cell.p50 / cell.drain_p50:.1f}x; plan of {cell.actions} actions)",
                    flush=True,
                )
    verdicts = report(cells)
    replay_line = None
    if not args.skip_replay and not args.quick:
        replay_line = full_replay(args.trace)
    print(f"load average after: {load_average()}")
    if args.markdown:
        args.markdown.write_text(markdown(cells, verdicts, replay_line, repeat, started, args.quick))
    return 0


def report(cells: list[Cell]) -> list[str]:
    """Print the growth and the goals; return the goal lines."""
    lines: list[str] = []
    for malleable in (False, True):
        mine = [c for c in cells if c.malleable == malleable]
        label = "malleable" if malleable else "rigid"
        if len({c.gpus for c in mine}) > 1 and len({c.pending for c in mine}) > 1:
            b, c = fit(mine)
            sg, sp = worst_slopes(mine)
            verdict = "met" if b <= 1.0 and c <= 1.0 else "MISSED"
            lines.append(
                f"{label}: CPU p99 ~ GPUs^{b:.2f} x pending^{c:.2f} (steepest step between neighbours: GPUs^{sg:.2f},"
                f" pending^{sp:.2f}); goal at most linear in either: {verdict}"
            )
        goal = [c for c in mine if (c.gpus, c.pending) == GOAL_CELL]
        if goal:
            g = goal[0]
            verdict = "met" if g.wall_p99 < GOAL_P99_S else "MISSED"
            lines.append(
                f"{label}: p99 at 64 GPUs and 1,000 pending {ms(g.wall_p99)} ms wall ({ms(g.p99)} ms CPU);"
                f" goal < 25 ms: {verdict}"
            )
    print()
    for line in lines:
        print(line)
    return lines


def full_replay(trace: Path) -> str:
    """Replay the whole trace (arrivals as they are) on h200x8 under flex and drain; one line of figures."""
    prep = prepare(ReplayConfig(trace, node="h200x8"))
    t0 = time.perf_counter()
    result = run_policy(prep, "flex", REPLAY_SETTINGS)
    flex_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_policy(prep, "drain", REPLAY_SETTINGS)
    drain_s = time.perf_counter() - t0
    verdict = "met" if flex_s <= GOAL_REPLAY_S else "MISSED"
    m = result.metrics
    line = (
        f"full replay of {trace.name} on h200x8 ({len(prep.jobs):,} jobs, arrivals as they are): flex {flex_s:.1f} s,"
        f" drain {drain_s:.1f} s ({flex_s / drain_s:.2f}x); goal <= 60 s: {verdict}"
    )
    print(f"\n{line}")
    print(f"  flex: mean JCT {m.mean_jct_s / 3600:.2f} h, migrations {m.migrations}, re-splits {m.resplits}")
    return line


def markdown(
    cells: list[Cell], verdicts: list[str], replay_line: str | None, repeat: int, started: datetime, quick: bool
) -> str:
    """The "Planning time" section of docs/results.md."""
    gpus = sorted({c.gpus for c in cells})
    pend = sorted({c.pending for c in cells})
    cmd = ".venv/bin/python bench/planner.py" + (" --quick" if quick else "")
    out = [
        "## Planning time",
        "",
        f"`{cmd}` ({started:%Y-%m-%d %H:%M} UTC; {machine()}; load average {load_average()} at the end). "
        f"One warm planner per cell, {repeat} plans timed; each node runs {RUNNING_PER_GPU} one-slice jobs per GPU and "
        "queues the next rows of the default trace, so the head is blocked and every plan does the whole pass. "
        "Times are CPU time of the planning thread (wall time counts the waits for a core too, which a loaded "
        "machine adds; it is printed beside). Rival: the strong drain planning the same state in the same process.",
        "",
    ]
    for malleable in (False, True):
        mine = {(c.gpus, c.pending): c for c in cells if c.malleable == malleable}
        out += [
            f"Flex p50 / p99, CPU ms ({'queue malleable: elastic requests may start narrow' if malleable else 'rigid'}"
            "; wall p99 and the drain's p50 in brackets):",
            "",
            "| GPUs (running) | " + " | ".join(f"{p:,} pending" for p in pend) + " |",
            "|---|" + "---|" * len(pend),
        ]
        for g in gpus:
            row = [mine[(g, p)] for p in pend if (g, p) in mine]
            if not row:
                continue
            cols = " | ".join(f"{ms(c.p50)} / {ms(c.p99)} ({ms(c.wall_p99)}; {ms(c.drain_p50)})" for c in row)
            out.append(f"| {g} ({row[0].running}) | {cols} |")
        out.append("")
    out += [f"- {line}" for line in verdicts]
    if replay_line:
        out.append(f"- {replay_line}")
    glance = [c for c in cells if (c.gpus, c.pending) == GOAL_CELL]
    if glance:
        out += ["", "<!-- glance -->"]
        for c in glance:
            kind = "malleable queue" if c.malleable else "rigid queue"
            out.append(
                f"| planning, 64 GPUs, 400 running + 1,000 pending, {kind} (`bench/planner.py`) "
                f"| p99 {ms(c.wall_p99)} ms wall, {ms(c.p99)} ms CPU | < 25 ms |"
            )
        out.append("<!-- /glance -->")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
