"""The replay's baselines against an independent implementation, on a trace the replay was not tuned on.

``tests/support/refsim.py`` is a separate, simpler event-driven simulator of static, strong drain, fluid and
repack under EASY and greedy backfilling; it shares no code with ``flexmig.replay`` or ``flexmig.plan``. This bench
replays the same jobs in both and prints, per policy and discipline, both mean completion times, their ratio
(goal: within 5%), how many jobs start at the same time in both (job for job), and each side's run time.

The held-out trace (``tests/support/heldout.py``): the task shapes of ``openb_pod_list_multigpu30.csv`` (resampled
towards multi-GPU tasks, no times) on the times of ``openb_pod_list_default.csv``, thinned to RHO 0.9 on h200x8.
``--trace FILE`` checks any pod list instead (or as well: repeatable). ``--quick``: the first 3,000 tasks on h200x4
(what the test runs).

Run: ``.venv/bin/python bench/reference.py [--quick] [--trace FILE] [--load RHO]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from flexmig.plan import Discipline
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.run import Prepared, ReplayConfig, prepare
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from support.heldout import heldout_trace  # noqa: E402
from support.refcheck import POLICIES, STATIC_LAYOUT, ours, ref_jobs  # noqa: E402
from support.refsim import simulate  # noqa: E402

DISCIPLINES: tuple[Discipline, ...] = ("easy", "greedy")


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


def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit status 1 if a mean is more than 5% off."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the held-out trace's first 3,000 tasks on h200x4")
    parser.add_argument("--trace", type=Path, action="append", help="also check this pod list (repeatable)")
    parser.add_argument("--load", type=float, default=0.9, help="RHO (default 0.9)")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
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
