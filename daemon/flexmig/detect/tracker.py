"""The detection step: (previous state, one observation of the node) -> (new state, report of transitions).

Pure and deterministic: time comes in with the observation, and the state is an immutable value the caller keeps
between sweeps. The first observation sets the baseline: instances already present are not reported as created.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from flexmig.detect.capacity import RepackKey
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
from flexmig.detect.fragmentation import GpuFragmentation, NodeFragmentation, extend_memo, node_fragmentation
from flexmig.detect.hysteresis import Signal, Switch, step
from flexmig.detect.internal import InternalFragmentation, internal_fragmentation, smaller_profile
from flexmig.detect.settings import DetectSettings, FragmentationSettings, UnderuseSettings
from flexmig.detect.usage import InstanceKey, InstanceUsage
from flexmig.mig import Layout, Profile

__all__ = ["DetectState", "Observation", "Report", "observe", "underuse_signal"]

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


def observe(state: DetectState, obs: Observation, settings: DetectSettings) -> tuple[DetectState, Report]:
    """Run detection on one observation; returns the state for the next sweep and this sweep's report."""
    us, fs = settings.underuse, settings.fragmentation
    now = obs.now
    memo = extend_memo(state.memo, obs.layouts)
    demand = obs.demand or DemandMix(fs.demand)
    frag = node_fragmentation(obs.layouts, demand, memo)

    switches: dict[FindingKey, Switch] = dict(state.switches)
    active: dict[FindingKey, Finding] = dict(state.active)
    last_seen: dict[InstanceKey, float] = dict(state.last_seen)
    started: list[Finding] = []
    ended: list[EndedFinding] = []

    def end(key: FindingKey, reason: str) -> None:
        switches.pop(key, None)
        finding = active.pop(key, None)
        if finding is not None:
            ended.append(EndedFinding(finding, now, reason))

    def end_instance(key: InstanceKey, reason: str) -> None:
        for kind in ("underuse", "oversized"):
            end((kind, *key), reason)
        last_seen.pop(key, None)

    # 1. GPUs lost, instances created and destroyed.
    newly_lost = tuple(sorted(obs.lost_gpus - state.lost))
    for gpu in newly_lost:
        for key in [k for k in switches if k[1] == gpu]:
            end(key, f"GPU {gpu} is lost")
        for ikey in [k for k in last_seen if k[0] == gpu]:
            last_seen.pop(ikey)
    created: list[InstanceChange] = []
    destroyed: list[InstanceChange] = []
    previous = dict(state.layouts or {})
    merged: dict[int, Layout] = {g: lay for g, lay in previous.items() if g in obs.lost_gpus}
    merged.update({g: lay for g, lay in obs.layouts.items() if g not in obs.lost_gpus})
    if state.layouts is not None:
        for gpu in sorted(set(previous) | set(obs.layouts)):
            if gpu in obs.lost_gpus:
                continue  # what a lost GPU holds is unknown; its last layout is kept until it comes back
            gone, new = _changes(gpu, previous.get(gpu), obs.layouts.get(gpu), state.uuids, obs.uuids)
            for start, name in gone:
                destroyed.append(InstanceChange(gpu, start, name, now, state.uuids.get((gpu, start))))
                end_instance((gpu, start), f"instance {name} at GPU {gpu} slice {start} was destroyed")
            created.extend(InstanceChange(gpu, start, name, now, obs.uuids.get((gpu, start))) for start, name in new)

    # 2. Telemetry windows: underuse, oversize, internal fragmentation.
    internal: list[InternalFragmentation] = []
    ignored: list[str] = []
    for u in sorted(obs.usage, key=lambda w: w.key):
        layout = obs.layouts.get(u.gpu)
        inst = layout.at(u.start) if layout is not None and u.gpu not in obs.lost_gpus else None
        if inst is None or inst.profile.name != u.profile:
            ignored.append(f"window for {u.profile} at GPU {u.gpu} slice {u.start} matches no current instance")
            continue
        assert layout is not None
        internal.append(internal_fragmentation(u, inst.profile))
        last_seen[u.key] = u.at
        key_u: FindingKey = ("underuse", u.gpu, u.start)
        sw, flipped = step(
            switches.get(key_u, Switch()),
            underuse_signal(u, us),
            u.since,
            u.at,
            on_after=us.enter_after_s,
            off_after=us.exit_after_s,
            max_gap=us.max_gap_s,
        )
        switches[key_u] = sw
        if flipped and sw.on:
            finding = _underuse_finding(u, sw.since or u.at, us)
            active[key_u] = finding
            started.append(finding)
        elif flipped:
            end(
                key_u,
                f"{u.profile} at GPU {u.gpu} slice {u.start} is in use again "
                f"({_fmt_ratio(u.activity)} activity, {_fmt_ratio(u.memory_ratio)} memory)",
            )
        key_o: FindingKey = ("oversized", u.gpu, u.start)
        smaller = smaller_profile(u, layout.model, inst.profile, us.oversize_margin)
        if smaller is not None:
            signal = Signal.ON
        elif smaller_profile(u, layout.model, inst.profile, 0.0) is not None:
            signal = Signal.HOLD
        else:
            signal = Signal.OFF
        sw, flipped = step(
            switches.get(key_o, Switch()),
            signal,
            u.since,
            u.at,
            on_after=us.oversize_after_s,
            off_after=us.exit_after_s,
            max_gap=us.max_gap_s,
        )
        switches[key_o] = sw
        if flipped and sw.on and smaller is not None:
            finding_o = _oversized_finding(u, smaller, sw.since or u.at, us)
            active[key_o] = finding_o
            started.append(finding_o)
        elif flipped and not sw.on:
            end(key_o, f"the job on {u.profile} at GPU {u.gpu} slice {u.start} no longer fits a smaller profile")

    # 3. Instances no longer reported.
    for ikey, seen in list(last_seen.items()):
        if now - seen > us.forget_after_s:
            end_instance(ikey, f"no telemetry for GPU {ikey[0]} slice {ikey[1]} for {now - seen:.0f} s")

    # 4. Fragmentation per GPU.
    by_gpu = {g.gpu: g for g in frag.gpus}
    for key in [k for k in switches if k[0] == "fragmentation" and k[1] not in by_gpu]:
        end(key, f"GPU {key[1]} no longer has MIG enabled")
    for g in frag.gpus:
        if g.gpu in obs.lost_gpus:
            continue
        key_f: FindingKey = ("fragmentation", g.gpu, -1)
        score = g.recoverable_score
        signal = Signal.ON if score >= fs.enter else Signal.OFF if score <= fs.exit else Signal.HOLD
        # Layouts are read at instants: a condition has held since the first sweep that saw it.
        sw, flipped = step(
            switches.get(key_f, Switch()),
            signal,
            now,
            now,
            on_after=fs.enter_after_s,
            off_after=fs.exit_after_s,
            max_gap=math.inf,
        )
        switches[key_f] = sw
        if flipped and sw.on:
            finding_f = _fragmentation_finding(g, now, fs)
            active[key_f] = finding_f
            started.append(finding_f)
        elif flipped:
            end(
                key_f,
                f"GPU {g.gpu}: repacking would make only {g.recoverable_compute_slices} compute slice(s) usable "
                f"(recoverable {score:.2f} <= {fs.exit:.2f})",
            )

    changes = dict(state.instance_changes)
    for kind, items in (("destroyed", destroyed), ("created", created)):
        for c in items:
            changes[(c.gpu, kind)] = changes.get((c.gpu, kind), 0) + 1
    uuids = {k: u for k, u in state.uuids.items() if k[0] in obs.lost_gpus}  # a lost GPU's, as its layout
    uuids.update({k: u for k, u in obs.uuids.items() if k[0] not in obs.lost_gpus})
    new_state = DetectState(
        instance_changes=MappingProxyType(changes),
        uuids=MappingProxyType(uuids),
        layouts=MappingProxyType(merged),
        lost=frozenset(obs.lost_gpus),
        switches=MappingProxyType(switches),
        active=MappingProxyType(active),
        last_seen=MappingProxyType(last_seen),
        memo=memo,
    )
    report = Report(
        now=now,
        fragmentation=frag,
        internal=tuple(internal),
        active=tuple(active[k] for k in sorted(active)),
        started=tuple(started),
        ended=tuple(ended),
        created=tuple(created),
        destroyed=tuple(destroyed),
        lost=newly_lost,
        ignored=tuple(ignored),
        instance_changes=new_state.instance_changes,
    )
    return new_state, report
