"""Slurm, one node per MIG instance on a cluster, modelled: moves of running hook jobs
(:func:`flexmig.slurm.moves.plan_moves`) beside the per-instance policy alone, on several hosts under one slurmctld.

The model is ``bench/slurm_model.py``'s per-instance one (:func:`slurm_model.simulate_instances`: Slurm's passes,
flexmig's rounds and :func:`flexmig.plan.carving.carve`, a created instance serving jobs ``REREGISTER_S`` later),
with the GPUs of several hosts (``--hosts H --gpus G``: H x G GPUs, host ``h<k>`` holding GPUs ``k*G`` to
``k*G+G-1``; Slurm sees every instance node, as slurmctld does). The carving is one decision over every GPU of the
cluster: each host's flexmigd carves its own GPUs for Slurm's one queue, and the model lets them decide as one (the
claims that keep two hosts from carving for one job are not modelled). With ``moves``, each round:

* :func:`~flexmig.slurm.moves.plan_moves` on the cluster's layouts, the running jobs (a hook job or not, how often
  moved, the seconds to its limit, its cost as flexmigd weighs it, :data:`flexmig.slurm.moving.MOVE_COST_S`), the
  waiting jobs in priority order, the registering instances closed, the round's hold;
* each chosen job acknowledges its checkpoint ``ACK_S`` later and leaves its instance; it is requeued and held, and
  released ``REQUEUE_S`` after that (slurmd refuses a job restarted within the second it was killed: flexmig's
  credential gap of 1.5 s, plus ``scontrol requeuehold`` and ``release``); it waits behind every job already
  waiting, as in Slurm, whose ``batch_requeue_fini`` gives a requeued job the requeue's submit time and restarts
  its age (``--requeue kept``: in its old place, as the model had it before), and when Slurm starts it again it
  runs what it had left plus ``COLD_START_S`` (imports, its model built, its checkpoint loaded): the jobs of the
  mix sleep, a real job pays this;
* the waiting job's region becomes the hold, due when the jobs that stay there end (at once when none does): the
  carving destroys its idle instances and creates the waiting job's instance there as soon as they are gone;
* as flexmigd does (:meth:`flexmig.slurm.carver.InstanceCarver._carve`): the carving is chosen first and the moves
  are planned with its hold; a round that moves does not carve (the next round carves for the moved job, which
  waits again, and for the waiting one), and no target is made ahead.

Which jobs are hook jobs: half of the mix, drawn per seed (``--hook-share``, a ``random.Random(f"{seed}:hook")``).

Rivals (``--rivals``): ``instances`` (the per-instance policy, no moves: a blocked job holds a region after
``HOLD_AFTER_S`` or when nothing waiting can use the idle slices), ``reserve`` (the strongest rival without moves,
what Slurm's backfill does with a reservation for its top job: the first blocked job holds the region that empties
first at once, "drain one GPU for the big job"), ``moves`` (this tree's), ``moves-room`` (a rejected variant: a
moved job's target counted only after room for the waiting jobs of its profile, which it waits behind once
requeued), ``moves-own`` (a moved job's target only on the host of the room it leaves: each host plans on its own
GPUs, as ``flexmig.slurm.moving`` did before it counted other hosts' room, where ``moves`` counts free room on every
host, as Slurm restarts a requeued job on any) and ``moves-reserve`` (moves with the hold at once).

Yardsticks (the mix, ``bench/slurm_ideal.py``), per seed: a tighter lower bound on the makespan than the packing
bound (arrivals, and 7g work on whole GPUs), and an idealised rival, the mix with free, instant repacking of every
running job across all GPUs and hosts and exact run times, each job in submission order at the earliest it fits
beside the jobs before it: each rival's makespan against both, and, when the ideal's 7g jobs' longest wait is above
half of ``instances``' (no moves), the line saying that no mover halves it under the site's order (the 7g wait's
ratio to the ideal's takes the ideal's as 1 s at least: on a light mix it is often 0). The model's
Slurm is not that strict (its backfill starts a job on a free instance ahead of older waiting ones, a held region
aside), so a rival can wait less than the ideal on a seed.

Where the 7g jobs' longest wait goes: the table splits it into the seconds the job waited while a job submitted
before it had not started yet (it waits behind older jobs in Slurm's priority order, which neither a hold nor a move
changes: a move only empties a region once the job is the first that is blocked) and the seconds after.

Cases (``--case``):

* ``two``: the issue's two-GPU case, on one host of two H200s laid out ``1g.18gb@6`` each: two long 1g hook jobs
  (30 minutes, limits of an hour) start one on each GPU, a 7g job arrives 30 s later;
* ``mix``: the administrator's mix (``bench/slurm_mix.py``'s generator), 45 jobs a GPU over 12 minutes.

Figures: those of ``bench/slurm_model.py`` (utilisation while jobs wait, makespan against the packing bound), the
7g jobs' longest wait (submission to first start), the moves, the most moves of one job, and whether every moved
job started again exactly once per move and ended.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import slurm_model as sm
from flexmig.mig.layout import Layout
from flexmig.plan.carving import HOLD_AFTER_S, Hold, Waiting, carve
from flexmig.slurm.moves import MAX_MOVES_PER_JOB, Blocked, MovePlan, Region, Running, plan_moves
from flexmig.slurm.moving import MOVE_COST_S as MOVE_COST_ESTIMATE_S
from machine import machine
from slurm_ideal import Ideal, ideal, lower_bound
from slurm_mix import MixJob, bound, mix

ACK_S = 0.5  # signal to acknowledgement (bench/slurm.py: 0.26 s for a step-boundary save)
REQUEUE_S = 2.0  # requeuehold, the credential gap (1.5 s), release
COLD_START_S = 10.0  # a real job's imports, model build and checkpoint load before its next step
MOVE_COST_S = (
    MOVE_COST_ESTIMATE_S  # the policy's estimate of a move's cost, as flexmigd weighs it (ACK + REQUEUE + COLD)
)
SEVEN = "7g.141gb"


@dataclass
class Moves:
    """What the moves did in one run."""

    plans: list[tuple[float, MovePlan]] = field(default_factory=list)
    count: dict[str, int] = field(default_factory=dict)  # job -> times moved
    starts: dict[str, int] = field(default_factory=dict)  # job -> times Slurm started it
    first_start: dict[str, float] = field(default_factory=dict)
    requeue: list[tuple[float, sm.Job, float]] = field(default_factory=list)  # (release at, job, runtime left)


@dataclass(frozen=True)
class Outcome:
    """One run: the model's figures, and the moves'."""

    result: sm.Result
    moves: Moves
    hook: frozenset[str]

    @property
    def seven_longest(self) -> float:
        """The longest wait of a 7g job from its submission to its first start (0: no 7g job)."""
        st = self.result.state
        waits = [self.moves.first_start[j.name] - j.mix.arrival_s for j in st.jobs if j.mix.profile == SEVEN]
        return max(waits, default=0.0)

    @property
    def seven_behind(self) -> float:
        """Of the longest-waiting 7g job's wait, the seconds while a job submitted before it had not started yet
        (it waited behind older jobs, in Slurm's priority order; 0: no 7g job)."""
        fs = self.moves.first_start
        jobs = self.result.state.jobs
        sevens = [j for j in jobs if j.mix.profile == SEVEN and j.name in fs]
        if not sevens:
            return 0.0
        j = max(sevens, key=lambda k: fs[k.name] - k.mix.arrival_s)
        older = [min(fs.get(k.name, math.inf), fs[j.name]) for k in jobs if k.mix.arrival_s < j.mix.arrival_s]
        return max([j.mix.arrival_s, *older]) - j.mix.arrival_s

    @property
    def others_longest(self) -> float:
        """The longest wait of a job of another profile than 7g (the queue's own wait, which moves cannot shorten)."""
        return max((w for j, w in self._waits() if j.mix.profile != SEVEN), default=0.0)

    def _waits(self) -> list[tuple[sm.Job, float]]:
        return [(j, self.moves.first_start[j.name] - j.mix.arrival_s) for j in self.result.state.jobs
                if j.name in self.moves.first_start]  # fmt: skip

    @property
    def waits(self) -> list[float]:
        """Each job's wait from its submission to its first start."""
        return [self.moves.first_start[j.name] - j.mix.arrival_s for j in self.result.state.jobs
                if j.name in self.moves.first_start]  # fmt: skip

    @property
    def moved(self) -> int:
        """Moves made."""
        return sum(self.moves.count.values())

    @property
    def most(self) -> int:
        """The most moves of one job."""
        return max(self.moves.count.values(), default=0)

    @property
    def resumed_once(self) -> bool:
        """Every job started once more than it was moved, and ended."""
        st = self.result.state
        return all(
            self.moves.starts.get(j.name, 0) == 1 + self.moves.count.get(j.name, 0) and j.end_s < math.inf
            for j in st.jobs
        )


def hook_jobs(jobs: Sequence[MixJob], seed: int, share: float) -> frozenset[str]:
    """The jobs of the mix that opted into the hook: ``share`` of them, drawn per seed."""
    rng = random.Random(f"{seed}:hook")
    return frozenset(f"job{j.index}" for j in jobs if rng.random() < share)


def two_gpu_case() -> list[MixJob]:
    """The issue's case: two long 1g hook jobs, then a 7g job 30 s later."""
    return [
        MixJob(0, 0.0, "1g.18gb", 1800.0, 60),
        MixJob(1, 0.0, "1g.18gb", 1800.0, 60),
        MixJob(2, 30.0, SEVEN, 60.0, 2),
    ]


def simulate(
    jobs: Sequence[MixJob], *, hosts: int, gpus: int, hook: frozenset[str], moves: bool,
    layout: tuple[tuple[str, int], ...] = sm.START, max_moves: int = MAX_MOVES_PER_JOB, limit_s: float = 7200.0,
    hold_after_s: float = HOLD_AFTER_S, requeue_back: bool = True, behind: bool = False, own_host: bool = False,
) -> Outcome:  # fmt: skip
    """``jobs`` on ``hosts`` hosts of ``gpus`` GPUs each, one Slurm node per MIG instance, with or without moves;
    a blocked job holds a region after ``hold_after_s``; ``requeue_back``: a moved job waits again behind every job
    submitted before its requeue (Slurm's), not in its old place."""
    n = hosts * gpus
    start = Layout.of(sm.MODEL, list(layout))
    st = sm.State((start,) * n, [sm.Job(j, j.arrival_s) for j in jobs])
    layouts = [start] * n
    registering: dict[tuple[int, int], float] = {}
    hold: Hold | None = None
    first = min(j.arrival_s for j in jobs)
    st.t = first
    rounds = sm.Rounds(first, probe=n == 1)
    passes = sm.MainPasses(first)
    mv = Moves()
    waiting_time = waiting_busy = closed_slices = 0.0
    steps = 0
    next_backfill = first
    while st.t < limit_s:
        _release(st, mv, back=requeue_back)
        done = [w for w, u in registering.items() if u <= st.t]
        registering = {w: u for w, u in registering.items() if u > st.t}
        backfill = st.t >= next_backfill
        if backfill:
            next_backfill = st.t + sm.BF_INTERVAL_S
        if done:
            passes.queue()
        if backfill or passes.due(st.t, st.jobs):
            _slurm(st, layouts, registering, hold, mv, backfill=backfill)
        if rounds.due(st.t, st.jobs):
            hold = _round(st, layouts, registering, hold, passes, mv, hook=hook if moves else frozenset(),
                          hosts=hosts, gpus=gpus, max_moves=max_moves, hold_after_s=hold_after_s,
                          behind=behind, own_host=own_host)  # fmt: skip
            if passes.due(st.t, st.jobs):
                _slurm(st, layouts, registering, hold, mv, backfill=False)
        if not mv.requeue and all(j.end_s <= st.t for j in st.jobs):
            break
        used, closed = sm._account_instances(st, layouts, registering, hold)
        steps += 1
        if st.pending():
            waiting_time += sm.STEP_S
            waiting_busy += used * sm.STEP_S
        closed_slices += closed / (sm.MODEL.compute_slices * n)
        st.t += sm.STEP_S
    res = sm._result(jobs, st, first, n, waiting_busy, waiting_time, closed_slices / steps if steps else 0.0)
    return Outcome(res, mv, hook)


def _slurm(
    st: sm.State, layouts: list[Layout], registering: dict[tuple[int, int], float], hold: Hold | None, mv: Moves,
    *, backfill: bool,
) -> None:  # fmt: skip
    """Slurm's pass (``slurm_model``'s), counting each job's starts."""
    before = {j.name for j in st.jobs if j.start_s == math.inf}
    sm._slurm_instances(st, layouts, registering, hold, backfill=backfill)
    for j in st.jobs:
        if j.name in before and j.start_s < math.inf:
            mv.starts[j.name] = mv.starts.get(j.name, 0) + 1
            mv.first_start.setdefault(j.name, j.start_s)


def _release(st: sm.State, mv: Moves, *, back: bool) -> None:
    """Requeued jobs whose time came wait again, with what they had left plus a cold start to run; ``back``: as
    if submitted now, behind every job waiting (Slurm's ``batch_requeue_fini`` sets a requeued job's submit time to
    the requeue's and restarts its age), else in their old place."""
    due = [x for x in mv.requeue if x[0] <= st.t]
    mv.requeue = [x for x in mv.requeue if x[0] > st.t]
    for _, job, left in due:
        job.start_s = job.end_s = math.inf
        job.where = None
        job.mix = replace(job.mix, runtime_s=left + COLD_START_S)
        if back:
            job.submit_s = st.t
            st.jobs.remove(job)
            st.jobs.append(job)


def _round(
    st: sm.State, layouts: list[Layout], registering: dict[tuple[int, int], float], hold: Hold | None,
    passes: sm.MainPasses, mv: Moves, *, hook: frozenset[str], hosts: int, gpus: int, max_moves: int,
    hold_after_s: float = HOLD_AFTER_S, behind: bool = False, own_host: bool = False,
) -> Hold | None:  # fmt: skip
    """flexmig's round, as :meth:`flexmig.slurm.carver.InstanceCarver._carve` runs it: the carving
    (``slurm_model``'s) is chosen, then the moves with its hold; a round that moves carries out the moves and holds
    the waiting job's region instead of carving, any other carries out the carving. The hold it leaves."""
    running = st.running()
    busy = {j.where: j.start_s + j.limit_s - st.t for j in running if j.where is not None}
    queue = [Waiting(j.name, j.mix.profile, j.limit_s, st.t - j.submit_s) for j in st.pending()]
    c = carve(sm.MODEL, layouts, busy, queue, now_s=st.t, hold=hold, registering=frozenset(registering),
              hold_after_s=hold_after_s)  # fmt: skip
    if hook and queue:
        moved = _moves(st, layouts, registering, c.hold, queue, mv, hook=hook, hosts=hosts, gpus=gpus,
                       max_moves=max_moves, behind=behind, own_host=own_host)  # fmt: skip
        if moved is not None:
            return moved
    for g, s in c.destroy:
        layouts[g] = layouts[g].remove(s)
        passes.queue()
    for g, inst, _ in c.create:
        layouts[g] = layouts[g].place(inst.profile, inst.start)
        registering[(g, inst.start)] = st.t + sm.REREGISTER_S
        st.reregistrations += 1
    st.log.extend((st.t, r) for r in c.reasons)
    st.layouts = tuple(layouts)
    return c.hold


def _moves(
    st: sm.State, layouts: list[Layout], registering: dict[tuple[int, int], float], hold: Hold | None,
    queue: Sequence[Waiting], mv: Moves, *, hook: frozenset[str], hosts: int, gpus: int, max_moves: int,
    behind: bool = False, own_host: bool = False,
) -> Hold | None:  # fmt: skip
    """The moves the policy chooses, carried out (no target is made ahead: the moved job's instance is carved once
    it waits again); the hold of the waiting job's region, or None when nothing is moved. ``own_host``: a moved job's
    target only on the host of the room it leaves (each host plans on its own GPUs, as ``flexmig.slurm.moving``
    did before it counted other hosts' room), not on any host."""
    leaving = {j.name for _, j, _ in mv.requeue}
    running = [
        Running(j.name, (f"h{j.where[0] // gpus}", j.where[0] % gpus, j.where[1]), j.mix.profile,
                hook=j.name in hook and j.end_s > st.t + ACK_S and j.name not in leaving,
                moves=mv.count.get(j.name, 0), remaining_s=j.start_s + j.limit_s - st.t, cost_s=MOVE_COST_S)
        for j in st.running() if j.where is not None
    ]  # fmt: skip
    cluster = {f"h{h}": layouts[h * gpus : (h + 1) * gpus] for h in range(hosts)}
    closed = frozenset((f"h{g // gpus}", g % gpus, s) for g, s in registering)
    held = [] if hold is None else [(hold.job, Region(f"h{hold.gpu // gpus}", hold.gpu % gpus, hold.start,
                                                      hold.profile))]  # fmt: skip
    asks = [Blocked(w.name, w.profile, w.waited_s) for w in queue]
    plan = plan_moves(sm.MODEL, cluster, running, asks, max_moves_per_job=max_moves, closed=closed, held=held,
                      requeue_behind=behind)
    if own_host and plan.waiting is not None:
        plan = _own_host(plan.waiting, cluster, running, asks, closed, held, max_moves=max_moves)
    if not plan.moves or plan.region is None or plan.waiting is None:
        return None
    mv.plans.append((st.t, plan))
    st.log.append((st.t, f"move: {plan.reason}"))
    by_name = {j.name: j for j in st.jobs}
    for m in plan.moves:
        job = by_name[m.job]
        left = job.end_s - (st.t + ACK_S)
        job.end_s = st.t + ACK_S
        mv.count[m.job] = mv.count.get(m.job, 0) + 1
        mv.requeue.append((st.t + ACK_S + REQUEUE_S, job, left))
    st.layouts = tuple(layouts)
    r = plan.region
    return Hold(plan.waiting, int(r.host[1:]) * gpus + r.gpu, r.start, r.profile, st.t + max(ACK_S, plan.free_in_s))


def _own_host(
    waiting: str, cluster: dict[str, list[Layout]], running: Sequence[Running], asks: Sequence[Blocked],
    closed: frozenset[tuple[str, int, int]], held: Sequence[tuple[str, Region]], *, max_moves: int,
) -> MovePlan:  # fmt: skip
    """The moves for the blocked job ``waiting`` when each host plans on its own GPUs only (a region's moved jobs
    find their targets on its host): the best of the hosts' plans, as the host owning the job's moves would pick."""
    ask = [a for a in asks if a.name == waiting]
    best: tuple[tuple[float, int], MovePlan] | None = None
    last = MovePlan((), waiting, None, 0.0, 0.0, f"{waiting}: no host has room for its region's hook jobs")
    for h, lays in cluster.items():
        plan = plan_moves(sm.MODEL, {h: lays}, [r for r in running if r.place[0] == h], ask,
                          max_moves_per_job=max_moves, closed=frozenset(c for c in closed if c[0] == h),
                          held=[x for x in held if x[1].host == h])  # fmt: skip
        if not plan.moves:
            last = plan
            continue
        key = (plan.loss - plan.gain, len(plan.moves))
        if best is None or key < best[0]:
            best = (key, plan)
    return best[1] if best is not None else last


# ------------------------------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class Case:
    """What one run is: the case, its seed, the cluster's shape, moves or not."""

    case: str
    seed: int
    hosts: int
    gpus: int
    moves: bool
    share: float
    max_moves: int
    jobs: int = 0  # jobs in the mix; 0: 45 a GPU
    hold_after_s: float = HOLD_AFTER_S
    requeue_back: bool = True
    behind: bool = False
    own_host: bool = False


RIVALS = {
    "instances": (False, HOLD_AFTER_S, False, False),
    "reserve": (False, 0.0, False, False),
    "moves": (True, HOLD_AFTER_S, False, False),
    "moves-own": (True, HOLD_AFTER_S, False, True),
    "moves-room": (True, HOLD_AFTER_S, True, False),
    "moves-reserve": (True, 0.0, False, False),
}
"""Rivals: (moves, hold_after_s, a moved job's target only after room for the waiting jobs of its profile, a moved
job's target only on the host it leaves)."""


def run_case(c: Case) -> Outcome:
    """One run of ``c``."""
    if c.case == "two":
        jobs = two_gpu_case()
        hook = frozenset({"job0", "job1"})
        return simulate(jobs, hosts=c.hosts, gpus=c.gpus, hook=hook, moves=c.moves, layout=(("1g.18gb", 6),),
                        max_moves=c.max_moves, hold_after_s=c.hold_after_s, requeue_back=c.requeue_back,
                        behind=c.behind, own_host=c.own_host)  # fmt: skip
    jobs = mix(c.seed, c.jobs or sm.JOBS * c.hosts * c.gpus)
    return simulate(jobs, hosts=c.hosts, gpus=c.gpus, hook=hook_jobs(jobs, c.seed, c.share), moves=c.moves,
                    max_moves=c.max_moves, hold_after_s=c.hold_after_s, requeue_back=c.requeue_back,
                    behind=c.behind, own_host=c.own_host)  # fmt: skip


@dataclass(frozen=True)
class Yard:
    """A seed's yardsticks (``bench/slurm_ideal.py``): the packing bound, the tighter lower bound, the ideal rival."""

    seed: int
    packing: float
    tight: float
    ideal: Ideal


def yardstick(c: Case) -> Yard:
    """The yardsticks of ``c``'s mix on its cluster. The tighter bound counts from the first arrival, as the
    makespan does; the packing bound's latest-arrival term counts from 0, so on a light mix, where that term decides,
    the packing bound can lie above the tighter one (and above what a schedule reaches)."""
    jobs = mix(c.seed, c.jobs or sm.JOBS * c.hosts * c.gpus)
    n = c.hosts * c.gpus
    return Yard(c.seed, bound(jobs, n), lower_bound(jobs, n), ideal(jobs, n))


def _yardsticks(rows: dict[str, list[Outcome]], yards: Sequence[Yard]) -> None:
    """The makespans against the tighter bound and the ideal rival, and whether halving the 7g jobs' longest wait
    is within reach of any mover under the site's order."""
    med = statistics.median
    print("\nyardsticks, median (worst) over seeds: the tighter lower bound (arrivals, 7g work on whole GPUs) and the "
          "ideal rival (free, instant repacking of every running job across all GPUs and hosts, exact run times, "
          "each job in submission order at the earliest it fits beside the jobs before it)")  # fmt: skip
    sticks: list[tuple[str, Callable[[Yard], float], str]] = [
        ("tighter bound / packing bound", lambda y: y.tight / y.packing, ".3f"),
        ("ideal makespan / packing bound", lambda y: y.ideal.makespan / y.packing, ".3f"),
        ("ideal makespan / tighter bound", lambda y: y.ideal.makespan / y.tight, ".3f"),
        ("ideal 7g jobs' longest wait (s)", lambda y: y.ideal.seven_longest, ".0f"),
    ]
    for label, stick, fmt in sticks:
        print(f"{label:36}{_cell([stick(y) for y in yards], fmt, max):>20}")
    names = list(rows)
    print(f"\n{'':36}" + "".join(f"{n:>20}" for n in names))
    lines: list[tuple[str, Callable[[Outcome, Yard], float], str]] = [
        ("makespan / tighter bound", lambda o, y: o.result.makespan / y.tight, ".3f"),
        ("makespan / ideal's", lambda o, y: o.result.makespan / y.ideal.makespan, ".3f"),
        ("7g longest wait / ideal's", lambda o, y: o.seven_longest / max(y.ideal.seven_longest, 1.0), ".2f"),
    ]
    for label, fn, fmt in lines:
        print(f"{label:36}" + "".join(f"{_cell([fn(o, y) for o, y in zip(rows[n], yards, strict=True)], fmt, max):>20}"
                                      for n in names))  # fmt: skip
    for n in names:
        o = rows[n]
        k = max(range(len(o)), key=lambda i: o[i].result.ratio)
        y = yards[k]
        print(f"{n}: worst makespan on seed {y.seed}: the packing bound {y.packing:.0f} s, the tighter bound "
              f"{y.tight:.0f} s ({y.tight / y.packing:.3f}x), ideal repacking {y.ideal.makespan:.0f} s "
              f"({y.ideal.makespan / y.packing:.3f}x the packing bound); {n} {o[k].result.makespan:.0f} s, "
              f"{o[k].result.makespan / y.ideal.makespan:.3f}x the ideal's")  # fmt: skip
    base = "instances" if "instances" in rows else names[0]
    half = [o.seven_longest / 2 for o in rows[base]]
    ideal7 = [y.ideal.seven_longest for y in yards]
    out = sum(i > h for i, h in zip(ideal7, half, strict=True))
    verdict = "out of reach" if med(ideal7) > med(half) and max(ideal7) > max(half) else "not ruled out"
    print(f"halving the 7g jobs' longest wait of {base} under the site's order: {verdict}: half of {base}'s is "
          f"{med(half):.0f} s ({max(half):.0f} s worst), ideal repacking's own is {med(ideal7):.0f} s "
          f"({max(ideal7):.0f} s worst); on {out} of {len(yards)} seeds even ideal repacking waits longer than "
          f"half of {base}'s")  # fmt: skip


def _cell(xs: Sequence[float], fmt: str, worst: Callable[[Sequence[float]], float]) -> str:
    return f"{statistics.median(xs):{fmt}} ({worst(xs):{fmt}})"


def _table(rows: dict[str, list[Outcome]]) -> None:
    names = list(rows)
    print(f"\n{'median (worst) over seeds':36}" + "".join(f"{n:>20}" for n in names))
    lines: list[tuple[str, Callable[[Outcome], float], str, Callable[[Sequence[float]], float]]] = [
        ("utilisation while jobs wait (%)", lambda o: 100 * o.result.util_waiting, ".1f", min),
        ("makespan / packing bound", lambda o: o.result.ratio, ".3f", max),
        ("7g jobs' longest wait (s)", lambda o: o.seven_longest, ".0f", max),
        ("  of it behind older jobs (s)", lambda o: o.seven_behind, ".0f", max),
        ("  of it after them (s)", lambda o: o.seven_longest - o.seven_behind, ".0f", max),
        ("other jobs' longest wait (s)", lambda o: o.others_longest, ".0f", max),
        ("wait, mean (s)", lambda o: statistics.mean(o.waits), ".0f", max),
        ("moves", lambda o: o.moved, ".0f", max),
        ("most moves of one job", lambda o: o.most, ".0f", max),
        ("jobs that ran", lambda o: o.result.ran, ".0f", min),
    ]
    for label, fn, fmt, worst in lines:
        print(f"{label:36}" + "".join(f"{_cell([fn(o) for o in rows[n]], fmt, worst):>20}" for n in names))
    for n in names:
        ok = sum(o.resumed_once for o in rows[n])
        print(f"{n}: every moved job started again once per move and ended: {ok}/{len(rows[n])} runs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("two", "mix"), default="mix", help="the two-GPU case or the mix (default)")
    ap.add_argument("--seeds", default="161-180", help="seeds of the mix (default 161-180; tuned on 1-20)")
    ap.add_argument("--hosts", type=int, help="hosts (default 2; the two-GPU case 1)")
    ap.add_argument("--gpus", type=int, default=2, help="GPUs a host (default 2)")
    ap.add_argument("--jobs", type=int, default=0, help="jobs in the mix (default 45 a GPU; 45: the issue's mix as is)")
    ap.add_argument("--hook-share", type=float, default=0.5, help="share of the mix's jobs that are hook jobs (0.5)")
    ap.add_argument("--max-moves", type=int, default=MAX_MOVES_PER_JOB, help="[slurm] max_moves_per_job (2)")
    ap.add_argument("--rivals", default="instances,moves", help="instances (no moves), moves (default both)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once, in that many processes (default 1)")
    ap.add_argument("--log", action="store_true", help="print each move of the first seed's moves run")
    ap.add_argument("--requeue", choices=("back", "kept"), default="back",
                    help="where a moved job waits again: behind the jobs already waiting (back, Slurm's: its submit "
                    "time becomes the requeue's) or in its old place (kept)")
    args = ap.parse_args()
    if args.hosts is None:
        args.hosts = 1 if args.case == "two" else 2
    if args.hosts < 1 or args.gpus < 1:
        ap.error(f"--hosts and --gpus must be at least 1, not {args.hosts} and {args.gpus}")
    if not 0.0 <= args.hook_share <= 1.0:
        ap.error(f"--hook-share must be in [0, 1], not {args.hook_share}")
    if args.max_moves < 0:
        ap.error(f"--max-moves must be at least 0, not {args.max_moves}")
    rivals = [r for r in args.rivals.split(",") if r]
    if bad := [r for r in rivals if r not in RIVALS]:
        ap.error(f"--rivals: unknown {', '.join(bad)} ({', '.join(RIVALS)})")
    seeds = [0] if args.case == "two" else sm.seeds_of(args.seeds)
    gpus = args.hosts * args.gpus
    print("flexmig Slurm cluster, offline: one Slurm node per MIG instance, moves of running hook jobs "
          "(flexmig.slurm.moves) beside none")  # fmt: skip
    load = os.getloadavg()
    print(f"machine: {machine()}; load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    what = "the two-GPU case (two long 1g hook jobs, a 7g 30 s later)" if args.case == "two" else (
        f"seeds {args.seeds}: the mix, {args.jobs or sm.JOBS * gpus} jobs over 12 minutes "
        f"({(args.jobs or sm.JOBS * gpus) / gpus:.2f} a GPU; the issue's: {sm.JOBS} on one), "
        f"{100 * args.hook_share:.0f} % of them hook jobs")  # fmt: skip
    print(f"{args.hosts} host(s) x {args.gpus} GPU(s); {what}; a move costs the job {ACK_S} s to acknowledge, "
          f"{REQUEUE_S} s requeued, {COLD_START_S} s cold start; at most {args.max_moves} moves a job")  # fmt: skip
    back = args.requeue == "back"
    cases = {r: [Case(args.case, s, args.hosts, args.gpus, RIVALS[r][0], args.hook_share, args.max_moves, args.jobs,
                      RIVALS[r][1], back, *RIVALS[r][2:]) for s in seeds] for r in rivals}  # fmt: skip
    t0 = time.monotonic()
    if args.parallel > 1:
        with ProcessPoolExecutor(args.parallel) as pool:
            rows = {r: list(pool.map(run_case, cs)) for r, cs in cases.items()}
            yards = list(pool.map(yardstick, next(iter(cases.values())))) if args.case == "mix" else []
    else:
        rows = {r: [run_case(c) for c in cs] for r, cs in cases.items()}
        yards = [yardstick(c) for c in next(iter(cases.values()))] if args.case == "mix" else []
    wall = time.monotonic() - t0
    if args.case == "two":
        _two(rows)
    else:
        _table(rows)
        _yardsticks(rows, yards)
        for r in rivals:
            o = rows[r]
            print(f"{r}: worst seeds: utilisation {seeds[min(range(len(o)), key=lambda k: o[k].result.util_waiting)]}"
                  f", makespan {seeds[max(range(len(o)), key=lambda k: o[k].result.ratio)]}, 7g wait "
                  f"{seeds[max(range(len(o)), key=lambda k: o[k].seven_longest)]}")  # fmt: skip
    if args.log and "moves" in rows:
        for t, plan in rows["moves"][0].moves.plans:
            print(f"  {t:7.1f}s {plan.reason}")
    print(f"\n{sum(len(c) for c in cases.values())} runs in {wall:.1f} s; load at the end: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))  # fmt: skip
    return 0


def _two(rows: dict[str, list[Outcome]]) -> None:
    """The two-GPU case's figures: the 7g's wait, which jobs moved, each started how often."""
    for name, (o,) in rows.items():
        st = o.result.state
        seven = next(j for j in st.jobs if j.mix.profile == SEVEN)
        print(f"{name}: the 7g waited {o.moves.first_start[seven.name] - seven.mix.arrival_s:.1f} s; moved: "
              f"{', '.join(f'{j} ({n}x)' for j, n in sorted(o.moves.count.items())) or 'none'}; starts: "
              f"{', '.join(f'{j} {n}' for j, n in sorted(o.moves.starts.items()))}; every moved job started again "
              f"once and ended: {o.resumed_once}; makespan {o.result.makespan:.0f} s (bound "
              f"{bound(list(two_gpu_case()), 2):.0f} s)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
