"""The detection step: (previous state, one observation of the node) -> (new state, report of transitions).

Pure and deterministic: time comes in with the observation, and the state is an immutable value the caller keeps
between sweeps. The first observation sets the baseline: instances already present are not reported as created.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from types import MappingProxyType

from flexmig.detect.capacity import RepackKey, repack_key
from flexmig.detect.demand import DemandMix
from flexmig.detect.findings import (
    EndedFinding,
    Finding,
    FindingKey,
    FragmentationFinding,
    InstanceChange,
    OversizedFinding,
    UnderuseFinding,
)
from flexmig.detect.fragmentation import (
    GpuFragmentation,
    NodeFragmentation,
    extend_memo,
    gpu_fragmentation,
    node_fragmentation,
)
from flexmig.detect.hysteresis import Signal, Switch, step
from flexmig.detect.internal import InternalFragmentation, internal_fragmentation, smaller_profiles
from flexmig.detect.settings import DetectSettings, FragmentationSettings, UnderuseSettings
from flexmig.detect.usage import InstanceKey, InstanceUsage
from flexmig.mig import Layout, Profile

__all__ = ["DetectState", "LastSweep", "Observation", "Report", "observe", "underuse_signal"]

_EMPTY: Mapping[object, object] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Observation:
    """One sweep of the node as detection needs it.

    ``layouts``: the layout of every GPU with MIG enabled, by GPU index; ``usage``: the latest telemetry window of
    each instance (any subset); ``lost_gpus``: GPUs NVML reports as lost; ``demand``: the request mix (None: the
    configured one); ``uuids``: the MIG device UUID of the instance at (GPU, start), where known. With UUIDs, an
    instance destroyed and another created at the same place between two sweeps are told apart even when both
    have the same profile.
    """

    now: float
    layouts: Mapping[int, Layout]
    usage: tuple[InstanceUsage, ...] = ()
    lost_gpus: frozenset[int] = frozenset()
    demand: DemandMix | None = None
    uuids: Mapping[tuple[int, int], str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class DetectState:
    """What detection remembers between sweeps. Start from ``DetectState()``."""

    layouts: Mapping[int, Layout] | None = None
    lost: frozenset[int] = frozenset()
    switches: Mapping[FindingKey, Switch] = field(default_factory=lambda: MappingProxyType({}))
    active: Mapping[FindingKey, Finding] = field(default_factory=lambda: MappingProxyType({}))
    last_seen: Mapping[InstanceKey, float] = field(default_factory=lambda: MappingProxyType({}))
    memo: Mapping[RepackKey, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    uuids: Mapping[tuple[int, int], str] = field(default_factory=lambda: MappingProxyType({}))
    """The UUIDs of the instances of ``layouts``, so a destroyed instance is reported with its own."""
    instance_changes: Mapping[tuple[int, str], int] = field(default_factory=lambda: MappingProxyType({}))
    """Instances created and destroyed since the first observation, by (GPU, ``created``/``destroyed``)."""
    last: LastSweep | None = None
    """The last sweep judged, and until when time alone cannot change its verdict (see :class:`LastSweep`)."""


@dataclass(frozen=True, slots=True)
class LastSweep:
    """The last observation judged, what it was judged with, and its report; when time alone can change the verdict.

    An observation equal to ``observation`` but for the time (the same layouts, UUIDs, lost GPUs and demand, and
    windows with the same figures) reads as the same signals. While every remembered instance is seen and no switch
    has come to the end of its pending run (``until``: the earliest time one can flip; infinite when none is pending)
    with no gap in the sweeps longer than a switch allows (``max_gap``), judging it again could only move the
    switches' ``last_at``: :func:`observe` gives the same report at the new time instead. ``judged_at``: when the
    switches were last stepped in full (a later full judgement first brings their ``last_at`` to the time of the
    last sweep, as judging each sweep would have).
    """

    observation: Observation
    settings: DetectSettings
    report: Report
    judged_at: float
    until: float
    max_gap: float


@dataclass(frozen=True, slots=True)
class Report:
    """What one sweep found: current figures, active findings, and the transitions since the previous sweep."""

    now: float
    fragmentation: NodeFragmentation
    internal: tuple[InternalFragmentation, ...]
    active: tuple[Finding, ...]
    started: tuple[Finding, ...]
    ended: tuple[EndedFinding, ...]
    created: tuple[InstanceChange, ...]
    destroyed: tuple[InstanceChange, ...]
    lost: tuple[int, ...]
    """GPUs newly reported lost."""
    ignored: tuple[str, ...]
    """Telemetry windows that matched no instance of the layouts, in words (stale or misattributed samples)."""
    instance_changes: Mapping[tuple[int, str], int] = field(default_factory=lambda: MappingProxyType({}))
    """Instances created and destroyed since the first observation, by (GPU, ``created``/``destroyed``): every
    change of a layout counts, whoever made it."""


def underuse_signal(usage: InstanceUsage, settings: UnderuseSettings) -> Signal:
    """How one window reads for underuse (see ``UnderuseSettings`` for the rule)."""
    if usage.processes == 0:
        return Signal.ON
    activity = usage.activity
    memory = usage.memory_ratio
    if (activity is not None and activity > settings.activity_exit) or (
        memory is not None and memory > settings.memory_exit
    ):
        return Signal.OFF
    if activity is None:
        # A job whose activity nobody can see (Ampere without DCGM) is never called underused.
        return Signal.OFF if usage.processes else Signal.HOLD
    if activity <= settings.activity_enter and memory is not None and memory <= settings.memory_enter:
        return Signal.ON
    return Signal.HOLD


def _fmt_ratio(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.0%}"


def _underuse_finding(u: InstanceUsage, since: float, s: UnderuseSettings) -> UnderuseFinding:
    level = "idle" if u.processes == 0 else "underused"
    minutes = s.enter_after_s / 60
    if level == "idle":
        reason = f"no process ran on {u.profile} at GPU {u.gpu} slice {u.start} for {minutes:g} min"
    else:
        reason = (
            f"{u.profile} at GPU {u.gpu} slice {u.start} stayed at or below {s.activity_enter:.0%} activity "
            f"and {s.memory_enter:.0%} memory for {minutes:g} min "
            f"(now {_fmt_ratio(u.activity)} activity, {_fmt_ratio(u.memory_ratio)} memory)"
        )
    return UnderuseFinding(
        u.gpu, u.start, u.profile, u.uuid, level, since, u.activity, u.memory_ratio, u.processes, reason
    )


def _oversized_finding(u: InstanceUsage, smaller: Profile, since: float, s: UnderuseSettings) -> OversizedFinding:
    activity = u.activity if u.activity is not None else 0.0
    used = u.memory_used_bytes or 0
    reason = (
        f"the job on {u.profile} at GPU {u.gpu} slice {u.start} uses {activity:.0%} of its SMs (p95) and "
        f"{used / 2**30:.1f} GiB; {smaller.name} would hold it with {s.oversize_margin:.0%} headroom"
    )
    return OversizedFinding(u.gpu, u.start, u.profile, u.uuid, smaller.name, since, activity, used, reason)


def _fragmentation_finding(g: GpuFragmentation, since: float, s: FragmentationSettings) -> FragmentationFinding:
    best = g.recoverable
    gain = "" if best is None else f" by {best.stranded} more {best.profile}"
    reason = (
        f"{g.reason()}: {g.recoverable_compute_slices} of {g.compute_slices} compute slices usable{gain}, a profile "
        f"the demand mix asks for (recoverable {g.recoverable_score:.2f} >= {s.enter:.2f})"
    )
    return FragmentationFinding(
        g.gpu,
        g.model,
        g.layout,
        since,
        g.recoverable_score,
        s.enter,
        g.free_compute_slices,
        g.stranded_compute_slices,
        g.unfit,
        reason,
        g.recoverable_compute_slices,
        None if best is None else best.profile,
    )


def _in_use_again(u: InstanceUsage) -> str:
    return (
        f"{u.profile} at GPU {u.gpu} slice {u.start} is in use again "
        f"({_fmt_ratio(u.activity)} activity, {_fmt_ratio(u.memory_ratio)} memory)"
    )


def _fits_no_smaller(u: InstanceUsage) -> str:
    return f"the job on {u.profile} at GPU {u.gpu} slice {u.start} no longer fits a smaller profile"


def _repack_too_small(g: GpuFragmentation, s: FragmentationSettings) -> str:
    return (
        f"GPU {g.gpu}: repacking would make only {g.recoverable_compute_slices} compute slice(s) usable "
        f"(recoverable {g.recoverable_score:.2f} <= {s.exit:.2f})"
    )


def _instances(layout: Layout | None) -> dict[int, str]:
    return {} if layout is None else {i.start: i.profile.name for i in layout}


def _changes(
    gpu: int,
    before: Layout | None,
    after: Layout | None,
    old: Mapping[tuple[int, int], str],
    new: Mapping[tuple[int, int], str],
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(destroyed, created) ``(start, profile)`` pairs of one GPU: an instance whose start or profile changed, or
    whose UUID changed where both observations know it (destroyed and created again in between)."""
    if before is not None and before is after:  # the same layout (observations share unchanged ones): UUIDs alone
        renewed = []
        for inst in before:
            ua, ub = old.get((gpu, inst.start)), new.get((gpu, inst.start))
            if ua is not None and ub is not None and ua != ub:
                renewed.append((inst.start, inst.profile.name))
        return renewed, list(renewed)
    was, now = _instances(before), _instances(after)
    destroyed, created = [], []
    for start in sorted(set(was) | set(now)):
        a, b = was.get(start), now.get(start)
        ua, ub = old.get((gpu, start)), new.get((gpu, start))
        same = a == b and (ua is None or ub is None or ua == ub)
        if a is not None and not same:
            destroyed.append((start, a))
        if b is not None and not same:
            created.append((start, b))
    return destroyed, created


class _Sweep:
    """The mutable working copy of one :func:`observe` call: switches, active findings, last windows seen, and the
    transitions found so far. Private to one call, frozen into a :class:`DetectState` and a :class:`Report` at
    its end."""

    def __init__(self, state: DetectState, now: float) -> None:
        self.now = now
        self.switches: dict[FindingKey, Switch] = dict(state.switches)
        self.active: dict[FindingKey, Finding] = dict(state.active)
        self.last_seen: dict[InstanceKey, float] = dict(state.last_seen)
        self.started: list[Finding] = []
        self.ended: list[EndedFinding] = []

    def end(self, key: FindingKey, reason: str) -> None:
        """Forget the switch ``key``; its finding, if active, ends for ``reason``."""
        self.switches.pop(key, None)
        finding = self.active.pop(key, None)
        if finding is not None:
            self.ended.append(EndedFinding(finding, self.now, reason))

    def end_instance(self, key: InstanceKey, reason: str) -> None:
        """End the findings of one instance and forget it."""
        for kind in ("underuse", "oversized"):
            self.end((kind, *key), reason)
        self.last_seen.pop(key, None)

    def flip(
        self, key: FindingKey, signal: Signal, window: tuple[float, float], limits: tuple[float, float, float]
    ) -> Switch | None:
        """One window of the switch ``key`` (``limits``: on after, off after, longest gap); the switch when it
        flipped, else None. What a flip starts or ends is the caller's (see :meth:`begin`, :meth:`end`): built only
        when it happens, not at every window."""
        on_after, off_after, max_gap = limits
        sw = self.switches.get(key)
        sw, flipped = step(
            Switch() if sw is None else sw,  # a new one only for a switch never stepped
            signal,
            *window,
            on_after=on_after,
            off_after=off_after,
            max_gap=max_gap,
        )
        self.switches[key] = sw
        return sw if flipped else None

    def begin(self, key: FindingKey, finding: Finding | None) -> None:
        """The finding of the switch ``key``, which just turned on, starts (None: none does)."""
        if finding is not None:
            self.active[key] = finding
            self.started.append(finding)

    def step(
        self,
        key: FindingKey,
        signal: Signal,
        window: tuple[float, float],
        *,
        limits: tuple[float, float, float],
        start: Callable[[float], Finding | None],
        ended: Callable[[], str],
    ) -> None:
        """:meth:`flip`, then: when it turns on, the finding ``start(since)`` starts (None: none does); when it
        turns off, the active one ends for ``ended()``."""
        sw = self.flip(key, signal, window, limits)
        if sw is not None and sw.on:
            self.begin(key, start(sw.since or window[1]))
        elif sw is not None:
            self.end(key, ended())


def observe(state: DetectState, obs: Observation, settings: DetectSettings) -> tuple[DetectState, Report]:
    """Run detection on one observation; returns the state for the next sweep and this sweep's report.

    An observation that differs from the last one only in time, before any pending switch can flip, is not judged
    again (:class:`LastSweep`): its report is the last one at the new time, with no transitions.
    """
    last = state.last
    if (
        last is not None
        and obs.now < last.until
        and obs.now - last.observation.now <= last.max_gap
        and last.settings == settings
        and _same_but_time(last.observation, obs)
    ):
        return _unchanged(state, last, obs)
    if last is not None and last.observation.now != last.judged_at:
        state = _caught_up(state, last)
    memo = extend_memo(state.memo, obs.layouts)
    frag = _node_fragmentation(state, obs, obs.demand or DemandMix(settings.fragmentation.demand), memo)
    sweep = _Sweep(state, obs.now)
    newly_lost = _lost_gpus(sweep, state, obs)  # 1. GPUs lost,
    destroyed, created = _instance_changes(sweep, state, obs)  # instances created and destroyed
    internal, ignored = _windows(sweep, obs, settings.underuse)  # 2. underuse, oversize, internal fragmentation
    _forget_silent(sweep, settings.underuse)  # 3. instances no longer reported
    _fragmentation(sweep, frag, obs, settings.fragmentation)  # 4. fragmentation per GPU
    new_state = _next_state(sweep, state, obs, memo, (destroyed, created))
    report = Report(
        now=obs.now,
        fragmentation=frag,
        internal=tuple(internal),
        active=tuple(sweep.active[k] for k in sorted(sweep.active)),
        started=tuple(sweep.started),
        ended=tuple(sweep.ended),
        created=tuple(created),
        destroyed=tuple(destroyed),
        lost=newly_lost,
        ignored=tuple(ignored),
        instance_changes=new_state.instance_changes,
    )
    until, max_gap = _next_flip(sweep, settings)
    return replace(new_state, last=LastSweep(obs, settings, report, obs.now, until, max_gap)), report


def _next_flip(sweep: _Sweep, settings: DetectSettings) -> tuple[float, float]:
    """(the earliest time a pending switch can flip, the shortest gap a pending switch allows): both infinite when
    no switch is pending; ``-inf`` when an instance remembered was not seen (time alone may forget it)."""
    if any(seen != sweep.now for seen in sweep.last_seen.values()):
        return -math.inf, 0.0
    us, fs = settings.underuse, settings.fragmentation
    until = max_gap = math.inf
    for key, sw in sweep.switches.items():
        if sw.pending_since is None:
            continue
        if key[0] == "fragmentation":
            after, gap = (fs.exit_after_s if sw.on else fs.enter_after_s), math.inf
        else:
            enter = us.oversize_after_s if key[0] == "oversized" else us.enter_after_s
            after, gap = (us.exit_after_s if sw.on else enter), us.max_gap_s
        until = min(until, sw.pending_since + after)
        max_gap = min(max_gap, gap)
    return until, max_gap


def _caught_up(state: DetectState, last: LastSweep) -> DetectState:
    """``state`` as if the sweeps answered without judging had been judged: the switches stepped then end their last
    window at the last sweep's time."""
    at, now = last.judged_at, last.observation.now
    switches = {k: (replace(sw, last_at=now) if sw.last_at == at else sw) for k, sw in state.switches.items()}
    return replace(state, switches=MappingProxyType(switches))


def _usage_figures(u: InstanceUsage) -> tuple[object, ...]:
    """What detection judges of a window, its time left out."""
    return (
        u.gpu, u.start, u.profile, u.activity_mean, u.activity_p95, u.memory_used_bytes, u.memory_total_bytes,
        u.processes, u.uuid,
    )  # fmt: skip


def _same_but_time(a: Observation, b: Observation) -> bool:
    """Whether two observations differ at most in time (``now``, and each window's end and length)."""
    return (
        a.layouts == b.layouts
        and a.lost_gpus == b.lost_gpus
        and a.demand == b.demand
        and a.uuids == b.uuids
        and len(a.usage) == len(b.usage)
        and all(_usage_figures(x) == _usage_figures(y) for x, y in zip(a.usage, b.usage, strict=True))
    )


def _unchanged(state: DetectState, last: LastSweep, obs: Observation) -> tuple[DetectState, Report]:
    """The state and report of an observation that reads as ``last`` did: the same findings at ``obs.now``.

    Every switch keeps its state (its ``last_at`` is brought up to date by the next full judgement: ``_caught_up``);
    the instances are seen now.
    """
    report = replace(last.report, now=obs.now, started=(), ended=(), created=(), destroyed=(), lost=())
    seen = MappingProxyType(dict.fromkeys(state.last_seen, obs.now))
    return replace(state, last_seen=seen, last=replace(last, observation=obs, report=report)), report


def _node_fragmentation(
    state: DetectState,
    obs: Observation,
    demand: DemandMix,
    memo: Mapping[RepackKey, Mapping[str, int]],
) -> NodeFragmentation:
    """The node's fragmentation; a GPU whose layout and demand mix are those of the last sweep keeps its figures."""
    last = state.last
    if last is None or (last.observation.demand or DemandMix(last.settings.fragmentation.demand)) != demand:
        return node_fragmentation(obs.layouts, demand, memo)
    before = {g.gpu: g for g in last.report.fragmentation.gpus}
    old = last.observation.layouts
    gpus = []
    for index in sorted(obs.layouts):
        layout = obs.layouts[index]
        kept = before.get(index)
        if kept is not None and old.get(index) == layout:
            gpus.append(kept)
        else:
            gpus.append(gpu_fragmentation(index, layout, demand, memo.get(repack_key(layout))))
    return NodeFragmentation(tuple(gpus))


def _lost_gpus(sweep: _Sweep, state: DetectState, obs: Observation) -> tuple[int, ...]:
    """The GPUs lost since the last sweep; their findings end and their instances are forgotten."""
    newly_lost = tuple(sorted(obs.lost_gpus - state.lost))
    for gpu in newly_lost:
        for key in [k for k in sweep.switches if k[1] == gpu]:
            sweep.end(key, f"GPU {gpu} is lost")
        for ikey in [k for k in sweep.last_seen if k[0] == gpu]:
            sweep.last_seen.pop(ikey)
    return newly_lost


def _instance_changes(
    sweep: _Sweep, state: DetectState, obs: Observation
) -> tuple[list[InstanceChange], list[InstanceChange]]:
    """(destroyed, created) since the last sweep (none at the first: it sets the baseline); a destroyed instance's
    findings end."""
    destroyed: list[InstanceChange] = []
    created: list[InstanceChange] = []
    if state.layouts is None:
        return destroyed, created
    previous, now = state.layouts, obs.now
    for gpu in sorted(set(previous) | set(obs.layouts)):
        if gpu in obs.lost_gpus:
            continue  # what a lost GPU holds is unknown; its last layout is kept until it comes back
        gone, new = _changes(gpu, previous.get(gpu), obs.layouts.get(gpu), state.uuids, obs.uuids)
        for start, name in gone:
            destroyed.append(InstanceChange(gpu, start, name, now, state.uuids.get((gpu, start))))
            sweep.end_instance((gpu, start), f"instance {name} at GPU {gpu} slice {start} was destroyed")
        created.extend(InstanceChange(gpu, start, name, now, obs.uuids.get((gpu, start))) for start, name in new)
    return destroyed, created


def _windows(sweep: _Sweep, obs: Observation, us: UnderuseSettings) -> tuple[list[InternalFragmentation], list[str]]:
    """Each telemetry window that matches an instance: its internal fragmentation, and a step of its underuse and
    oversize switches. Returns the internal fragmentation and the windows ignored, in words."""
    internal: list[InternalFragmentation] = []
    ignored: list[str] = []
    under = (us.enter_after_s, us.exit_after_s, us.max_gap_s)
    oversize = (us.oversize_after_s, us.exit_after_s, us.max_gap_s)
    for u in sorted(obs.usage, key=lambda w: w.key):
        layout = obs.layouts.get(u.gpu)
        inst = layout.at(u.start) if layout is not None and u.gpu not in obs.lost_gpus else None
        if layout is None or inst is None or inst.profile.name != u.profile:
            ignored.append(f"window for {u.profile} at GPU {u.gpu} slice {u.start} matches no current instance")
            continue
        internal.append(internal_fragmentation(u, inst.profile))
        sweep.last_seen[u.key] = u.at
        window = (u.since, u.at)
        key: FindingKey = ("underuse", u.gpu, u.start)
        sw = sweep.flip(key, underuse_signal(u, us), window, under)
        if sw is not None and sw.on:
            sweep.begin(key, _underuse_finding(u, sw.since or window[1], s=us))
        elif sw is not None:
            sweep.end(key, _in_use_again(u))
        smaller, fits_smaller = smaller_profiles(u, layout.model, inst.profile, us.oversize_margin)
        if smaller is not None:
            signal = Signal.ON
        elif fits_smaller is not None:
            signal = Signal.HOLD
        else:
            signal = Signal.OFF
        key = ("oversized", u.gpu, u.start)
        sw = sweep.flip(key, signal, window, oversize)
        if sw is not None and sw.on:  # a switch turned on while nothing smaller fits starts no finding
            sweep.begin(key, None if smaller is None else _oversized_finding(u, smaller, sw.since or window[1], s=us))
        elif sw is not None:
            sweep.end(key, _fits_no_smaller(u))
    return internal, ignored


def _forget_silent(sweep: _Sweep, us: UnderuseSettings) -> None:
    """End the findings of instances with no telemetry for ``forget_after_s``."""
    now = sweep.now
    for ikey, seen in list(sweep.last_seen.items()):
        if now - seen > us.forget_after_s:
            sweep.end_instance(ikey, f"no telemetry for GPU {ikey[0]} slice {ikey[1]} for {now - seen:.0f} s")


def _fragmentation(sweep: _Sweep, frag: NodeFragmentation, obs: Observation, fs: FragmentationSettings) -> None:
    """A step of each GPU's fragmentation switch; a GPU without MIG any more ends its finding."""
    by_gpu = {g.gpu: g for g in frag.gpus}
    for key in [k for k in sweep.switches if k[0] == "fragmentation" and k[1] not in by_gpu]:
        sweep.end(key, f"GPU {key[1]} no longer has MIG enabled")
    now = sweep.now
    for g in frag.gpus:
        if g.gpu in obs.lost_gpus:
            continue
        score = g.recoverable_score
        signal = Signal.ON if score >= fs.enter else Signal.OFF if score <= fs.exit else Signal.HOLD
        # Layouts are read at instants: a condition has held since the first sweep that saw it.
        sweep.step(
            ("fragmentation", g.gpu, -1),
            signal,
            (now, now),
            limits=(fs.enter_after_s, fs.exit_after_s, math.inf),
            start=partial(_fragmentation_finding, g, s=fs),
            ended=partial(_repack_too_small, g, fs),
        )


def _next_state(
    sweep: _Sweep,
    state: DetectState,
    obs: Observation,
    memo: Mapping[RepackKey, Mapping[str, int]],
    changed: tuple[list[InstanceChange], list[InstanceChange]],
) -> DetectState:
    """What the next sweep starts from (``changed``: this sweep's destroyed and created instances, counted); a lost
    GPU keeps its last layout and UUIDs until it comes back."""
    changes = dict(state.instance_changes)
    for kind, items in zip(("destroyed", "created"), changed, strict=True):
        for c in items:
            changes[(c.gpu, kind)] = changes.get((c.gpu, kind), 0) + 1
    previous = dict(state.layouts or {})
    layouts = {g: lay for g, lay in previous.items() if g in obs.lost_gpus}
    layouts.update({g: lay for g, lay in obs.layouts.items() if g not in obs.lost_gpus})
    uuids = {k: u for k, u in state.uuids.items() if k[0] in obs.lost_gpus}
    uuids.update({k: u for k, u in obs.uuids.items() if k[0] not in obs.lost_gpus})
    return DetectState(
        instance_changes=MappingProxyType(changes),
        uuids=MappingProxyType(uuids),
        layouts=MappingProxyType(layouts),
        lost=frozenset(obs.lost_gpus),
        switches=MappingProxyType(sweep.switches),
        active=MappingProxyType(sweep.active),
        last_seen=MappingProxyType(sweep.last_seen),
        memo=memo,
    )
