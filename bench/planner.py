"""Planning time: flexmig's planner against the drain baseline's, on the same node states, in one process.

Cases (targets from the issues):

1. 8 x H200 with 50 running jobs and 200 pending requests: p99 of one plan <= 50 ms; the same with the pending
   requests malleable (they may start narrow, the head may be reserved narrow), also <= 50 ms;
2. a 64 x H200 pool with 400 running jobs and 1,600 pending requests: one plan <= 1 s;
3. a full replay of ``openb_pod_list_default.csv`` (no load thinning: the arrivals as they are) on h200x8 under
   flex: <= 60 s of wall time.

The states are built from the trace: the running jobs are placed by the planner itself (so they sit where flexmig
would have put them), the pending requests are the next rows of the trace. Each plan is timed with
``time.perf_counter``; flex and drain alternate on the same state. Warm means the planner's geometry cache is kept
between plans, as the daemon keeps it; cold builds a new planner each time. Planner settings are replay's
(``flexmig.replay.costs.REPLAY_SETTINGS``), so the replay case matches bench/replay.py.

Run: ``.venv/bin/python bench/planner.py [--trace FILE] [--repeat N] [--quick]`` (``--quick``: 50 plans per case, no
64-GPU case, no full replay). The trace defaults to the vendored pod list under bench/traces/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
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


def build_state(jobs: list[TraceJob], gpus: int, running: int, pending: int, *, malleable: bool = False) -> NodeState:
    """``running`` one-slice jobs placed by the planner itself, then the next ``pending`` trace rows queued.

    Fifty jobs fit on eight GPUs only as one-slice instances, so the running jobs take the trace's rows (their
    names, run times) with a 1g profile; the queue is the trace as mapped (mostly 7g, some 3g and smaller), so the
    head is blocked and the planner does the whole pass: admission, the head's reservation, making room,
    backfilling.
    """
    planner = Planner(H200, REPLAY_SETTINGS)
    one = H200.profile_for_slices(1)
    layouts = tuple(Layout.empty(H200) for _ in range(gpus))
    holds: dict[str, RunningJob] = {}
    rows = iter(jobs)
    for job in rows:
        if len(holds) >= running:
            break
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
    queue = [request_for(j, malleable=malleable) for _, j in zip(range(pending), rows, strict=False)]
    return NodeState(H200, layouts, tuple(holds.values()), tuple(queue), 0.0)


def time_plans(make: Callable[[], Callable[[NodeState], object]], state: NodeState, repeat: int) -> list[float]:
    """Seconds per plan over ``repeat`` plans with the planner ``make`` returns (once: warm)."""
    plan = make()
    plan(state)  # first plan fills the caches; the daemon keeps its planner
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan(state)
        out.append(time.perf_counter() - t0)
    return out


def drain_planner(state: NodeState) -> Callable[[NodeState], object]:
    """The strong drain baseline's planning step over the same state (the replay's manager's planner)."""
    return LayoutManager("drain", H200, state.layouts, REPLAY_SETTINGS).planner.plan


def quantiles(xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))]
    return f"p50 {statistics.median(xs) * 1000:8.2f} ms  p99 {p99 * 1000:8.2f} ms  max {xs[-1] * 1000:8.2f} ms"


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=TRACE, help=f"pod-list CSV (default {TRACE.name}, vendored)")
    parser.add_argument("--repeat", type=int, default=200, help="plans timed in case 1 (case 2: a tenth)")
    parser.add_argument("--skip-replay", action="store_true", help="leave out case 3")
    parser.add_argument("--quick", action="store_true", help="50 plans per case, no 64-GPU case, no full replay")
    args = parser.parse_args(argv)
    path = args.trace
    if not path.is_file():
        print(f"planner bench: trace {path} not found (use --trace)", file=sys.stderr)
        return 2
    jobs = list(map_trace(read_trace(path), H200).jobs)
    print(f"machine: {machine()}")
    repeat = 50 if args.quick else args.repeat
    cases = [("8 GPUs", 8, 50, 200, repeat, 0.050, False), ("8 GPUs, malleable", 8, 50, 200, repeat, 0.050, True)]
    if not args.quick:
        cases.append(("64 GPUs", 64, 400, 1600, max(5, repeat // 10), 1.0, False))

    for label, gpus, running, pending, times, target, malleable in cases:
        state = build_state(jobs, gpus, running, pending, malleable=malleable)
        flex = time_plans(lambda: Planner(H200, REPLAY_SETTINGS).plan, state, times)
        drain = time_plans(lambda state=state: drain_planner(state), state, times)
        cold = []
        for _ in range(max(3, times // 20)):
            t0 = time.perf_counter()
            Planner(H200, REPLAY_SETTINGS).plan(state)
            cold.append(time.perf_counter() - t0)
        plan = Planner(H200, REPLAY_SETTINGS).plan(state)
        validate_plan(state, plan)
        kinds = sorted({type(a).__name__ for a in plan.actions})
        worst = sorted(flex)[min(len(flex) - 1, int(0.99 * len(flex)))]
        verdict = "met" if worst <= target else "MISSED"
        print(
            f"\n{label}: {len(state.running)} running, {len(state.pending)} pending"
            f" ({sum(r.malleable for r in state.pending)} malleable); plan has {len(plan)} actions {kinds}"
        )
        print(f"  flex (warm)   {quantiles(flex)}")
        print(f"  flex (cold)   {quantiles(cold)}")
        print(f"  drain (warm)  {quantiles(drain)}")
        print(f"  flex / drain median time: {statistics.median(flex) / statistics.median(drain):.2f}x")
        print(f"  target p99 <= {target * 1000:.0f} ms: {verdict} ({worst * 1000:.1f} ms)")

    if not args.skip_replay and not args.quick:
        prep = prepare(ReplayConfig(path, node="h200x8"))
        t0 = time.perf_counter()
        result = run_policy(prep, "flex", REPLAY_SETTINGS)
        flex_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_policy(prep, "drain", REPLAY_SETTINGS)
        drain_s = time.perf_counter() - t0
        m = result.metrics
        verdict = "met" if flex_s <= 60 else "MISSED"
        print(f"\nfull replay of {path.name} on h200x8 (arrivals as they are, {len(prep.jobs)} jobs):")
        print(
            f"  flex {flex_s:.1f} s (drain {drain_s:.1f} s, flex/drain {flex_s / drain_s:.2f}x); "
            f"target <= 60 s: {verdict}"
        )
        print(
            f"  flex figures: makespan {m.makespan_s / 86400:.1f} d, mean JCT {m.mean_jct_s / 3600:.2f} h, "
            f"migrations {m.migrations}, re-splits {m.resplits}, spread starts {m.spread_starts}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
