"""Slurm, a busy node, offline: the administrator's seeded mix (``bench/slurm_mix.py``'s generator) on a model of
one node under Slurm 22.05's rules, driven by flexmig's own decision code, in a second per seed instead of 27
minutes of real daemons.

The model, step by step (``STEP_S``):

* Slurm: jobs arrive at their times; the pending jobs start in priority order by the rules
  :mod:`flexmig.plan.backfill` describes (exact GRES type, whole-node backfill windows by the running jobs' time
  limits, nothing whose limit reaches into flexmig's reservation): :func:`flexmig.plan.backfill.forecast` itself
  says which start *now* (Slurm knows only the running jobs' limits). The main scheduler starts jobs in priority
  order up to the first that cannot start; the backfill pass (every ``BF_INTERVAL_S``, the testbed's
  ``bf_interval``; ``--bf-interval 30`` for Slurm's default) starts every job the rules allow. With one node per
  MIG instance the same: the main scheduler stops at the first job whose profile has registered nodes, all taken
  (Slurm's ``ESLURM_NODES_BUSY`` fails the partition for the jobs behind it), a job whose profile no node has
  yet does not stop it. With ``--sched-interval`` (Slurm's own is 60 s) its passes are Slurm's (:class:`MainPasses`):
  at once when a job ends, every ``sched_interval``, and ``batch_sched_delay`` after the last pass at the soonest
  when one was queued (a submission, a node deleted, flexmig's ``schedule`` step after a registration; a dynamic
  node's registration alone queues none: the rival ``no-schedule-step`` is flexmig before that step); without it,
  every step (the testbed's ``sched_interval=1``);
* flexmig: a round of :class:`flexmig.slurm.agent.SlurmAgent` every ``ROUND_S`` (the testbed's ``interval_s``), or
  sooner, on one GPU, when the daemon's look every ``PROBE_S`` (``[slurm] probe_s``) sees Slurm's job counters
  move (a job submitted, started or ended: :class:`Rounds`, the loop of
  :meth:`flexmig.wiring.slurm.SlurmComponent.run`), in
  mode act, on the agent's own pure code: :func:`flexmig.plan.reregistration.choose` on the node as
  :meth:`~flexmig.slurm.agent.SlurmAgent.node_now` sees it, the reservation's start from
  :func:`flexmig.plan.reregistration.close_in_s`, and :func:`flexmig.plan.waiting.next_step`, the function the agent
  acts on, for whether to commit, move earlier, abandon, carry out or wait; the model carries out the step on its
  own state where the agent calls Slurm;
* a re-registration closes the empty node for ``REREGISTER_S`` (``bench/slurm_mix.py``'s closed periods: 2.8 s
  median, 3.5 s worst), then the node has its new layout.

Checked against the real runs of ``bench/slurm_mix.py`` (``--against FILE``): the merged policy's real run (seed 24)
gave 76 % utilisation while jobs wait, 1.35x the packing bound, 19 re-registrations per hour; the model of the same
code 77 %, 1.36x, 19, with 27 of 45 jobs starting within 5 s of their real start (the first 17 all within 3 s),
before the daemon's look at Slurm's job counters was modelled (:class:`Rounds`; 78 %, 1.36x, 19 with it). Today's
policy, seed 24, two real runs: 83 % and 79 %, 1.28x and 1.29x; the model 83 %, 1.28x, with 41 and 38 of the 45
jobs starting within 5 s of their real starts (8 and 9 without the look).

Figures as ``bench/slurm_mix.py`` computes them (utilisation while jobs wait, makespan against the packing bound,
closed share, re-registrations per hour), and where the compute slices idle while jobs wait (``--timeline`` shows it
per 10 s):

* ``uncarved``: compute slices no instance holds;
* ``closed``: the node is being re-registered, or flexmig's reservation has started;
* ``reserved``: an instance is free, a job of its type waits, but its limit reaches into flexmig's reservation;
* ``window``: an instance is free, a job of its type waits, but Slurm's backfill window for another job keeps it
  out (or the instance freed since Slurm's last pass);
* ``no taker``: an instance is free and no waiting job asks for its type (the layout does not fit the queue).

Rivals, side by side on the same seeds: ``static`` (``3g+2g+1g``, no flexmig: the 7g jobs never run, as in
``bench/slurm_mix.py``), ``2.5 runs`` (the policy before: forecasts over 2.5 typical run times), ``now`` (this
tree's defaults), ``cover`` (a rejected variant: only layouts that hold every profile asked), ``per-gpu`` (Slurm
23.11+'s ``node_per_gpu``: :func:`simulate_per_gpu`, one GPU node per GPU with its own closures, the daemon's round
order and claims; on one GPU it is ``now``, figure for figure), ``per-gpu-by-gpu`` (a rejected variant: the busy GPU
nodes of a round plan by GPU, not by when they are expected to be empty, as before), and the design for
Slurm 23.11+ where every MIG instance is its own dynamic node: ``instances`` (:func:`flexmig.plan.carving.carve`
each round; idle instances destroyed and new ones created while busy ones run on, a new instance serving jobs
``REREGISTER_S`` later; no node ever closes as a whole; a blocked job holds its region after ``HOLD_AFTER_S``, or at
once when no waiting job can use the idle slices, ``[slurm] hold_when_idle``), ``small-first`` (it before
``hold_when_idle``: the hold only after ``HOLD_AFTER_S``), ``carve-free`` (``instances`` before
:data:`flexmig.plan.carving.KEEP_FREE_SLICES`: strictly in priority order, an older job's carving may destroy a free
instance that a waiting job of its profile could take), ``hold-at-once`` (a rejected variant of it: a blocked
job holds its region at once, whatever idles) and ``no-hold`` (a bound, not a policy: a blocked job
never holds a region, so a big job may wait for as long as small ones keep coming). ``--ideal`` takes the costs
away (a change and a job's start take no time, flexmig decides every step): with ``no-hold``, what a greedy
carving could reach on the mix were Slurm and the driver free. For those, "closed" is the share of the
node's slices closed to new jobs (registering, or in a held region past its time), not of time. Tune on seeds 1-20,
report on 21-40: ``.venv/bin/python bench/slurm_model.py --seeds 21-40`` (about a minute on 2 cores).

A node of several GPUs (``--gpus N``, issue #24: what a change costs on an 8-GPU node under Slurm 22.05): one layout
per GPU, Slurm's seats all GPUs' instances, :class:`~flexmig.plan.reregistration.NodeNow` with every GPU's layout as
the agent passes it; the mix scaled to the node (the generator's ``n``: N times 45 jobs over the same 12 minutes, so
each GPU sees the one-GPU load), the packing bound over N GPUs; a change re-registers the whole node (22.05: every
GPU closes for ``REREGISTER_S``, and flexmig's reservation closes every GPU). ``--per-change`` adds what one change
costs: the slice-seconds idle while jobs wait because of flexmig's reservation and the closures (``reserved`` +
``closed``) per re-registration. ``--gpus 1`` (the default) prints what the model printed before ``--gpus``. The
agent's layout choice grows with the GPUs (each GPU's candidates forecast on the whole node): 2-4 minutes a run at 8
GPUs on 2 cores, where ``--parallel 2`` helps.

A second apart (``--jitter S --draws N``): each seed runs N times, each arrival later by a draw uniform in
``[0, S)`` (:func:`jittered`), and the figures are over all runs. The decisions are discontinuous (a job a step later
can tip a round's choice of layout, and the run takes another branch), so one seed's figures are one draw of a
spread that a real run, whose submissions and Slurm passes land a fraction of a second apart from the model's, may
fall anywhere in. Seed 24, 40 draws of a second: 20 at 86 % and 1.19x, 12 at 83 % and 1.28x (the exact mix's
figures), 8 at 80 % and 1.26x; the two recent real runs gave 83 % and 79 %, 1.28x and 1.29x.

Who acts first on a job's end (``--race``, per instance): the model's Slurm runs its pass before flexmig's round in
a step, so a waiting job always takes the instance a job freed before flexmig can carve it. In the real runs Slurm
starts a job on a freed instance 0.1-1.5 s after the end (median 0.45 s) and flexmig looks every second, so either
may come first: in three real runs of seed 24, flexmig destroyed a free 7g while 7g jobs waited, and the GPU had to
drain again for them. ``--race`` runs flexmig's round first in a step where both run (about every other job's end
goes to flexmig): on seed 24 the policy before :data:`flexmig.plan.carving.KEEP_FREE_SLICES` (``carve-free``) then
gives 85 % (the real runs: 84-85 %), against 90 % without ``--race``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from flexmig.mig import H200
from flexmig.mig.enumerate import maximal_layouts
from flexmig.mig.layout import Layout, PlacedInstance
from flexmig.plan.backfill import Ask, Seat, forecast
from flexmig.plan.carving import HOLD_AFTER_S, Hold, Waiting, carve
from flexmig.plan.reregistration import (
    DrainHolder,
    NodeNow,
    RegistrationCost,
    changes_instances,
    choose,
    close_in_s,
)
from flexmig.plan.types import JobRequest, PlannerSettings, RankNeed
from flexmig.plan.waiting import Committed, next_step
from flexmig.slurm.claims import Claims, round_order
from machine import machine
from slurm_mix import SLICES, WINDOW_S, MixJob, Run, bound, figures, mix

STEP_S = 0.5
ROUND_S = 2.0  # the testbed's [slurm] interval_s
PROBE_S = 1.0  # [slurm] probe_s: a look at Slurm's job counters; a round at once when they moved
REREGISTER_S = 2.8  # the real run's closed periods (median 2.8 s, worst 3.5 s)
START_LATENCY_S = 0.3  # Slurm's start of a job that fits (bench/slurm.py: 0.30 s)
RECENT_S = 900.0  # the agent's recent-demand window
DRAIN_TIMEOUT_S = 900.0
MODEL = H200
BF_INTERVAL_S = 1.0  # the testbed's bf_interval
SCHED_INTERVAL_S: float | None = None  # Slurm's sched_interval; None: the main scheduler every step (the testbed's 1 s)
SLURM_FIRST = True  # per instance: in a step where both run, Slurm's pass before flexmig's round (--race: after)
BATCH_SCHED_DELAY_S = 3.0  # Slurm's batch_sched_delay: a queued pass runs this long after the last at the soonest
CAUSES = ("uncarved", "closed", "reserved", "window", "no taker")
STATIC = (("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6))
START = (("7g.141gb", 0),)
JOBS = 45  # the mix: jobs a GPU over its 12 minutes


@dataclass
class Job:
    """A job of the mix as the model runs it."""

    mix: MixJob
    submit_s: float
    start_s: float = math.inf
    end_s: float = math.inf
    seat: int = -1
    where: tuple[int, int] | None = None  # per-instance nodes: the (gpu, start) of its instance
    node: int | None = None  # per-GPU nodes: the GPU node it runs on

    @property
    def name(self) -> str:
        return f"job{self.mix.index}"

    @property
    def limit_s(self) -> float:
        return 60.0 * self.mix.limit_min


@dataclass
class Policy:
    """A policy: the settings and cost flexmig runs with, and an optional hook that changes a round's decision."""

    name: str
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    cost: RegistrationCost = field(default_factory=lambda: RegistrationCost(fixed_s=2.0))
    cover: bool = False
    agent: bool = True
    layout: tuple[tuple[str, int], ...] = START
    per_instance: bool = False  # one Slurm node per MIG instance (simulate_instances)
    per_gpu: bool = False  # one Slurm node per GPU (simulate_per_gpu)
    by_gpu: bool = False  # per_gpu: busy GPU nodes plan by GPU, not by when they are expected to be empty (before)
    hold_after_s: float = 0.0  # per_instance: a blocked job holds a region once it has waited this long
    hold_when_idle: bool = True  # per_instance: ... or at once when no waiting job can use the idle slices
    keep_free: bool = True  # per_instance: free instances of KEEP_FREE_SLICES or more go to jobs of their profile first
    schedule_step: bool = True  # per_instance: a registration ends with flexmig's schedule step (a queued pass)


@dataclass
class State:
    """The node and its queue at one moment: one layout per GPU (Slurm's seats are all GPUs' instances, in order)."""

    layouts: tuple[Layout, ...]
    jobs: list[Job]
    t: float = 0.0
    reregistering_until: float = -1.0
    pending_layout: Layout | None = None
    reservation: tuple[float, float] | None = None  # (start, end) of flexmig's reservation
    closed_at: float | None = None
    last_busy_change: float | None = None
    reregistrations: int = 0
    pick: random.Random | None = None  # per instance: Slurm starts a job on any free node of its profile (a draw)
    log: list[tuple[float, str]] = field(default_factory=list)
    losses: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[float, str, bool, float, dict[str, int], dict[str, str]]] = field(default_factory=list)
    node: int | None = None  # per-GPU nodes: this GPU node's state (its jobs only run here; the queue is shared)
    taken: frozenset[str] = frozenset()  # per-GPU nodes: waiting jobs a sibling's change claims

    def running(self) -> list[Job]:
        """Jobs Slurm has started (their instance is taken) and that have not ended (on this node)."""
        return [
            j for j in self.jobs
            if j.start_s < math.inf and self.t < j.end_s and (self.node is None or j.node == self.node)
        ]  # fmt: skip

    def pending(self) -> list[Job]:
        return [j for j in self.jobs if j.submit_s <= self.t and j.start_s == math.inf]

    def closed(self) -> bool:
        """Re-registering, or inside flexmig's reservation."""
        if self.t < self.reregistering_until:
            return True
        return self.reservation is not None and self.reservation[0] <= self.t < self.reservation[1]


@dataclass
class Rounds:
    """When flexmig's round runs, as :meth:`flexmig.wiring.slurm.SlurmComponent.run` decides: it looks every
    ``PROBE_S``; a round when ``ROUND_S`` have passed since the last one, or else when Slurm's job counters (jobs
    submitted, started, ended) moved since its last look.

    On one GPU a round takes a fraction of a second and a job's end is acted on at the next look: the real runs of
    seed 24 start 38 and 41 of their 45 jobs within 5 s of the model's with the look, 8 and 9 without (then the
    model's agent acted up to 2 s late, and on that seed took a better branch than the real node ever did). On
    several GPUs the agent's rounds take seconds (a forecast a GPU, and every change's re-registration under the
    actuator's action lock, one after the other), which the model does not time: there ``probe`` is off and a
    round comes every ``ROUND_S`` (the 8-GPU real run of seed 23: 59 re-registrations an hour, the model 58 without
    the look and 88 with it)."""

    next_look: float
    probe: bool = True
    last_round: float = -math.inf
    seen: tuple[int, int, int] | None = None

    def due(self, t: float, jobs: Sequence[Job]) -> bool:
        """Whether a round runs at ``t`` (call once a step)."""
        if not self.probe:
            due = t - self.last_round >= ROUND_S - 1e-9
            if due:
                self.last_round = t
            return due
        if t < self.next_look - 1e-9:
            return False
        self.next_look = t + PROBE_S
        due = t - self.last_round >= ROUND_S - 1e-9
        if not due:
            seen = (
                sum(j.submit_s <= t for j in jobs),
                sum(j.start_s <= t for j in jobs),
                sum(j.end_s <= t for j in jobs),
            )
            due = seen != self.seen
            self.seen = seen
        if due:
            self.last_round = t
        return due


def instances(layouts: Sequence[Layout]) -> list[tuple[int, PlacedInstance]]:
    """The node's instances as Slurm's seats: ``(gpu, instance)``, GPU by GPU (a job's ``seat`` indexes this)."""
    return [(g, i) for g, lay in enumerate(layouts) for i in lay.instances]


def spec(layouts: Sequence[Layout]) -> str:
    """The node's layouts as text: one GPU's spec, or the GPUs' specs (without the model) apart by `` | ``."""
    if len(layouts) == 1:
        return layouts[0].spec()
    return " | ".join(lay.spec().split(":", 1)[-1] for lay in layouts)


def _seats(st: State) -> list[tuple[str, int, Job | None]]:
    on = {j.seat: j for j in st.running()}
    return [(i.profile.name, i.profile.compute_slices, on.get(k)) for k, (_, i) in enumerate(instances(st.layouts))]


def slurm_step(st: State, *, backfill: bool) -> None:
    """Slurm starts what its rules allow now (:func:`flexmig.plan.backfill.forecast` decides which): its main
    scheduler the jobs in priority order up to the first that cannot start (a job of a type the node lacks is
    skipped); with ``backfill``, every job the forecast starts now."""
    if st.t < st.reregistering_until:
        return
    seats = _seats(st)
    forecast_seats = [
        Seat(p, n, 0.0, 0.0)
        if j is None
        else Seat(p, n, 1.0, j.start_s + j.limit_s - st.t)  # busy: Slurm knows only the limit
        for p, n, j in seats
    ]
    pending = st.pending()
    asks = [Ask(j.name, j.mix.profile, 1e9, j.limit_s) for j in pending]
    close = None if st.reservation is None else st.reservation[0] - st.t
    if close is not None and close <= 0:
        return
    got = forecast(forecast_seats, asks, 1e-9, close_s=close)
    by_name = {j.name: j for j in pending}
    started = list(got.started)
    if not backfill:
        types = {p for p, _, _ in seats}
        eligible = [a.name for a in asks if a.profile in types]
        n = 0
        while n < len(started) and n < len(eligible) and started[n] == eligible[n]:
            n += 1
        started = started[:n]
    taken: set[int] = set()
    for name in started:
        job = by_name[name]
        k = next(k for k, (p, _, j) in enumerate(seats) if p == job.mix.profile and j is None and k not in taken)
        taken.add(k)
        job.seat = k
        job.node = st.node
        job.start_s = st.t + START_LATENCY_S
        job.end_s = job.start_s + job.mix.runtime_s


def node_now(st: State) -> NodeNow:
    """The node as :meth:`flexmig.slurm.agent.SlurmAgent.node_now` builds it from Slurm's view."""
    running = []
    seats = instances(st.layouts)
    for j in st.running():
        gpu, inst = seats[j.seat]
        running.append(
            DrainHolder(
                j.name,
                inst.profile.compute_slices,
                j.start_s + j.limit_s - st.t,
                False,
                st.t - j.start_s,
                ((gpu, inst.start),),
            )
        )
    queue = tuple(
        JobRequest(
            j.name,
            RankNeed(profile=j.mix.profile),
            1,
            1,
            1,
            MODEL.profile(j.mix.profile).memory_mib,
            submitted_s=j.submit_s,
            expected_runtime_s=j.limit_s,
            movable=False,
        )
        for j in st.pending()
        if j.name not in st.taken
    )
    return NodeNow(MODEL, st.layouts, tuple(running), queue)


def recent(st: State) -> dict[str, float]:
    """The agent's recent demand: slice-seconds (half the limit) of the jobs submitted in the last ``RECENT_S``."""
    out: dict[str, float] = {}
    for j in st.jobs:
        if st.t - RECENT_S <= j.submit_s <= st.t:
            out[j.mix.profile] = out.get(j.mix.profile, 0.0) + SLICES[j.mix.profile] * j.limit_s / 2
    return out


_CANDIDATES: dict[frozenset[str], tuple[Layout, ...]] = {}


def candidates(profiles: frozenset[str]) -> tuple[Layout, ...]:
    got = _CANDIDATES.get(profiles)
    if got is None:
        got = _CANDIDATES[profiles] = tuple(maximal_layouts(MODEL, [MODEL.profile(p) for p in sorted(profiles)]))
    return got


def covering(profiles: frozenset[str]) -> tuple[Layout, ...]:
    """Layouts that hold every profile asked (but a whole-GPU one, which holds only itself)."""
    whole = {p.name for p in MODEL.plain_profiles if p.compute_slices == MODEL.compute_slices}
    parts = profiles - whole
    out = []
    for lay in candidates(profiles):
        names = {i.profile.name for i in lay.instances}
        if names & whole or parts <= names:
            out.append(lay)
    return tuple(out) or candidates(profiles)


def agent_round(st: State, pol: Policy) -> tuple[str, tuple[str, ...]]:
    """One round of the agent (:meth:`flexmig.slurm.agent.SlurmAgent._round`, mode act): what it did (``abandon``,
    ``acting``: a change carried out, committed or kept, or ``nothing``) and the jobs its verdict newly serves."""
    if st.t < st.reregistering_until:
        return "nothing", ()
    if st.reservation is not None and st.t >= st.reservation[1]:  # ended without its change
        st.reservation = None
        st.closed_at = st.t
    node = node_now(st)
    submitted = {j.name: j.submit_s for j in st.jobs}
    last = st.last_busy_change if st.closed_at is None else max(st.last_busy_change or -math.inf, st.closed_at)
    choice = choose(
        node, candidates=covering if pol.cover else candidates, settings=pol.settings, cost=pol.cost, now_s=st.t,
        waited_s=lambda name: st.t - submitted[name] if name in submitted else 0.0,
        last_change_s=last, committed=st.reservation is not None, recent=recent(st),
    )  # fmt: skip
    v, plan = choice.verdict, choice.plan
    res = None if st.reservation is None else Committed(*st.reservation)
    step = next_step(
        res, changes=changes_instances(plan), go=v.go, busy=any(not h.movable for h in node.running), now_s=st.t,
        close_in_s=close_in_s(node, pol.cost.fixed_s),
    )  # fmt: skip
    acting = v.go and changes_instances(plan) and (step.kind in ("change", "commit") or res is not None)
    did = "acting" if acting else "nothing"
    if step.kind == "abandon":
        st.reservation = None
        st.log.append((st.t, f"abandoned: {v.reason}"))
        did = "abandon"
    elif step.kind == "change":
        _change(st, choice.target, busy=bool(node.running) or res is not None, why=v.reason)
    elif step.kind == "earlier" and res is not None:
        st.reservation = (st.t + step.start_in_s, st.t + step.start_in_s + DRAIN_TIMEOUT_S)
        st.log.append((st.t, f"moved earlier by {res.start_s - st.t - step.start_in_s:.0f} s"))
    elif step.kind == "commit":
        st.reservation = (st.t + step.start_in_s, st.t + step.start_in_s + DRAIN_TIMEOUT_S)
        st.log.append((st.t, f"committed {spec(choice.target)} in {step.start_in_s:.0f} s: {v.reason}"))
    return did, (() if did == "abandon" else v.newly_served)


def _change(st: State, target: tuple[Layout, ...], *, busy: bool, why: str) -> None:
    """Re-register the whole node (Slurm 22.05: every GPU closes for ``REREGISTER_S``, whichever GPUs change)."""
    st.log.append((st.t, f"re-register {spec(st.layouts)} -> {spec(target)}{' (busy)' if busy else ''}: {why}"))
    st.layouts = target
    st.reservation = None
    st.reregistering_until = st.t + REREGISTER_S
    st.reregistrations += 1
    if busy:
        st.last_busy_change = st.t + REREGISTER_S


def account(st: State) -> None:
    """Where the slices idle this step while jobs wait (the module docstring's causes)."""
    pend = st.pending()
    seats = _seats(st)
    used = sum(n for _, n, j in seats if j is not None)
    waiting: dict[str, int] = {}
    for j in pend:
        short = j.mix.profile.split(".")[0]
        waiting[short] = waiting.get(short, 0) + 1
    why: dict[str, str] = {}
    if pend:
        carved = sum(n for _, n, _ in seats)
        _add(st, "uncarved", MODEL.compute_slices * len(st.layouts) - carved)
        wanted = {j.mix.profile for j in pend}
        for p, n, j in seats:
            if j is not None:
                continue
            if st.closed():
                cause = "closed"
            elif p not in wanted:
                cause = "no taker"
            elif st.reservation is not None and any(
                st.t + x.limit_s > st.reservation[0] for x in pend if x.mix.profile == p
            ):
                cause = "reserved"
            else:
                cause = "window"
            _add(st, cause, n)
            why[p.split(".")[0]] = cause
    st.timeline.append((st.t, spec(st.layouts), st.closed(), used, waiting, why))


def _add(st: State, cause: str, slices: float) -> None:
    if slices > 0:
        st.losses[cause] = st.losses.get(cause, 0.0) + slices * STEP_S


@dataclass(frozen=True)
class Result:
    """One run's figures (``bench/slurm_mix.py``'s), losses by cause (slice-seconds), and the state."""

    ran: int
    util_waiting: float
    makespan: float
    ratio: float
    closed_share: float
    reregs_per_h: float
    losses: dict[str, float]
    state: State

    @property
    def waits(self) -> list[float]:
        """Each job's wait from its submission to its start (those that ran)."""
        return [j.start_s - j.submit_s for j in self.state.jobs if j.start_s < math.inf]

    @property
    def per_change(self) -> float | None:
        """Slice-seconds idle while jobs wait because of flexmig's reservation and the node's closures (causes
        ``reserved`` and ``closed``) per re-registration: what one change costs (None: no change)."""
        if not self.state.reregistrations:
            return None
        return (self.losses.get("closed", 0.0) + self.losses.get("reserved", 0.0)) / self.state.reregistrations


def simulate(
    jobs: Sequence[MixJob], pol: Policy, *, gpus: int = 1, limit_s: float = 7200.0, pick: random.Random | None = None
) -> Result:
    """Run ``jobs`` on one model node of ``gpus`` GPUs under ``pol`` (every GPU starts with the policy's layout);
    ``pick``: per instance, Slurm starts a job on a free node of its profile drawn from it, not the first."""
    if gpus < 1:
        raise ValueError(f"simulate: gpus must be at least 1, not {gpus!r}")
    if pol.per_instance:
        return simulate_instances(jobs, pol, gpus=gpus, limit_s=limit_s, pick=pick)
    if pol.per_gpu:
        return simulate_per_gpu(jobs, pol, gpus=gpus, limit_s=limit_s)
    start = Layout.of(MODEL, list(pol.layout))
    st = State((start,) * gpus, [Job(j, j.arrival_s) for j in jobs])
    runnable = [j for j in st.jobs if pol.agent or j.mix.profile in {p for p, _ in pol.layout}]
    first = min(j.arrival_s for j in jobs)
    st.t = first
    rounds = Rounds(first, probe=gpus == 1)
    waiting_time = waiting_busy = 0.0
    closed_steps = steps = 0
    next_backfill = first
    while st.t < limit_s:
        slurm_step(st, backfill=False)
        if st.t >= next_backfill:
            slurm_step(st, backfill=True)
            next_backfill = st.t + BF_INTERVAL_S
        if pol.agent and rounds.due(st.t, st.jobs):
            agent_round(st, pol)
            slurm_step(st, backfill=False)
        if all(j.end_s <= st.t for j in runnable):
            break
        account(st)
        used = st.timeline[-1][3]
        steps += 1
        closed_steps += st.closed()
        if st.pending():
            waiting_time += STEP_S
            waiting_busy += used * STEP_S
        st.t += STEP_S
    return _result(jobs, st, first, gpus, waiting_busy, waiting_time, closed_steps / steps if steps else 0.0)


def _result(
    jobs: Sequence[MixJob], st: State, first: float, gpus: int, waiting_busy: float, waiting_time: float,
    closed_share: float,
) -> Result:  # fmt: skip
    """A run's figures from its state and what the loop summed (busy slice-seconds while jobs wait, and how long
    they waited)."""
    ran = [j for j in st.jobs if j.end_s < math.inf]
    makespan = max(j.end_s for j in ran) - first
    return Result(
        len(ran),
        waiting_busy / (MODEL.compute_slices * gpus * waiting_time) if waiting_time else 1.0,
        makespan,
        makespan / bound(list(jobs), gpus),
        closed_share,
        st.reregistrations / (makespan / 3600),
        st.losses,
        st,
    )


def policies() -> dict[str, Policy]:
    """The rivals: static (no flexmig), the merged policy before this change (forecasts over 2.5 typical run
    times), this tree's policy, a rejected variant (layouts that hold every profile asked), one Slurm node per GPU
    (Slurm 23.11+'s ``node_per_gpu``; :func:`simulate_per_gpu`; its busy GPU nodes planning by GPU, the order before,
    rejected), and one Slurm node per MIG instance (Slurm 23.11+;
    :func:`simulate_instances`) with blocked jobs holding a region after :data:`flexmig.plan.carving.HOLD_AFTER_S`
    or when nothing waiting can use the idle slices, only after it (``small-first``, the policy before), at once
    (rejected), or never (a bound: big jobs may starve)."""
    cost = RegistrationCost(fixed_s=2.0)
    return {
        "static": Policy("static", agent=False, layout=STATIC),
        "2.5 runs": Policy("2.5 runs", cost=replace(cost, horizon_runs=2.5)),
        "now": Policy("now", cost=cost),
        "cover": Policy("cover", cost=cost, cover=True),
        "per-gpu": Policy("per-gpu", cost=cost, per_gpu=True),
        "per-gpu-by-gpu": Policy("per-gpu-by-gpu", cost=cost, per_gpu=True, by_gpu=True),
        "instances": Policy("instances", per_instance=True, hold_after_s=HOLD_AFTER_S),
        "hold-at-once": Policy("hold-at-once", per_instance=True, hold_after_s=0.0),
        "no-hold": Policy("no-hold", per_instance=True, hold_after_s=math.inf, hold_when_idle=False),
        "no-schedule-step": Policy("no-schedule-step", per_instance=True, hold_after_s=HOLD_AFTER_S,
                                   schedule_step=False),
        "small-first": Policy("small-first", per_instance=True, hold_after_s=HOLD_AFTER_S, hold_when_idle=False),
        "carve-free": Policy("carve-free", per_instance=True, hold_after_s=HOLD_AFTER_S, keep_free=False),
    }


def simulate_per_gpu(jobs: Sequence[MixJob], pol: Policy, *, gpus: int = 1, limit_s: float = 7200.0) -> Result:
    """Run ``jobs`` with one Slurm node per GPU (``[slurm] node_per_gpu``, Slurm 23.11+): each GPU node is the
    one-GPU model of :func:`simulate` (its own layout, reservation and closures), the queue is shared; Slurm's passes
    take the GPU nodes in turn; flexmig's round runs one agent per GPU node in the daemon's order
    (:func:`flexmig.slurm.claims.round_order`) with its claims (:class:`flexmig.slurm.claims.Claims`: the jobs a
    change serves are left out of the other GPU nodes' queues for 60 s, or until it is abandoned)."""
    start = Layout.of(MODEL, list(pol.layout))
    shared = [Job(j, j.arrival_s) for j in jobs]
    nodes = [State((start,), shared, node=g) for g in range(gpus)]
    first = min(j.arrival_s for j in jobs)
    t = next_backfill = first
    rounds = Rounds(first, probe=gpus == 1)
    claims = Claims(60.0, lambda: t)
    empty_at: dict[str, float] = {}
    waiting_time = waiting_busy = 0.0
    closed_steps = steps = 0
    timeline: list[tuple[float, str, bool, float, dict[str, int], dict[str, str]]] = []
    while t < limit_s:
        for st in nodes:
            st.t = t
        backfill = t >= next_backfill
        for st in nodes:
            slurm_step(st, backfill=False)
            if backfill:
                slurm_step(st, backfill=True)
        if backfill:
            next_backfill = t + BF_INTERVAL_S
        if rounds.due(t, shared):
            order = round_order(
                [(f"g{st.node}", st.node) for st in nodes],
                waiting={f"g{st.node}" for st in nodes if st.reservation is not None},
                claiming=claims.owners(), busy={f"g{st.node}" for st in nodes if st.running()},
                empty_at=None if pol.by_gpu else empty_at,
            )  # fmt: skip
            for name in order:
                st = nodes[int(name[1:])]
                st.taken = claims.taken(name)
                empty_at[name] = t + close_in_s(node_now(st), pol.cost.fixed_s)
                did, served = agent_round(st, pol)
                claims.update(name, served, acting=did == "acting", abandoned=did == "abandon")
                slurm_step(st, backfill=False)
        if all(j.end_s <= t for j in shared):
            break
        used = 0.0
        for st in nodes:
            account(st)
            used += st.timeline[-1][3]
            closed_steps += st.closed()
        steps += len(nodes)
        timeline.append((t, " | ".join(spec(st.layouts).split(":", 1)[-1] for st in nodes), False, used, {}, {}))
        if any(j.submit_s <= t and j.start_s == math.inf for j in shared):
            waiting_time += STEP_S
            waiting_busy += used * STEP_S
        t += STEP_S
    merged = State(tuple(st.layouts[0] for st in nodes), shared, t=t)
    merged.reregistrations = sum(st.reregistrations for st in nodes)
    merged.log = sorted((ts, f"GPU {st.node}: {text}") for st in nodes for ts, text in st.log)
    merged.timeline = timeline
    for st in nodes:
        for cause, x in st.losses.items():
            merged.losses[cause] = merged.losses.get(cause, 0.0) + x
    return _result(jobs, merged, first, gpus, waiting_busy, waiting_time, closed_steps / steps if steps else 0.0)


def simulate_instances(
    jobs: Sequence[MixJob], pol: Policy, *, gpus: int = 1, limit_s: float = 7200.0, pick: random.Random | None = None
) -> Result:
    """Run ``jobs`` with one Slurm node per MIG instance (Slurm 23.11+ dynamic nodes): each round
    :func:`flexmig.plan.carving.carve` destroys idle instances and creates new ones while busy ones run on; a
    created instance serves jobs ``REREGISTER_S`` later (its node's slurmd starts and registers); Slurm starts the
    waiting jobs in priority order on free instances of their profile, keeping a held region's free instances to
    jobs whose limit ends before the hold's time (flexmig's reservation on their nodes)."""
    start = Layout.of(MODEL, list(pol.layout))
    st = State((start,) * gpus, [Job(j, j.arrival_s) for j in jobs], pick=pick)
    layouts = [start] * gpus
    registering: dict[tuple[int, int], float] = {}
    hold: Hold | None = None
    first = min(j.arrival_s for j in jobs)
    st.t = first
    rounds = Rounds(first, probe=gpus == 1)
    waiting_time = waiting_busy = closed_slices = 0.0
    steps = 0
    total = MODEL.compute_slices * gpus
    next_backfill = first
    passes = MainPasses(first)
    while st.t < limit_s:
        done = [w for w, u in registering.items() if u <= st.t]
        registering = {w: u for w, u in registering.items() if u > st.t}
        backfill = st.t >= next_backfill
        if backfill:
            next_backfill = st.t + BF_INTERVAL_S
        if done and pol.schedule_step:
            passes.queue()
        slurm_now = backfill or passes.due(st.t, st.jobs)
        if slurm_now and SLURM_FIRST:
            _slurm_instances(st, layouts, registering, hold, backfill=backfill)
        if rounds.due(st.t, st.jobs):
            running = st.running()
            busy = {j.where: j.start_s + j.limit_s - st.t for j in running if j.where is not None}
            queue = [Waiting(j.name, j.mix.profile, j.limit_s, st.t - j.submit_s) for j in st.pending()]
            c = carve(MODEL, layouts, busy, queue, now_s=st.t, hold=hold, registering=frozenset(registering),
                      hold_after_s=pol.hold_after_s, hold_when_idle=pol.hold_when_idle,
                      keep_free=pol.keep_free)  # fmt: skip
            on = {j.where for j in running}
            for g, s in c.destroy:
                if (g, s) in on:
                    raise RuntimeError(f"carve destroyed GPU {g}'s instance at {s}, where a job runs")
                layouts[g] = layouts[g].remove(s)
                passes.queue()  # scontrol delete queues a pass
            for g, inst, _ in c.create:
                layouts[g] = layouts[g].place(inst.profile, inst.start)
                registering[(g, inst.start)] = st.t + REREGISTER_S
                st.reregistrations += 1
            for r in c.reasons:
                st.log.append((st.t, r))
            hold = c.hold
            st.layouts = tuple(layouts)
            if passes.due(st.t, st.jobs):
                _slurm_instances(st, layouts, registering, hold, backfill=False)
        if slurm_now and not SLURM_FIRST:
            _slurm_instances(st, layouts, registering, hold, backfill=backfill)
        if all(j.end_s <= st.t for j in st.jobs):
            break
        used, closed = _account_instances(st, layouts, registering, hold)
        steps += 1
        if st.pending():
            waiting_time += STEP_S
            waiting_busy += used * STEP_S
        closed_slices += closed / total
        st.t += STEP_S
    return _result(jobs, st, first, gpus, waiting_busy, waiting_time, closed_slices / steps if steps else 0.0)


@dataclass
class MainPasses:
    """When Slurm's main scheduler runs (one node per instance): with ``SCHED_INTERVAL_S`` None, every step (the
    testbed's ``sched_interval=1``); else every ``SCHED_INTERVAL_S``, at once when a job ends (its epilog), and
    ``BATCH_SCHED_DELAY_S`` after the last pass at the soonest when one was queued (a submission, a node deleted,
    or flexmig's ``schedule`` step after a registration: a dynamic node's registration alone queues none)."""

    last: float
    queued: bool = False
    seen_ends: int = 0
    seen_arrivals: int = 0

    def queue(self) -> None:
        self.queued = True

    def due(self, t: float, jobs: Sequence[Job]) -> bool:
        if SCHED_INTERVAL_S is None:
            return True
        ends = sum(1 for j in jobs if j.end_s <= t)
        arrivals = sum(1 for j in jobs if j.submit_s <= t)
        if arrivals > self.seen_arrivals:
            self.queued = True
        run = t - self.last >= SCHED_INTERVAL_S or ends > self.seen_ends
        run = run or (self.queued and t - self.last >= BATCH_SCHED_DELAY_S)
        self.seen_ends, self.seen_arrivals = ends, arrivals
        if run:
            self.last, self.queued = t, False
        return run


def _slurm_instances(
    st: State, layouts: Sequence[Layout], registering: Mapping[tuple[int, int], float], hold: Hold | None,
    *, backfill: bool = True,
) -> None:  # fmt: skip
    """Slurm on one-instance nodes: each waiting job, in priority order, starts on the first free registered
    instance of its profile (one in the held region only when its limit ends before the hold's time). Its main
    scheduler (not ``backfill``) stops at the first job that cannot start while a registered node of its profile
    exists (busy, or reserved): Slurm's ``ESLURM_NODES_BUSY`` marks the partition failed for the jobs behind, which
    only the backfill pass then starts."""
    taken = {j.where for j in st.running()}
    for job in st.pending():
        w = _free_for(st, job, layouts, registering, hold, taken)
        if w is None:
            if not backfill and any(inst.profile.name == job.mix.profile and (g, inst.start) not in registering
                                    for g, lay in enumerate(layouts) for inst in lay):  # fmt: skip
                return
            continue
        job.where = w
        job.start_s = st.t + START_LATENCY_S
        job.end_s = job.start_s + job.mix.runtime_s
        taken.add(w)


def _free_for(
    st: State, job: Job, layouts: Sequence[Layout], registering: Mapping[tuple[int, int], float], hold: Hold | None,
    taken: set[tuple[int, int] | None],
) -> tuple[int, int] | None:
    """The first free registered instance of ``job``'s profile that may take it now (one in the held region only
    when its limit ends before the hold's time), or None; with ``st.pick`` (``--any-node``) any one of them, drawn:
    which of several idle nodes Slurm starts a job on is its own choice, and it decides which region frees first."""
    ok = []
    for g, lay in enumerate(layouts):
        for inst in lay:
            w = (g, inst.start)
            if inst.profile.name != job.mix.profile or w in taken or w in registering:
                continue
            fenced = hold is not None and hold.job != job.name and hold.covers(MODEL, g, inst)
            if not (fenced and hold is not None and st.t + job.limit_s > hold.at_s):
                if st.pick is None:
                    return w
                ok.append(w)
    return st.pick.choice(ok) if st.pick is not None and ok else None


def _account_instances(
    st: State, layouts: Sequence[Layout], registering: Mapping[tuple[int, int], float], hold: Hold | None
) -> tuple[int, int]:
    """Busy compute slices, and slices closed to new jobs (registering, or in a held region whose time has come);
    where the slices idle while jobs wait (the module docstring's causes)."""
    on = {j.where for j in st.running()}
    pend = st.pending()
    wanted = {j.mix.profile for j in pend}
    used = closed = 0
    why: dict[str, str] = {}
    waiting: dict[str, int] = {}
    for j in pend:
        short = j.mix.profile.split(".")[0]
        waiting[short] = waiting.get(short, 0) + 1
    for g, lay in enumerate(layouts):
        for inst in lay:
            n = inst.profile.compute_slices
            w = (g, inst.start)
            if w in on:
                used += n
                continue
            held = hold is not None and hold.covers(MODEL, g, inst)
            if w in registering or (held and hold is not None and st.t >= hold.at_s):
                closed += n
            if not pend:
                continue
            if w in registering:
                cause = "closed"
            elif held:
                cause = "reserved"
            elif inst.profile.name not in wanted:
                cause = "no taker"
            else:
                cause = "window"
            _add(st, cause, n)
            why[inst.profile.name.split(".")[0]] = cause
    if pend:
        _add(st, "uncarved", sum(lay.free_compute_slices() for lay in layouts))
    st.timeline.append((st.t, spec(layouts), False, used, waiting, why))
    return used, closed


def print_timeline(res: Result, step_s: float = 10.0) -> None:
    st = res.state
    i = 0
    notes = list(st.log)
    rows = st.timeline
    t = 0.0
    end = rows[-1][0] if rows else 0.0
    slices = MODEL.compute_slices * len(st.layouts)
    while t <= end:
        chunk = []
        while i < len(rows) and rows[i][0] < t + step_s:
            chunk.append(rows[i])
            i += 1
        if chunk:
            lay = chunk[-1][1].split(":", 1)[-1]
            closed = sum(c[2] for c in chunk) / len(chunk) >= 0.5
            busy = sum(c[3] for c in chunk) / len(chunk)
            waiting = chunk[len(chunk) // 2][4]
            why = chunk[len(chunk) // 2][5]
            w = " ".join(f"{n}x{p}" for p, n in sorted(waiting.items()))
            idle = " ".join(f"{p}:{c}" for p, c in sorted(why.items()))
            print(f"{t:6.0f}s {lay:<32} {'CLOSED' if closed else 'open':6} busy {busy:3.1f}/{slices} waiting [{w}]"
                  f"{' idle ' + idle if idle else ''}")  # fmt: skip
        for ts, text in notes:
            if t <= ts < t + step_s:
                print(f"        | {ts:6.0f}s {text[:160]}")
        t += step_s


def jittered(jobs: Sequence[MixJob], seed: int, draw: int, jitter_s: float) -> list[MixJob]:
    """``jobs`` with each arrival later by a draw uniform in ``[0, jitter_s)`` (``--jitter``; draw 0: unchanged): what
    a real run's submissions and Slurm's passes shift by, to see how far a second's difference carries the figures
    (the decisions are discontinuous: a job a step later can change which layout a round chooses)."""
    if draw == 0 or jitter_s <= 0:
        return list(jobs)
    rng = random.Random(f"{seed}:{draw}")
    return [replace(j, arrival_s=round(j.arrival_s + rng.uniform(0.0, jitter_s), 2)) for j in jobs]


def seeds_of(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def against(path: Path, rival: str, seed: int, pol: Policy, gpus: int = 1) -> None:
    """Compare a real run (``bench/slurm_mix.py --save``, its rival ``rival``, on ``gpus`` GPUs) with the model's
    run of ``pol`` on the same mix: the figures side by side, and how far each job's start is from the real one."""
    raw = json.loads(path.read_text())[rival]
    real = Run(rival, {int(k): v for k, v in raw["jobs"].items()}, [tuple(x) for x in raw["samples"]], raw["t0"],
               raw["reregistrations"], raw["error"], raw.get("log", []))  # fmt: skip
    jobs = mix(seed, JOBS * gpus)
    f = figures(real, jobs, gpus)
    model = simulate(jobs, pol, gpus=gpus)
    b = bound(jobs, gpus)
    print(f"\nthe real run {path} ({rival}) against the model ({pol.name}), seed {seed}:")
    print(f"{'':36}{'real':>14}{'model':>14}")
    print(
        f"{'slice utilisation while jobs wait':36}{100 * f['util_waiting']:>12.0f} %{100 * model.util_waiting:>12.0f} %"
    )
    print(f"{'makespan / packing bound':36}{f['makespan'] / b:>13.2f}x{model.ratio:>13.2f}x")
    print(f"{'closed share of busy time':36}{100 * f['closed_share']:>12.0f} %{100 * model.closed_share:>12.0f} %")
    print(f"{'re-registrations per hour':36}{f['reregs_per_h']:>14.0f}{model.reregs_per_h:>14.0f}")
    first_real = min(rec["submit"] for rec in real.jobs.values())
    first = min(j.arrival_s for j in jobs)
    diffs = []
    for j in model.state.jobs:
        rec = real.jobs.get(j.mix.index, {})
        if rec.get("starts") and j.start_s < math.inf:
            diffs.append((j.mix.arrival_s - first, (rec["starts"][0] - first_real) - (j.start_s - first)))
    if diffs:
        off = sorted(abs(d) for _, d in diffs)
        apart = [a for a, d in sorted(diffs) if abs(d) > 5.0]
        print(f"job starts, model against real: {sum(x <= 5.0 for x in off)}/{len(off)} within 5 s, median "
              f"{statistics.median(off):.1f} s, worst {off[-1]:.0f} s; the first job more than 5 s apart arrived at "
              f"{apart[0]:.0f} s" if apart else "")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="24", help="seeds, e.g. 24 or 1-20 or 21-40 (default 24)")
    ap.add_argument("--policies", default="static,2.5 runs,now", help="rivals, comma-separated (see policies())")
    ap.add_argument("--timeline", action="store_true", help="print each rival's timeline (first seed)")
    ap.add_argument("--against", type=Path, help="a real run's --save file of bench/slurm_mix.py to compare with")
    ap.add_argument("--as", dest="as_", default="now:now", help="REAL:MODEL rivals --against compares (now:now)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs on the node (default 1); the mix scales with them")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once, in that many processes (default 1)")
    ap.add_argument("--per-change", action="store_true", help="print what one change costs (idle slice-seconds)")
    ap.add_argument("--ideal", action="store_true", help="no costs: changes and starts take no time, a round a step")
    ap.add_argument("--jitter", type=float, default=0.0, metavar="S",
                    help="each arrival later by up to S s, DRAWS draws a seed (default 0: the mix as it is)")
    ap.add_argument("--draws", type=int, default=20, help="draws a seed with --jitter or --any-node (default 20)")
    ap.add_argument("--any-node", action="store_true",
                    help="per instance: Slurm starts a job on a free node of its profile, drawn, not the first")
    ap.add_argument("--bf-interval", type=float, default=BF_INTERVAL_S, metavar="S",
                    help=f"Slurm's bf_interval (default {BF_INTERVAL_S:g}: the testbed's; Slurm's own is 30)")
    ap.add_argument("--sched-interval", type=float, default=None, metavar="S",
                    help="Slurm's sched_interval, per instance (default: every step, the testbed's 1 s; Slurm's own "
                    "is 60)")
    ap.add_argument("--race", action="store_true",
                    help="per instance: in a step where both run, flexmig's round before Slurm's pass (a job's end is "
                    "acted on by whichever looks first; in the real runs flexmig often does)")
    args = ap.parse_args()
    if args.gpus < 1:
        ap.error(f"--gpus must be at least 1, not {args.gpus}")
    if args.jitter < 0 or args.draws < 1:
        ap.error(f"--jitter must be at least 0 and --draws at least 1, not {args.jitter} and {args.draws}")
    gpus = args.gpus
    n_jobs = JOBS * gpus
    if args.bf_interval <= 0:
        ap.error(f"--bf-interval must be above 0, not {args.bf_interval}")
    if args.sched_interval is not None and args.sched_interval <= 0:
        ap.error(f"--sched-interval must be above 0, not {args.sched_interval}")
    _slurm(args.bf_interval, args.sched_interval, args.race)
    if args.ideal:
        _ideal()
    pols = policies()
    names = [n for n in args.policies.split(",") if n]
    seeds = seeds_of(args.seeds)
    draws = range(1, args.draws + 1) if args.jitter > 0 or args.any_node else range(1)
    cases = [(seed, draw) for seed in seeds for draw in draws]  # a run each, per policy
    print(
        "flexmig Slurm mix, offline: a model of one node under Slurm 22.05's rules (the per-instance rivals: 23.11's "
        "dynamic nodes, one per MIG instance), flexmig's own decisions"
        + (f"; {gpus} GPUs, a change re-registers the whole node (per instance: what it creates)" if gpus > 1 else "")
    )
    load = os.getloadavg()
    print(f"machine: {machine()}; load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    scaled = f" scaled to {gpus} GPUs: {JOBS} a GPU over the same {WINDOW_S / 60:.0f} minutes" if gpus > 1 else ""
    if args.ideal:
        print("--ideal: no costs (a change and a job's start take no time, flexmig decides every step)")
    looks = f" or within {PROBE_S} s of a job moving (its look at Slurm's counters)" if gpus == 1 else ""
    print(f"seeds {args.seeds}: {n_jobs} jobs each (the issue's mix{scaled}); Slurm every {STEP_S} s (backfill every "
          f"{BF_INTERVAL_S} s), flexmig every {ROUND_S} s{looks}, a re-registration closes the node "
          f"{REREGISTER_S} s")  # fmt: skip
    if args.jitter > 0:
        print(f"--jitter {args.jitter:g}: {args.draws} runs a seed, each arrival later by a draw in "
              f"[0, {args.jitter:g}) s; figures over all runs")  # fmt: skip
    if args.race:
        print("--race: in a step where Slurm's pass and flexmig's round both run, flexmig's comes first (so about "
              "every other job's end is acted on by flexmig before Slurm starts a waiting job on what it freed)")
    if args.any_node:
        print(f"--any-node: {args.draws} runs a seed, Slurm starting each job on a free node of its profile drawn at "
              "random (which of several idle nodes it takes is Slurm's choice); figures over all runs")
    results: dict[str, list[Result]] = {n: [] for n in names}
    t0 = time.monotonic()
    if args.parallel > 1:
        with ProcessPoolExecutor(args.parallel) as pool:
            futures = {
                n: [pool.submit(_run, seed, n, n_jobs, gpus, args.ideal, args.jitter, draw, args.bf_interval,
                                    args.sched_interval, args.any_node, args.race)
                    for seed, draw in cases]
                for n in names
            }
            for n in names:
                results[n] = [f.result() for f in futures[n]]
    else:
        for seed, draw in cases:
            jobs = jittered(mix(seed, n_jobs), seed, draw, args.jitter)
            for n in names:
                pick = _pick(seed, draw) if args.any_node else None
                results[n].append(simulate(jobs, pols[n], gpus=gpus, pick=pick))
    wall = time.monotonic() - t0
    case_names = [f"{seed}" if len(cases) == len(seeds) else f"{seed} draw {draw}" for seed, draw in cases]
    if len(cases) == 1:
        rows: list[tuple[str, Callable[[Result], str]]] = [
            ("jobs that ran", lambda r: f"{r.ran}/{n_jobs}"),
            ("closed share of busy time", lambda r: f"{100 * r.closed_share:.0f} %"),
            ("slice utilisation while jobs wait", lambda r: f"{100 * r.util_waiting:.0f} %"),
            ("makespan (s)", lambda r: f"{r.makespan:.0f}"),
            ("makespan / packing bound", lambda r: f"{r.ratio:.2f}x"),
            ("re-registrations per hour", lambda r: f"{r.reregs_per_h:.0f}"),
            ("wait, mean (s)", lambda r: f"{statistics.mean(r.waits):.0f}"),
            ("wait, longest (s)", lambda r: f"{max(r.waits):.0f}"),
        ]
        print(f"\n{'':36}" + "".join(f"{n:>14}" for n in names))
        for label, fn in rows:
            print(f"{label:36}" + "".join(f"{fn(results[n][0]):>14}" for n in names))
    else:
        over = f"{len(seeds)} seeds" if len(cases) == len(seeds) else f"{len(cases)} runs"
        print(f"\n{'median (worst) over ' + over:36}" + "".join(f"{n:>18}" for n in names))
        _summary("utilisation while jobs wait", results, names, lambda r: 100 * r.util_waiting, "%", worst=min)
        _summary("makespan / packing bound", results, names, lambda r: r.ratio, "x", worst=max)
        _summary("closed share of busy time", results, names, lambda r: 100 * r.closed_share, "%", worst=max)
        _summary("re-registrations per hour", results, names, lambda r: r.reregs_per_h, "", worst=max)
        _summary("jobs that ran", results, names, lambda r: r.ran, "", worst=min)
        _summary("wait, mean (s)", results, names, lambda r: statistics.mean(r.waits), "", worst=max)
        _summary("wait, longest (s)", results, names, lambda r: max(r.waits), "", worst=max)
        for n in names:  # the seeds to run for real beside the median (bench/slurm_mix.py --seed)
            rs = results[n]
            u = min(range(len(rs)), key=lambda k: rs[k].util_waiting)
            m = max(range(len(rs)), key=lambda k: rs[k].ratio)
            print(f"{n}: worst seeds: utilisation {case_names[u]} ({100 * rs[u].util_waiting:.0f} %), makespan "
                  f"{case_names[m]} ({rs[m].ratio:.2f}x)")  # fmt: skip
    print("\nslice-seconds idle while jobs wait, by cause (mean per seed; the module docstring says what each is):")
    width = max(14, *(len(n) + 1 for n in names))  # a name as wide as the column would run into the one before
    print(f"{'':36}" + "".join(f"{n:>{width}}" for n in names))
    for c in CAUSES:
        print(f"{c:36}" + "".join(f"{statistics.mean(r.losses.get(c, 0.0) for r in results[n]):>{width}.0f}"
                                  for n in names))  # fmt: skip
    if args.per_change:
        print(
            "\ncost of one change: slice-seconds idle while jobs wait because of flexmig's reservation and the "
            "closures (reserved + closed) per re-registration, median (worst) over seeds with a change:"
        )
        print(f"{'':36}" + "".join(f"{n:>18}" for n in names))
        cells = []
        for n in names:
            xs = [x for x in (r.per_change for r in results[n]) if x is not None]
            cells.append(f"{statistics.median(xs):.0f} ({max(xs):.0f})" if xs else "no change")
        label = f"per change, {gpus} GPU{'s' if gpus > 1 else ''}"
        print(f"{label:36}" + "".join(f"{c:>18}" for c in cells))
    for base in (x for x in ("now", "instances") if x in names):
        for n in (x for x in names if x != base and (base == "now" or x != "now")):
            gain = [100 * (a.util_waiting - b.util_waiting) for a, b in zip(results[base], results[n], strict=True)]
            ratio = [a.ratio / b.ratio for a, b in zip(results[base], results[n], strict=True)]
            print(f"{base} against {n}, seed by seed: utilisation while jobs wait {statistics.median(gain):+.1f} "
                  f"points median ({min(gain):+.1f} worst), makespan x{statistics.median(ratio):.3f} median "
                  f"(x{max(ratio):.3f} worst)")  # fmt: skip
    if args.timeline:
        for n in names:
            print(f"\ntimeline of {n} (seed {case_names[0]}): per 10 s the layout, open or closed, busy slices, the "
                  "jobs waiting by profile, and why each idle instance idles; flexmig's decisions at their "
                  "times")  # fmt: skip
            print_timeline(results[n][0])
    if args.against is not None:
        real, model = args.as_.split(":", 1)
        against(args.against, real, seeds[0], pols[model], gpus)
    print(f"\n{len(cases) * len(names)} runs in {wall:.1f} s; load at the end: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))  # fmt: skip
    return 0


def _ideal() -> None:
    """``--ideal``: a change and a job's start take no time, and flexmig decides every step."""
    global REREGISTER_S, START_LATENCY_S, ROUND_S, PROBE_S  # noqa: PLW0603
    REREGISTER_S = START_LATENCY_S = 0.0
    ROUND_S = PROBE_S = STEP_S


def _slurm(bf_interval_s: float, sched_interval_s: float | None = None, race: bool = False) -> None:
    """``--bf-interval``, ``--sched-interval``, ``--race``: Slurm's backfill every ``bf_interval_s``, its main
    scheduler's full pass every ``sched_interval_s``; ``race``: flexmig's round before Slurm's pass in a step."""
    global BF_INTERVAL_S, SCHED_INTERVAL_S, SLURM_FIRST
    BF_INTERVAL_S, SCHED_INTERVAL_S, SLURM_FIRST = bf_interval_s, sched_interval_s, not race


def _run(
    seed: int, name: str, n_jobs: int, gpus: int, ideal: bool = False, jitter_s: float = 0.0, draw: int = 0,
    bf_interval_s: float = 1.0, sched_interval_s: float | None = None, any_node: bool = False, race: bool = False,
) -> Result:  # fmt: skip
    """One run of ``--parallel``: seed ``seed``'s mix of ``n_jobs`` (its draw ``draw`` with ``--jitter``) under the
    policy ``name``, Slurm's backfill every ``bf_interval_s`` and full pass every ``sched_interval_s``; ``any_node``:
    the draw's node choices (``--any-node``); ``race``: ``--race``."""
    _slurm(bf_interval_s, sched_interval_s, race)
    if ideal:
        _ideal()
    jobs = jittered(mix(seed, n_jobs), seed, draw, jitter_s)
    return simulate(jobs, policies()[name], gpus=gpus, pick=_pick(seed, draw) if any_node else None)


def _pick(seed: int, draw: int) -> random.Random:
    """``--any-node``: the node choices of seed ``seed``'s draw ``draw`` (the same stream for every rival)."""
    return random.Random(f"{seed}:{draw}:node")


def _summary(label: str, results: dict[str, list[Result]], names: Sequence[str], fn: Callable[[Result], float],
             unit: str, *, worst: Callable[[list[float]], float]) -> None:  # fmt: skip
    cells = []
    for n in names:
        xs = [fn(r) for r in results[n]]
        fmt = ".2f" if unit == "x" else ".0f"
        cells.append(f"{statistics.median(xs):{fmt}}{unit} ({worst(xs):{fmt}}{unit})")
    print(f"{label:36}" + "".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
