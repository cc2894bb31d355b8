"""Which MIG layout a Slurm node should have, and whether to change to it now, given that Slurm 22.05 cannot change
a node's GPU GRES while any job runs on it (the node must empty: every job ends, or is checkpointed and requeued,
then the node is re-registered).

A change waits for the node to empty; meanwhile the node stays open to jobs that end in time (the caller closes it
with a reservation that starts when the running jobs are expected to have ended). This module decides, in compute
slice-seconds (capacity times time, so a big job counts more than a small one), by **forecasting what Slurm itself
would run** (:mod:`flexmig.plan.backfill`: its queue order, exact GRES types and whole-node backfill windows by time
limits) over a horizon of a few typical run times, two ways:

* **stay**: today's instances, the running jobs ending when expected, the waiting jobs started as Slurm would;
* **change**: the node closes when its running jobs are expected to have ended (hook jobs checkpointed and back at
  the head of the queue), jobs that end before then still start, then the node is re-registered with the best
  *target* layout for what still waits: every maximal layout of the waiting profiles is forecast, GPU by GPU, and
  the one that keeps the most slices busy wins. An emptied node is thus laid out for the whole waiting mix, not
  only the head of the queue, and a layout that idles part of the GPU is never chosen over one that uses it all.

Then:

* **an idle node** (no job runs) is changed at once when the change keeps more slices busy (no batching gate): a
  job that needs a new layout runs within seconds;
* **a busy node** is changed (committed: the caller places its reservation) when the change keeps at least
  ``settings.gain_ratio`` times as many slices busy as staying, and no sooner than ``cost.min_interval_s`` after
  the last change that closed it (such changes are batched); a committed change is abandoned when staying becomes
  better by that same ratio (hysteresis, so a change does not flap);
* **nothing starves**: a waiting job that only the target layout can start, waiting ``cost.max_wait_s``, forces the
  change whatever the forecast says (a stream of small jobs keeps a node fully busy, and the forecast alone would
  keep a big job waiting);
* **expected run times** come from what Slurm knows: a running job is expected to end halfway between now and its
  time limit (surely by it); a waiting job halfway through its limit. A job without a limit gives no such hint: a
  running one is assumed to run on as long again as it has run and at least beyond the horizon, a waiting one for
  the whole horizon, so such jobs never make a busy node look about to empty (only ``max_wait_s`` closes it).

Pure: time is passed in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout
from flexmig.plan.backfill import Ask, Forecast, Seat, forecast
from flexmig.plan.types import CreateInstance, DestroyInstance, JobRequest, Plan, PlannerSettings

__all__ = [
    "Choice",
    "DrainHolder",
    "NodeNow",
    "RegistrationCost",
    "Verdict",
    "changes_instances",
    "choose",
    "layout_plan",
]

_HORIZON_RUNS = 1.5  # the horizon: this many typical (median) expected run times (RegistrationCost.horizon_runs)
_HORIZON_MIN_S = 60.0
_UNKNOWN_S = 1800.0  # the horizon when no job in view has a time limit
_TIE = 1e-6


@dataclass(frozen=True, slots=True)
class DrainHolder:
    """A job on the node: its compute slices, the time to its limit (None: no limit), whether it can checkpoint,
    how long it has run, and the instances it holds (``(gpu, start)``)."""

    name: str
    compute_slices: int
    remaining_s: float | None
    movable: bool
    elapsed_s: float = 0.0
    instances: tuple[tuple[int, int], ...] = ()

    def expected_left_s(self, floor_s: float) -> float:
        """Expected time until it ends by itself: half of what its limit leaves, or (no limit) its age."""
        if self.remaining_s is not None:
            return max(0.0, self.remaining_s) / 2.0
        return max(self.elapsed_s, floor_s)


@dataclass(frozen=True, slots=True)
class RegistrationCost:
    """What one re-registration costs beyond the jobs' own ends, and the rules that batch and bound changes.

    ``horizon_runs``: the forecasts look this many typical expected run times ahead (:func:`horizon_of`). 1.5, not
    more: a change on a busy node must then pay for its drain (the node emptying) within about one more run time
    once the node is re-registered, so a change whose benefit lies further ahead, where arrivals the forecast cannot
    see decide it anyway, waits; in ``bench/slurm_model.py`` (the issue's mix on a model of Slurm 22.05 driven by
    this code) 1.5 kept the slices busier while jobs wait and the makespan shorter than 2.5 on seeds not used to
    choose it.

    ``fixed_s``: closing, stopping slurmd, deleting and registering the node again (0.3 s on an idle single-node
    Slurm with the simulated driver, 1.7 s with a requeued job, measured by ``bench/slurm.py``; 5 s by default for a
    loaded controller and a real driver's instance changes); ``min_interval_s``: the shortest time between two
    changes that close a busy node; ``max_wait_s``: a waiting job only the change can start never waits longer than
    this for the change to be committed.
    """

    fixed_s: float = 5.0
    min_interval_s: float = 60.0
    max_wait_s: float = 1800.0
    horizon_runs: float = _HORIZON_RUNS


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to commit to a change, with the figures behind it and why.

    ``drain_s``: expected seconds until the node is empty and re-registered; ``gain``: busy slice-seconds the change
    adds over the horizon (0 when it adds none); ``cost``: slice-seconds idle while the node empties and is
    re-registered; ``newly_served``: waiting jobs the change starts that today's layout would not within the
    horizon; ``close_by_s``: the latest the node is empty by its jobs' limits (None: a job without a limit runs);
    ``forced``: committed because such a job waited ``max_wait_s``, whatever the figures.
    """

    go: bool
    drain_s: float
    gain: float
    cost: float
    reason: str
    newly_served: tuple[str, ...] = ()
    close_by_s: float | None = 0.0
    forced: bool = False


@dataclass(frozen=True, slots=True)
class NodeNow:
    """The node as the caller sees it: today's layouts (one per GPU), the GPUs whose layout must stay as it is
    (lost, another model, MIG off, or an instance with processes of no Slurm job), the jobs on it, and Slurm's queue
    for it in priority order (the hook jobs a change would requeue first, named in ``requeued``)."""

    model: GpuModel
    layouts: tuple[Layout, ...]
    running: tuple[DrainHolder, ...]
    queue: tuple[JobRequest, ...]
    fixed_gpus: frozenset[int] = frozenset()
    requeued: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Choice:
    """The verdict, the target layouts (one per GPU) and the plan of instance changes that reach them."""

    verdict: Verdict
    target: tuple[Layout, ...]
    plan: Plan


def changes_instances(plan: Plan) -> bool:
    """True when the plan creates or destroys an instance (so the node must be re-registered)."""
    return any(isinstance(a, CreateInstance | DestroyInstance) for a in plan.actions)


def layout_plan(
    current: Sequence[Layout], target: Sequence[Layout], now_s: float, *, reason: str = "", reconfigure_s: float = 5.0
) -> Plan:
    """The instance changes from ``current`` to ``target`` (per GPU): what differs is destroyed, then what is new is
    created; instances in both stay. Any creation order is valid: each step's layout is part of the target."""
    destroys: list[DestroyInstance] = []
    creates: list[CreateInstance] = []
    for gpu, (now, then) in enumerate(zip(current, target, strict=True)):
        have = {(i.start, i.profile.name) for i in now.instances}
        want = {(i.start, i.profile.name) for i in then.instances}
        for i in now.instances:
            if (i.start, i.profile.name) not in want:
                destroys.append(DestroyInstance(gpu, i.start, i.profile, reason, reconfigure_s))
        for i in then.instances:
            if (i.start, i.profile.name) not in have:
                creates.append(CreateInstance(gpu, i.start, i.profile, reason, reconfigure_s))
    return Plan((*destroys, *creates), now_s)


def _profile_of(model: GpuModel, req: JobRequest) -> str:
    """The GRES type a request asks for (an untyped GPU takes the smallest profile)."""
    if req.need.profile is not None:
        return req.need.profile
    plain = sorted(model.plain_profiles, key=lambda p: (p.compute_slices, p.memory_mib))
    need = max(1, req.need.compute_slices)
    return next((p.name for p in plain if p.compute_slices >= need), plain[-1].name)


def horizon_of(node: NodeNow, floor_s: float, runs: float = _HORIZON_RUNS) -> float:
    """``runs`` typical (median) expected run times of the jobs in view (limits halved), at least a minute and
    ``20 * floor_s``; ``_UNKNOWN_S`` when no job in view has a time limit."""
    times = [r.expected_runtime_s / 2.0 for r in node.queue if r.expected_runtime_s]
    times += [h.remaining_s / 2.0 + h.elapsed_s for h in node.running if h.remaining_s is not None]
    if not times:
        return _UNKNOWN_S
    return max(_HORIZON_MIN_S, 20 * floor_s, runs * statistics.median(times))


def _asks(node: NodeNow, horizon_s: float, *, requeued: bool) -> tuple[Ask, ...]:
    """The queue's requests as the forecast's asks: the requeued hook jobs (``requeued``) or the others. A request's
    ``expected_runtime_s`` is its time limit (Slurm's); it is expected to run half of it."""
    out = []
    for r in node.queue:
        if (r.name in node.requeued) != requeued:
            continue
        limit = r.expected_runtime_s
        run = horizon_s if limit is None else limit / 2.0
        out.append(Ask(r.name, _profile_of(node.model, r), run, math.inf if limit is None else limit, r.ranks))
    return tuple(out)


def _seats(
    node: NodeNow, layouts: Sequence[Layout], horizon_s: float, floor_s: float, *, at_s: float = 0.0,
    checkpointed: bool = False, fresh: frozenset[int] = frozenset(),
) -> list[Seat]:  # fmt: skip
    """The instances of ``layouts`` with the jobs running on them ``at_s`` seconds from now (GPUs in ``fresh`` were
    just re-created: empty); ``checkpointed``: hook jobs are gone (requeued)."""
    on: dict[tuple[int, int], DrainHolder] = {}
    for holder in node.running:
        for key in holder.instances:
            on[key] = holder
    out: list[Seat] = []
    for gpu, lay in enumerate(layouts):
        for inst in lay.instances:
            h = None if gpu in fresh else on.get((gpu, inst.start))
            if h is None or (checkpointed and h.movable):
                out.append(Seat(inst.profile.name, inst.profile.compute_slices))
                continue
            left = _left(h, horizon_s, floor_s) - at_s
            limit = math.inf if h.remaining_s is None else h.remaining_s - at_s
            if left > 0:
                out.append(Seat(inst.profile.name, inst.profile.compute_slices, left, limit))
            else:
                out.append(Seat(inst.profile.name, inst.profile.compute_slices))
    return out


def _left(h: DrainHolder, horizon_s: float, floor_s: float) -> float:
    """Expected seconds until ``h`` ends: halfway to its limit; without one, beyond the horizon (and as long again
    as it has run)."""
    if h.remaining_s is None:
        return max(h.elapsed_s, horizon_s + floor_s)
    return h.expected_left_s(floor_s)


def close_in_s(node: NodeNow, floor_s: float) -> float:
    """Seconds until the node is expected to be empty of its immovable jobs (halfway to their limits, never later
    than the limits; as long again as a job without a limit has run): where flexmig's reservation starts."""
    lefts = [h.expected_left_s(floor_s) for h in node.running if not h.movable]
    expected = max([0.0, *lefts])
    sure = close_by_s(node)
    return expected if sure is None else min(expected, sure)


def close_by_s(node: NodeNow) -> float | None:
    """Seconds until the node is surely empty by its immovable jobs' limits (None: one has no limit)."""
    lefts = [h.remaining_s for h in node.running if not h.movable]
    if any(x is None for x in lefts):
        return None
    return max([0.0, *(max(0.0, x) for x in lefts if x is not None)])


def choose(
    node: NodeNow,
    *,
    candidates: Callable[[frozenset[str]], Sequence[Layout]],
    settings: PlannerSettings,
    cost: RegistrationCost,
    now_s: float,
    waited_s: Callable[[str], float],
    last_change_s: float | None = None,
    committed: bool = False,
    recent: Mapping[str, float] | None = None,
) -> Choice:
    """The best layout for ``node`` once empty and whether to change to it now (the module docstring).

    ``candidates(profiles)`` gives the maximal layouts of one GPU built from ``profiles``; ``waited_s(name)`` how
    long a waiting request has waited; ``committed``: a change already waits (flexmig's reservation exists), so it
    is kept unless staying became better by ``settings.gain_ratio``; ``recent``: the slice-seconds the node was
    recently asked for, by profile. Layouts are built from the waiting profiles and the recent ones, and among
    layouts that keep as many slices busy, the one whose capacity matches the recent demand best wins (jobs keep
    arriving after the change).
    """
    floor = cost.fixed_s
    horizon = horizon_of(node, floor, cost.horizon_runs)
    changeable = [g for g in range(len(node.layouts)) if g not in node.fixed_gpus]
    today = node.layouts
    pending = _asks(node, horizon, requeued=False)
    stay = forecast(_seats(node, today, horizon, floor), pending, horizon)
    drained, ready = _drained(node, pending, horizon=horizon, floor=floor, checkpoint_s=settings.checkpoint_s)
    queue = (*_asks(node, horizon, requeued=True), *pending)
    rest = tuple(a for a in queue if a.name not in set(drained.started))
    total = sum(lay.model.compute_slices for g, lay in enumerate(today) if g in changeable)
    idle_cost = max(0.0, total * ready - (drained.busy_slice_s - _fixed_busy(node, today, horizon, floor)))
    have = {i.profile.name for g in changeable for i in today[g].instances}
    starving = sorted(
        (a for a in rest if a.profile not in have and waited_s(a.name) >= cost.max_wait_s),
        key=lambda a: -waited_s(a.name),
    )
    if not rest or not changeable:
        target = today
        after = Forecast(0.0, (), 0.0)
    else:
        target, after = _best_target(
            node, today, changeable, rest,
            candidates=candidates, horizon=horizon, ready=ready, floor=floor, recent=recent or {},
            must=starving[0].profile if starving else None,
        )  # fmt: skip
    switch = drained.busy_slice_s + after.busy_slice_s
    served = tuple(n for n in after.started if n not in set(stay.started))
    plan = layout_plan(
        today, target, now_s, reason="the layout for the waiting jobs", reconfigure_s=settings.reconfigure_s
    )
    figures = _Figures(stay.busy_slice_s, switch, served, idle_cost, ready, horizon)
    v = _verdict(
        node, plan, figures, rest, settings=settings, cost=cost, now_s=now_s, waited_s=waited_s,
        last_change_s=last_change_s, committed=committed, today=today, target=target,
    )  # fmt: skip
    return Choice(v, target, plan)


def _drained(
    node: NodeNow, pending: Sequence[Ask], *, horizon: float, floor: float, checkpoint_s: float
) -> tuple[Forecast, float]:
    """The change's forecast and when the node is ready for it: closed when the immovable jobs are expected to
    have ended, hook jobs checkpointed and requeued."""
    busy = any(not h.movable for h in node.running)
    close = close_in_s(node, floor) if busy else 0.0
    drained = forecast(_seats(node, node.layouts, horizon, floor, checkpointed=True), pending, horizon, close_s=close)
    moved = any(h.movable for h in node.running)
    empty = max(close if busy else 0.0, drained.empty_s if busy else 0.0) + (checkpoint_s if moved else 0.0)
    return drained, empty + floor


def _fixed_busy(node: NodeNow, today: Sequence[Layout], horizon: float, floor: float) -> float:
    """Busy slice-seconds of the GPUs that stay as they are (they do not count against the change)."""
    fixed = [lay if g in node.fixed_gpus else Layout.of(lay.model, []) for g, lay in enumerate(today)]
    return sum(s.slices * min(horizon, s.busy_s) for s in _seats(node, fixed, horizon, floor))


def _best_target(
    node: NodeNow,
    today: Sequence[Layout],
    changeable: Sequence[int],
    rest: Sequence[Ask],
    *,
    candidates: Callable[[frozenset[str]], Sequence[Layout]],
    horizon: float,
    ready: float,
    floor: float,
    recent: Mapping[str, float],
    must: str | None = None,
) -> tuple[tuple[Layout, ...], Forecast]:
    """The layouts (one per GPU) that keep the most slices busy once the node is re-registered ``ready`` seconds
    from now: the best one layout on every changeable GPU, then GPU by GPU the best replacement (multi-GPU nodes).
    Ties go to the layout whose capacity matches the ``recent`` demand best, then to the one with more slices
    carved, then to the one that changes fewer GPUs. With ``must`` (the profile of a job that waited
    ``max_wait_s``), only layouts that have it are considered."""
    known = {p.name for p in node.model.plain_profiles}
    smallest = min(node.model.plain_profiles, key=lambda p: (p.compute_slices, p.memory_mib)).name
    profiles = frozenset(a.profile for a in rest) | frozenset(p for p, w in recent.items() if w > 0 and p in known)
    options = list(candidates(profiles | {smallest}))  # the smallest profile fills what the others leave
    if must is not None:
        options = [lay for lay in options if any(i.profile.name == must for i in lay.instances)]
    span = max(0.0, horizon - ready)
    fresh = frozenset(changeable)
    total = sum(recent.values())
    share = {p: w / total for p, w in recent.items()} if total > 0 else {}

    def run(layouts: Sequence[Layout]) -> tuple[Forecast, tuple[float, ...]]:
        seats = _seats(node, layouts, horizon, floor, at_s=ready, fresh=fresh)
        f = forecast(seats, rest, span)
        slices: dict[str, int] = {}
        for g in changeable:
            for i in layouts[g].instances:
                slices[i.profile.name] = slices.get(i.profile.name, 0) + i.profile.compute_slices
        carved = sum(slices.values())
        matched = sum(min(n, share.get(p, 0.0) * carved) for p, n in slices.items())
        unchanged = sum(1 for g in changeable if layouts[g].spec() == today[g].spec())
        return f, (round(f.busy_slice_s, 6), round(matched, 6), carved, unchanged)

    best_layouts = tuple(today)
    best, key = run(best_layouts)
    if must is not None and options:  # today's layout lacks it: any layout that has it beats staying as is
        key = (-math.inf,)
    for lay in options:
        trial = tuple(lay if g in fresh else today[g] for g in range(len(today)))
        f, k = run(trial)
        if k > key:
            best_layouts, best, key = trial, f, k
    if len(changeable) > 1:
        for g in changeable:
            for lay in options:
                trial = tuple(lay if i == g else best_layouts[i] for i in range(len(today)))
                f, k = run(trial)
                if k > key:
                    best_layouts, best, key = trial, f, k
    return best_layouts, best


@dataclass(frozen=True, slots=True)
class _Figures:
    """The forecasts' figures: busy slice-seconds staying and changing, the jobs only the change starts, the
    slice-seconds idle until the node is re-registered, when that is, and the horizon."""

    stay: float
    switch: float
    served: tuple[str, ...]
    idle: float
    ready: float
    horizon: float


def _verdict(
    node: NodeNow,
    plan: Plan,
    fig: _Figures,
    rest: Sequence[Ask],
    *,
    settings: PlannerSettings,
    cost: RegistrationCost,
    now_s: float,
    waited_s: Callable[[str], float],
    last_change_s: float | None,
    committed: bool,
    today: Sequence[Layout],
    target: Sequence[Layout],
) -> Verdict:
    switch, stay, served = fig.switch, fig.stay, fig.served
    busy = any(not h.movable for h in node.running)
    figures = (
        f"{switch:.0f} vs {stay:.0f} busy slice-seconds in the next {fig.horizon:.0f} s with the change; "
        f"empty and registered in ~{fig.ready:.0f} s"
    )
    verdict = _Say(fig.ready, max(0.0, switch - stay), fig.idle, served, close_by_s(node))
    if not changes_instances(plan):
        return verdict.say(False, f"today's layout is the best for the waiting jobs ({figures})")
    have = {i.profile.name for lay in today for i in lay.instances}
    adds = {i.profile.name for lay in target for i in lay.instances} - have
    starving = [a for a in rest if a.profile in adds and waited_s(a.name) >= cost.max_wait_s]
    if not node.running:
        if switch > stay + _TIE or starving:
            return verdict.say(True, f"serves {len(served)} waiting job(s) on an idle node: {figures}")
        return verdict.say(False, f"the waiting jobs run as well on today's layout ({figures})")
    if starving:
        oldest = max(waited_s(a.name) for a in starving)
        return verdict.say(
            True, f"serves {len(served)} waiting job(s), one waited {oldest:.0f} s (bound {cost.max_wait_s:g} s): "
            f"{figures}", forced=True,
        )  # fmt: skip
    ratio = settings.gain_ratio
    if committed:
        if switch * ratio + _TIE < stay:
            return verdict.say(False, f"staying is better now ({figures})")
        return verdict.say(True, f"serves {len(served)} waiting job(s): {figures}")
    if switch < ratio * stay + _TIE or switch <= 0:
        return verdict.say(False, f"not worth closing the node yet ({figures})")
    if busy and last_change_s is not None and now_s - last_change_s < cost.min_interval_s:
        left_s = cost.min_interval_s - (now_s - last_change_s)
        return verdict.say(
            False,
            f"batching: the last change that closed the node was {now_s - last_change_s:.0f} s ago, next one in "
            f"{left_s:.0f} s ({figures})",
        )
    return verdict.say(True, f"serves {len(served)} waiting job(s): {figures}")


@dataclass(frozen=True, slots=True)
class _Say:
    drain: float
    gain: float
    cost: float
    served: tuple[str, ...]
    close_by: float | None

    def say(self, go: bool, reason: str, *, forced: bool = False) -> Verdict:
        return Verdict(go, self.drain, self.gain, self.cost, reason, self.served, self.close_by, forced)
