"""Where flex's gap to the ideal-repacking reference comes from: every job flex starts later than the reference, by why.

``bench/reference.py --flex`` compares flex's mean JCT with the independent reference's ideal repacking
(``tests/support/refsim.py``: whole instances re-packed onto the GPUs for free whenever a job starts). This bench
replays the same held-out trace (its first ``--tasks`` tasks, RHO 0.9, h200x8) in both, per seed and discipline, and
sorts every job that starts more than a second later under flex than under the reference into one class:

* **a, the reference moved a running job**: the reference's start of the job needed a repack. The reference has
  no positions, so this bench follows it with positions of its own: each start takes free room among the running
  jobs' instances where it can (the fullest GPU first, then the lowest; the lowest start), and only when no such
  room is left are all running instances re-packed (a move). Placement alone cannot match these starts.
* **b, placement**: the reference started it without moving anything, and at that time flex's running jobs plus
  this one fit as whole instances on the GPUs, but not around where flex's running jobs sat: a different placement
  of the same jobs would have had room.
* **c-taken, order**: flex's layout had room for it among its busy instances at that time (idle instances may be
  destroyed), and flex's pass then started other jobs (ahead of it in flex's queue, or backfilled) that took it.
* **c-room, discipline**: flex's layout had room and flex's pass started nothing: its queue discipline (an EASY
  reservation it would delay), or a rule of the planner (which instances it may create, and where).
* **price**: flex had room and started it in its first pass at or after the reference's start: it is late only by
  the time that pass's reconfiguration takes (the reference's repacking creates instances for nothing) or by the
  time to flex's next event.
* **c-full, order**: flex's running jobs at that time left no room even if re-packed: flex had started other jobs
  (or was still running jobs it had started later), so the GPUs were busy with different work.
* **unknown**: the exhaustive search for room in flex's layout ran past its budget (a handful of jobs a run).

Each class's figure is its jobs' JCT difference (end under flex - end under the reference) summed and divided by
the number of jobs: the classes and ``earlier`` (jobs flex starts no later; their difference is mostly negative)
add up to the difference in mean JCT. The share is of the late jobs' sum (what flex loses). Per class, the job sizes
that make most of it. ``--free`` also classifies flex with moves that cost nothing (bench/reference.py's ``free
moves``).

Run: ``.venv/bin/python bench/plan_gap.py [--seeds 0-2] [--tasks 1800] [--disciplines easy,greedy] [--free]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from flexmig.plan import Discipline, PlannerSettings
from flexmig.plan.types import JobRequest
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.engine import replay
from flexmig.replay.managers import Grant, LayoutManager, RunView
from flexmig.replay.run import Prepared, ReplayConfig, prepare
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from reference import FREE_MOVES, size_of  # noqa: E402
from support.heldout import heldout_trace  # noqa: E402
from support.refcheck import ref_jobs  # noqa: E402
from support.refsim import PROFILES, RefJob, RefResult, _can_add, simulate  # noqa: E402

CLASSES = ("a", "b", "c-taken", "c-room", "c-full", "price", "unknown")
Inst = tuple[int, str]  # (start, profile), as the reference names an instance


# ---------------------------------------------------------------------------------------------- room
class OutOfBudget(Exception):
    """A search for room tried more placements than its budget allows."""


def add_without_moving(
    gpus: list[list[Inst]], profiles: Sequence[str], *, fullest: bool = True, budget: int = 200_000
) -> list[tuple[int, Inst]] | None:
    """Where ``profiles`` go among ``gpus``' instances, none of which moves (``fullest``: the fullest GPU first; then
    the lowest GPU, the lowest start), or None when they do not fit there; exhaustive over the GPUs and starts, up to
    ``budget`` placements tried (OutOfBudget past it). ``gpus`` is left as it was."""
    todo = sorted(profiles, key=lambda p: (-PROFILES[p].compute, -PROFILES[p].memory))

    def fullness(g: int) -> tuple[int, int]:
        return (-sum(PROFILES[q].compute for _, q in gpus[g]) if fullest else 0, g)

    order = sorted(range(len(gpus)), key=fullness)
    free = sum(7 - sum(PROFILES[q].compute for _, q in lay) for lay in gpus)
    if sum(PROFILES[p].compute for p in todo) > free:
        return None
    placed: list[tuple[int, Inst]] = []
    spots: list[tuple[int, int]] = []  # (position in order, start) of each placed item: alike items go in order
    tries = [0]

    def go(i: int) -> bool:
        if i == len(todo):
            return True
        name = todo[i]
        floor = spots[-1] if i and todo[i - 1] == name else (-1, -1)
        seen: set[tuple[Inst, ...]] = set()
        for k, g in enumerate(order):
            state = tuple(sorted(gpus[g]))
            if state in seen:  # alike GPUs: trying one is enough
                continue
            seen.add(state)
            for s in PROFILES[name].starts:
                if (k, s) < floor or not _can_add(gpus[g], name, s):
                    continue
                tries[0] += 1
                if tries[0] > budget:
                    raise OutOfBudget
                gpus[g].append((s, name))
                placed.append((g, (s, name)))
                spots.append((k, s))
                if go(i + 1):
                    return True
                spots.pop()
                placed.pop()
                gpus[g].pop()
        return False

    try:
        ok = go(0)
    finally:
        for g, inst in placed:
            gpus[g].remove(inst)
    return placed if ok else None


def reference_moves(jobs: Sequence[RefJob], ref: RefResult, gpus: int) -> set[str]:
    """The jobs whose start in ``ref`` needed a running job moved, following the reference with positions."""
    by_name = {j.name: j for j in jobs}
    arrival = {j.name: j.arrival_s for j in jobs}
    starts = sorted(ref.start, key=lambda n: (ref.start[n], arrival[n], n))
    layout: list[list[Inst]] = [[] for _ in range(gpus)]
    where: dict[str, list[tuple[int, Inst]]] = {}
    ends = sorted(ref.end, key=lambda n: ref.end[n])
    e = 0
    moved: set[str] = set()
    for name in starts:
        t = ref.start[name]
        while e < len(ends) and ref.end[ends[e]] <= t:
            for g, inst in where.pop(ends[e], []):
                layout[g].remove(inst)
            e += 1
        job = by_name[name]
        got = add_without_moving(layout, [job.profile] * job.ranks)
        if got is None:  # a repack: every running instance placed again, this job's too
            moved.add(name)
            _repack_all(layout, [*where, name], by_name, where)
            continue
        where[name] = got
        for g, inst in got:
            layout[g].append(inst)
    return moved


def _repack_all(
    layout: list[list[Inst]],
    names: Sequence[str],
    by_name: Mapping[str, RefJob],
    where: dict[str, list[tuple[int, Inst]]],
) -> list[tuple[int, Inst]]:
    """Place all of ``names``' instances afresh, largest first (the reference says they pack)."""
    for g in range(len(layout)):
        layout[g].clear()
    where.clear()
    every = [(n, by_name[n].profile) for n in names for _ in range(by_name[n].ranks)]
    got = add_without_moving(layout, [p for _, p in every], fullest=False, budget=10**7)
    if got is None:
        raise RuntimeError("the reference ran a set of jobs that does not pack")
    pool = list(got)
    for n, p in sorted(every, key=lambda x: (-PROFILES[x[1]].compute, -PROFILES[x[1]].memory)):
        i = next(k for k, (_, inst) in enumerate(pool) if inst[1] == p)
        g, inst = pool.pop(i)
        where.setdefault(n, []).append((g, inst))
        layout[g].append(inst)
    return got


# ---------------------------------------------------------------------------------------- flex probed
@dataclass
class Probe:
    """For each job flex has not started by its reference start: whether flex's layout had room for it then."""

    due: list[tuple[float, str]]  # (reference start, job), in order
    profiles: Mapping[str, list[str]]
    gpus: int
    room: dict[str, str] = field(default_factory=dict)  # job -> "room" | "taken" | "price" | "placement" | "full"
    i: int = 0


class ProbedManager(LayoutManager):
    """flex's LayoutManager that, before a pass at or after a job's reference start, looks at whether the job fits."""

    probe: Probe

    def schedule(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        """Look, then schedule as flex does."""
        p = self.probe
        queued = {r.name for r in queue}
        looked = []
        while p.i < len(p.due) and p.due[p.i][0] <= now_s + 1e-9:
            name = p.due[p.i][1]
            p.i += 1
            if name in queued:
                p.room[name] = self._look(name, running)
                looked.append(name)
        grants = super().schedule(now_s, queue, running)
        started = {g.job for g in grants if g.kind == "start"}
        for name in looked:
            if p.room[name] == "room":
                p.room[name] = "price" if name in started else "taken" if started else "room"
        return grants

    def _look(self, name: str, running: Mapping[str, RunView]) -> str:
        p = self.probe
        busy: list[list[Inst]] = [[] for _ in range(p.gpus)]
        held: list[str] = []
        for job in running:
            for inst in self.holds().get(job, ()):
                busy[inst.gpu].append((inst.start, inst.profile.name))
                held.append(inst.profile.name)
        try:
            if add_without_moving(busy, p.profiles[name]) is not None:
                return "room"
            empty: list[list[Inst]] = [[] for _ in range(p.gpus)]
            fits = add_without_moving(empty, held + list(p.profiles[name]), fullest=False) is not None
        except OutOfBudget:
            return "unknown"
        return "placement" if fits else "full"


def flex_probed(
    prep: Prepared, settings: PlannerSettings, jobs: Sequence[RefJob], ref: RefResult
) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """Start and end of each job under flex, and for each job still queued at its reference start what flex's layout
    had then (``room``, ``placement``: only a re-packing of flex's running jobs had room, ``full``)."""
    assert prep.spec.layout is not None
    manager = ProbedManager("flex", prep.spec.model, (prep.spec.layout,) * prep.spec.count, settings)
    manager.probe = Probe(
        due=sorted((t, n) for n, t in ref.start.items()),
        profiles={j.name: [j.profile] * j.ranks for j in jobs},
        gpus=prep.spec.count,
    )
    run = replay(prep.jobs, manager, prep.capacity, prep.mix())
    got = {r.name: (r.start_s, r.end_s) for r in run.records if r.start_s is not None and r.end_s is not None}
    return got, manager.probe.room


# -------------------------------------------------------------------------------------------- the gap
@dataclass
class Gap:
    """One seed and discipline's gap: per class (and ``earlier``), hours of mean JCT, and per class and size."""

    n: int
    ratio: float
    total_h: float
    by_class: dict[str, float]
    count: dict[str, int]
    by_size: dict[str, dict[str, float]]


def classify(
    jobs: Sequence[RefJob],
    ref: RefResult,
    flex: Mapping[str, tuple[float, float]],
    room: Mapping[str, str],
    moved: set[str],
) -> Gap:
    """Sort the jobs into the classes and sum their JCT differences."""
    arrival = {j.name: j.arrival_s for j in jobs}
    size = {j.name: size_of(j.ranks, j.profile) for j in jobs}
    both = [n for n in flex if n in ref.end]
    n_jobs = len(both)
    by_class: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    by_size: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for name in both:
        diff = (flex[name][1] - ref.end[name]) / n_jobs / 3600
        if flex[name][0] <= ref.start[name] + 1.0:
            cls = "earlier"
        elif name in moved:
            cls = "a"
        else:
            cls = {"room": "c-room", "taken": "c-taken", "placement": "b", "full": "c-full", "price": "price"}.get(
                room.get(name, ""), "unknown"
            )
        by_class[cls] += diff
        count[cls] += 1
        by_size[cls][size[name]] += diff
    mean_flex = sum(flex[n][1] - arrival[n] for n in both) / n_jobs
    mean_ref = sum(ref.end[n] - arrival[n] for n in both) / n_jobs
    return Gap(
        n_jobs,
        mean_flex / mean_ref,
        (mean_flex - mean_ref) / 3600,
        dict(by_class),
        dict(count),
        {k: dict(v) for k, v in by_size.items()},
    )


def report(label: str, gap: Gap) -> None:
    """Print one seed and discipline's decomposition."""
    late = sum(gap.by_class.get(c, 0.0) for c in CLASSES)
    print(
        f"   {label}: flex/ref {gap.ratio:.4f}, mean JCT {gap.total_h:+.3f} h = late {late:+.3f}"
        f" + earlier {gap.by_class.get('earlier', 0.0):+.3f} ({gap.count.get('earlier', 0)} jobs)"
    )
    for c in CLASSES:
        h = gap.by_class.get(c, 0.0)
        sizes = sorted(gap.by_size.get(c, {}).items(), key=lambda kv: -abs(kv[1]))[:4]
        parts = ", ".join(f"{k} {v:+.3f}" for k, v in sizes if abs(v) >= 0.0005)
        share = 100 * h / late if late > 0 else 0.0
        print(f"      {c:7} {gap.count.get(c, 0):4} jobs {h:+.3f} h {share:5.1f} %   {parts}")


def main(argv: list[str] | None = None) -> int:
    """Decompose the gap per seed and discipline; print the shares over all of them at the end."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-2", help="FIRST-LAST or comma-separated (default 0-2)")
    parser.add_argument("--tasks", type=int, default=1800, help="the held-out trace's first tasks (default 1800)")
    parser.add_argument("--load", type=float, default=0.9, help="RHO (default 0.9)")
    parser.add_argument("--disciplines", default="easy,greedy", help="comma-separated (default easy,greedy)")
    parser.add_argument("--free", action="store_true", help="also flex with moves that cost nothing")
    args = parser.parse_args(argv)
    first, _, last = args.seeds.partition("-")
    seeds = list(range(int(first), int(last) + 1)) if last else [int(x) for x in args.seeds.split(",")]
    disciplines: list[Discipline] = [d for d in ("easy", "greedy") if d in args.disciplines.split(",")]
    print(f"machine: {machine()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    variants = [("flex", REPLAY_SETTINGS)] + ([("free moves", FREE_MOVES)] if args.free else [])
    totals: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    with tempfile.TemporaryDirectory() as tmp:
        held = heldout_trace(Path(tmp) / "heldout.csv", args.tasks)
        for seed in seeds:
            prep = prepare(ReplayConfig(held, node="h200x8", load=args.load, seed=seed))
            jobs = ref_jobs(prep)
            print(f"\nseed {seed}: {len(jobs)} jobs ({sum(j.ranks > 1 for j in jobs)} multi-GPU)", flush=True)
            for d in disciplines:
                t0 = time.perf_counter()
                ref = simulate(jobs, "repack", prep.spec.count, d, [], REPLAY_SETTINGS.reconfigure_s)
                moved = reference_moves(jobs, ref, prep.spec.count)
                for label, settings in variants:
                    flex, room = flex_probed(prep, replace(settings, discipline=d), jobs, ref)
                    gap = classify(jobs, ref, flex, room, moved)
                    report(f"{d:6} {label} ({time.perf_counter() - t0:.0f} s)", gap)
                    for c, h in gap.by_class.items():
                        totals[(d, label)][c] += h
    print("\nover the seeds: each class's share of the late jobs' JCT difference (summed over the seeds)")
    for (disc, label), by in totals.items():
        late = sum(by.get(c, 0.0) for c in CLASSES)
        parts = "  ".join(f"{c} {100 * by.get(c, 0.0) / late:5.1f} %" for c in CLASSES) if late > 0 else "-"
        print(f"   {disc:6} {label:10} late {late / len(seeds):+.3f} h a seed:  {parts}")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
