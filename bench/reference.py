"""The replay's baselines against an independent implementation, on a trace the replay was not tuned on.

``tests/support/refsim.py`` is a separate, simpler event-driven simulator of static, strong drain, fluid and
repack under EASY and greedy backfilling; it shares no code with ``flexmig.replay`` or ``flexmig.plan``. This bench
replays the same jobs in both and prints, per policy and discipline, both mean completion times, their ratio
(goal: within 5%), how many jobs start at the same time in both (job for job), and each side's run time.

The held-out trace (``tests/support/heldout.py``): the task shapes of ``openb_pod_list_multigpu30.csv`` (resampled
towards multi-GPU tasks, no times) on the times of ``openb_pod_list_default.csv``, thinned to RHO 0.9 on h200x8.
``--trace FILE`` checks any pod list instead (or as well: repeatable). ``--quick``: the first 3,000 tasks on h200x4
(what the test runs).

``--flex`` runs the other comparison instead: flexmig's planner (``flex``, replay's costs) against the reference's
ideal repacking of whole instances, on the held-out trace's first 1,800 tasks (about 1,500 jobs once thinned to
RHO 0.9) on h200x8, per seed (``--seeds``, default 0-2) and discipline (EASY, greedy): the ratio of mean JCTs
(goal: at most 1.0), its median and worst over the seeds, and beside it, to show where a gap comes from, flex with
moves that cost nothing and no settling time (``free moves``: what is left is placement, not the price of moving),
flex with malleable jobs (``+m``), and, for the worst seed of each discipline, the gap by job size: each size's
share of the difference in mean JCT (start flex - start reference, summed over its jobs, over all jobs).

Run: ``.venv/bin/python bench/reference.py [--quick] [--trace FILE] [--load RHO] [--flex [--seeds 0-2]]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from flexmig.plan import Discipline, PlannerSettings
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.engine import replay
from flexmig.replay.managers import LayoutManager
from flexmig.replay.run import Prepared, ReplayConfig, prepare
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support.heldout import heldout_trace  # noqa: E402
from support.refcheck import POLICIES, STATIC_LAYOUT, ours, ref_jobs  # noqa: E402
from support.refsim import simulate  # noqa: E402

DISCIPLINES: tuple[Discipline, ...] = ("easy", "greedy")
FLEX_TASKS = 1800  # the held-out trace's first tasks: about 1,500 jobs at RHO 0.9 on h200x8
FREE_MOVES = replace(
    REPLAY_SETTINGS, checkpoint_s=0.0, restart_s=0.0, standby_restart_s=0.0, reconfigure_s=0.0, settling_s=0.0
)
"""flex with moves that cost nothing and may follow each other at once: what is left of a gap is placement."""


def check(prep: Prepared, label: str) -> bool:
    """Print the comparison for one prepared trace; True when every mean agrees within 5%."""
    jobs = ref_jobs(prep)
    arrival = {j.name: j.arrival_s for j in jobs}
    print(f"\n== {label}: {len(jobs)} jobs ({sum(j.ranks > 1 for j in jobs)} multi-GPU) on {prep.spec}")
    print(
        f"   {'policy':7} {'disc.':6} {'ours (h)':>9} {'ref (h)':>9} {'ratio':>7} {'same start':>12}"
        f" {'ours s':>7} {'ref s':>7}"
    )
    ok = True
    for policy in POLICIES:
        for discipline in DISCIPLINES:
            t0 = time.perf_counter()
            got = ours(prep, policy, discipline)
            t1 = time.perf_counter()
            layout = STATIC_LAYOUT if policy == "static" else []
            ref = simulate(jobs, policy, prep.spec.count, discipline, layout, REPLAY_SETTINGS.reconfigure_s)
            t2 = time.perf_counter()
            mean_ours = sum(end - arrival[n] for n, (_, end) in got.items()) / max(1, len(got))
            mean_ref = ref.mean_jct(jobs)
            same = sum(1 for n, (start, _) in got.items() if n in ref.start and abs(start - ref.start[n]) < 1.0)
            r = mean_ours / mean_ref if mean_ref else 1.0
            ok = ok and abs(r - 1.0) <= 0.05
            print(
                f"   {policy:7} {discipline:6} {mean_ours / 3600:9.2f} {mean_ref / 3600:9.2f} {r:7.4f}"
                f" {same:>5}/{len(got):<6} {t1 - t0:7.1f} {t2 - t1:7.1f}"
            )
    return ok


def flex_starts(
    prep: Prepared, settings: PlannerSettings, *, malleable: bool = False
) -> dict[str, tuple[float, float]]:
    """Start and end of every completed job under flex with ``settings``."""
    assert prep.spec.layout is not None  # prepare() refuses a node without MIG
    layouts = LayoutManager("flex", prep.spec.model, (prep.spec.layout,) * prep.spec.count, settings)
    run = replay(prep.jobs, layouts, prep.capacity, prep.mix(), malleable=malleable)
    return {r.name: (r.start_s, r.end_s) for r in run.records if r.start_s is not None and r.end_s is not None}


def mean_jct(got: dict[str, tuple[float, float]], arrival: dict[str, float]) -> float:
    """Mean completion time of ``got``'s jobs, seconds."""
    return sum(end - arrival[n] for n, (_, end) in got.items()) / max(1, len(got))


def size_of(ranks: int, profile: str) -> str:
    """``1x3g``, ``8x7g``: a job's size class."""
    return f"{ranks}x{profile.split('.', maxsplit=1)[0]}"


def flex_against_reference(seeds: list[int], load: float) -> bool:
    """Print flex / ideal repacking per seed and discipline, the medians and worst, and where the worst gap is; True
    when every median is at most 1.0."""
    rows: dict[Discipline, list[tuple[int, float, float, float, int]]] = {d: [] for d in DISCIPLINES}
    gaps: dict[tuple[Discipline, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        held = heldout_trace(Path(tmp) / "heldout.csv", FLEX_TASKS)
        for seed in seeds:
            prep = prepare(ReplayConfig(held, node="h200x8", load=load, seed=seed))
            jobs = ref_jobs(prep)
            arrival = {j.name: j.arrival_s for j in jobs}
            size = {j.name: size_of(j.ranks, j.profile) for j in jobs}
            print(f"seed {seed}: {len(jobs)} jobs ({sum(j.ranks > 1 for j in jobs)} multi-GPU)", flush=True)
            for d in DISCIPLINES:
                t0 = time.perf_counter()
                ref = simulate(jobs, "repack", prep.spec.count, d, [], REPLAY_SETTINGS.reconfigure_s)
                ref_mean = ref.mean_jct(jobs)
                flex = flex_starts(prep, replace(REPLAY_SETTINGS, discipline=d))
                free = flex_starts(prep, replace(FREE_MOVES, discipline=d))
                plus_m = flex_starts(prep, replace(REPLAY_SETTINGS, discipline=d), malleable=True)
                r, rf, rm = (mean_jct(x, arrival) / ref_mean for x in (flex, free, plus_m))
                late = sum(1 for n, (st, _) in flex.items() if st > ref.start.get(n, st) + 1.0)
                rows[d].append((seed, r, rf, rm, late))
                gap: dict[str, float] = defaultdict(float)
                for n, (st, _) in flex.items():
                    if n in ref.start:
                        gap[size[n]] += (st - ref.start[n]) / len(jobs) / 3600
                gaps[(d, seed)] = dict(gap)
                print(
                    f"   {d:6} flex {r:.4f}  free moves {rf:.4f}  +m {rm:.4f}  (ref {ref_mean / 3600:.2f} h;"
                    f" {late} jobs start later than in the reference; {time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    ok = True
    print("\nflex / ideal repacking (independent reference), mean JCT, per discipline over the seeds:")
    print(f"   {'disc.':6} {'median':>7} {'worst':>7} {'best':>7}   free moves: median, worst   +m: median, worst")
    for d in DISCIPLINES:
        r = [x[1] for x in rows[d]]
        rf = [x[2] for x in rows[d]]
        rm = [x[3] for x in rows[d]]
        ok = ok and statistics.median(r) <= 1.0
        print(
            f"   {d:6} {statistics.median(r):7.4f} {max(r):7.4f} {min(r):7.4f}"
            f"   {statistics.median(rf):.4f}, {max(rf):.4f}              {statistics.median(rm):.4f}, {max(rm):.4f}"
        )
    for d in DISCIPLINES:
        seed = max(rows[d], key=lambda x: x[1])[0]
        gap = gaps[(d, seed)]
        total = sum(gap.values())
        big = sorted(((k, v) for k, v in gap.items() if abs(v) >= 0.005), key=lambda kv: -abs(kv[1]))
        parts = ", ".join(f"{k} {v:+.3f}" for k, v in big)
        print(f"worst seed under {d} ({seed}): mean JCT {total:+.3f} h against the reference; by job size (h): {parts}")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit status 1 if a mean is more than 5% off (``--flex``: if a median is above 1.0)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the held-out trace's first 3,000 tasks on h200x4")
    parser.add_argument("--trace", type=Path, action="append", help="also check this pod list (repeatable)")
    parser.add_argument("--load", type=float, default=0.9, help="RHO (default 0.9)")
    parser.add_argument("--flex", action="store_true", help="flex against the reference's ideal repacking instead")
    parser.add_argument("--seeds", default="0-2", help="--flex: seeds, FIRST-LAST or comma-separated (default 0-2)")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    if args.flex:
        first, _, last = args.seeds.partition("-")
        seeds = list(range(int(first), int(last) + 1)) if last else [int(x) for x in args.seeds.split(",")]
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        ok = flex_against_reference(seeds, args.load)
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("every median at most 1.0: " + ("yes" if ok else "NO"))
        return 0 if ok else 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        limit, node = (3000, "h200x4") if args.quick else (None, "h200x8")
        held = heldout_trace(Path(tmp) / "heldout.csv", limit)
        ok = check(
            prepare(ReplayConfig(held, node=node, load=args.load)), "held-out (multigpu30 shapes, default times)"
        )
        for trace in args.trace or ():
            ok = check(prepare(ReplayConfig(trace, node="h200x8", load=args.load)), trace.name) and ok
    print("\nall means within 5%: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
