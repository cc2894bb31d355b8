"""Underuse, oversized jobs, internal fragmentation and the hysteresis that keeps findings from flapping."""

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.detect import (
    DetectSettings,
    DetectState,
    Finding,
    InstanceUsage,
    Observation,
    OversizedFinding,
    Signal,
    Switch,
    UnderuseFinding,
    UnderuseSettings,
    internal_fragmentation,
    observe,
    smaller_profile,
    smaller_profiles,
    underuse_signal,
)
from flexmig.detect.hysteresis import step
from flexmig.detect.tracker import Report
from flexmig.mig import H200, Layout, Profile

GIB = 2**30
P3G = H200.profile("3g.71gb")
LAYOUT = Layout.of(H200, [("3g.71gb", 0), ("2g.35gb", 4)])
US = UnderuseSettings(enter_after_s=300, exit_after_s=60, oversize_after_s=300, max_gap_s=120, forget_after_s=120)
SETTINGS = DetectSettings(underuse=US)


def usage(
    at: float,
    activity: float | None = 0.5,
    used_gib: float | None = 30.0,
    processes: int = 1,
    start: int = 0,
    profile: str = "3g.71gb",
    window: float = 30.0,
    total_gib: float = 69.5,
) -> InstanceUsage:
    return InstanceUsage(
        gpu=0,
        start=start,
        profile=profile,
        at=at,
        window_s=window,
        activity_mean=activity,
        activity_p95=activity,
        memory_used_bytes=None if used_gib is None else int(used_gib * GIB),
        memory_total_bytes=int(total_gib * GIB),
        processes=processes,
    )


def instance_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    return tuple(f for f in findings if type(f).__name__ != "FragmentationFinding")


def run(
    windows: Iterable[InstanceUsage],
    layout: Layout = LAYOUT,
    settings_: DetectSettings = SETTINGS,
    kind: str = "UnderuseFinding",
) -> tuple[list[tuple[float, str, str]], DetectState, Report]:
    """Feed windows one sweep each; return every (time, started/ended, type) transition of findings of `kind`."""
    state = DetectState()
    out: list[tuple[float, str, str]] = []
    for w in windows:
        state, report = observe(state, Observation(now=w.at, layouts={0: layout}, usage=(w,)), settings_)
        out.extend((w.at, "started", kind) for f in report.started if type(f).__name__ == kind)
        out.extend((w.at, "ended", kind) for e in report.ended if type(e.finding).__name__ == kind)
    return out, state, report


# ------------------------------------------------------------------------------------------------ the signal
def test_an_instance_without_processes_reads_idle() -> None:
    assert underuse_signal(usage(0, activity=None, used_gib=None, processes=0), US) is Signal.ON


def test_low_activity_and_low_memory_read_underused() -> None:
    assert underuse_signal(usage(0, activity=0.02, used_gib=3.0), US) is Signal.ON


def test_high_activity_or_high_memory_reads_in_use() -> None:
    assert underuse_signal(usage(0, activity=0.5, used_gib=1.0), US) is Signal.OFF
    assert underuse_signal(usage(0, activity=0.01, used_gib=40.0), US) is Signal.OFF


def test_between_the_thresholds_changes_nothing() -> None:
    assert underuse_signal(usage(0, activity=0.10, used_gib=3.0), US) is Signal.HOLD


def test_a_job_whose_activity_is_unknown_is_never_called_underused() -> None:
    assert underuse_signal(usage(0, activity=None, used_gib=1.0), US) is Signal.OFF


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="activity_enter <= activity_exit"):
        UnderuseSettings(activity_enter=0.3, activity_exit=0.1)


# ------------------------------------------------------------------------------------------------ hysteresis
def test_underuse_starts_only_after_low_held_for_the_entry_window() -> None:
    windows = [usage(t, activity=0.01, used_gib=2.0) for t in range(30, 331, 30)]
    transitions, _, report = run(windows)
    # first window covers (0, 30]; low has held 300 s at t=300
    assert transitions == [(300, "started", "UnderuseFinding")]
    (finding,) = [f for f in report.active if type(f).__name__ == "UnderuseFinding"]
    assert isinstance(finding, UnderuseFinding)
    assert finding.level == "underused"
    assert "stayed at or below 5% activity" in finding.reason


def test_a_single_busy_window_restarts_the_entry_count() -> None:
    low = [usage(t, activity=0.01, used_gib=2.0) for t in range(30, 241, 30)]
    busy = [usage(270, activity=0.9)]
    low2 = [usage(t, activity=0.01, used_gib=2.0) for t in range(300, 601, 30)]
    transitions, _, _ = run(low + busy + low2)
    assert transitions == [(570, "started", "UnderuseFinding")]  # 300 s after the busy window ended at 270


def test_underuse_ends_only_after_use_held_for_the_exit_window() -> None:
    low = [usage(t, activity=0.0, used_gib=1.0, processes=0) for t in range(30, 301, 30)]
    busy = [usage(t, activity=0.8) for t in range(330, 421, 30)]
    transitions, _, _ = run(low + busy)
    assert transitions == [(300, "started", "UnderuseFinding"), (360, "ended", "UnderuseFinding")]


def test_hovering_between_the_thresholds_never_flaps() -> None:
    low = [usage(t, activity=0.0, used_gib=1.0, processes=0) for t in range(30, 301, 30)]
    hover = [usage(t, activity=0.04 if (t // 30) % 2 else 0.12, used_gib=3.0) for t in range(330, 3001, 30)]
    transitions, _, _ = run(low + hover)
    assert transitions == [(300, "started", "UnderuseFinding")]


def test_a_telemetry_gap_restarts_the_entry_count() -> None:
    before = [usage(t, activity=0.01, used_gib=2.0) for t in range(30, 181, 30)]
    after = [usage(t, activity=0.01, used_gib=2.0) for t in range(600, 781, 30)]  # 420 s unseen > max_gap 120 s
    transitions, _, _ = run(before + after)
    assert transitions == []


def test_destroying_an_underused_instance_ends_its_finding() -> None:
    low = [usage(t, activity=0.0, used_gib=1.0, processes=0) for t in range(30, 301, 30)]
    state = DetectState()
    for w in low:
        state, _ = observe(state, Observation(now=w.at, layouts={0: LAYOUT}, usage=(w,)), SETTINGS)
    state, report = observe(state, Observation(now=330, layouts={0: LAYOUT.remove(0)}), SETTINGS)
    assert [e.reason for e in report.ended] == ["instance 3g.71gb at GPU 0 slice 0 was destroyed"]
    assert report.destroyed[0].profile == "3g.71gb"
    assert instance_findings(report.active) == ()


def test_an_instance_no_longer_reported_ends_its_finding_after_forget_after() -> None:
    low = [usage(t, activity=0.0, used_gib=1.0, processes=0) for t in range(30, 301, 30)]
    state = DetectState()
    for w in low:
        state, _ = observe(state, Observation(now=w.at, layouts={0: LAYOUT}, usage=(w,)), SETTINGS)
    state, report = observe(state, Observation(now=400, layouts={0: LAYOUT}), SETTINGS)
    assert report.ended == ()
    state, report = observe(state, Observation(now=430, layouts={0: LAYOUT}), SETTINGS)
    assert "no telemetry" in report.ended[0].reason


signals = st.lists(st.tuples(st.sampled_from(list(Signal)), st.floats(1.0, 50.0)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(signals, st.floats(0.0, 200.0), st.floats(0.0, 200.0))
def test_a_switch_flips_only_after_its_condition_held_unbroken_for_the_duration(
    seq: list[tuple[Signal, float]], on_after: float, off_after: float
) -> None:
    state, t = Switch(), 0.0
    history = []  # (from, to, signal)
    for signal, width in seq:
        new, flipped = step(state, signal, t, t + width, on_after=on_after, off_after=off_after, max_gap=1e9)
        history.append((t, t + width, signal))
        if flipped:
            wanted = Signal.ON if new.on else Signal.OFF
            need = on_after if new.on else off_after
            # walk back: the unbroken run of `wanted` windows ending now covers `need` seconds
            covered_from = t + width
            for w_from, _w_to, sig in reversed(history):
                if sig is not wanted:
                    break
                covered_from = w_from
            assert t + width - covered_from >= need
            assert new.on != state.on
            history = []
        else:
            assert new.on == state.on
        state = new
        t += width


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=40))
def test_alternating_faster_than_the_windows_never_flips(flags: list[bool]) -> None:
    state = Switch()
    for i, flag in enumerate(flags):
        state, flipped = step(
            state, Signal.ON if flag else Signal.OFF, i * 10.0, i * 10.0 + 10, on_after=15, off_after=15, max_gap=5
        )
        if flipped:
            assert flags[i - 1] == flag  # at least two consecutive windows (20 s >= 15 s)


# -------------------------------------------------------------------------------------- internal fragmentation
def test_internal_fragmentation_of_the_worked_example() -> None:
    inner = internal_fragmentation(usage(0, activity=0.40, used_gib=20.0), P3G)
    assert (inner.compute_held, inner.compute_needed, inner.compute_idle) == (3, 2, 1)
    assert (inner.memory_held, inner.memory_needed, inner.memory_idle) == (4, 2, 2)


def test_an_instance_without_processes_holds_everything_beyond_use() -> None:
    inner = internal_fragmentation(usage(0, activity=None, used_gib=0.5, processes=0), P3G)
    assert (inner.compute_idle, inner.memory_idle) == (3, 4)


def test_a_job_with_unknown_activity_has_unknown_compute_need() -> None:
    inner = internal_fragmentation(usage(0, activity=None, used_gib=20.0), P3G)
    assert inner.compute_idle is None
    assert inner.memory_idle == 2


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(H200.plain_profiles),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
    st.floats(0.0, 1.0),
    st.integers(0, 3),
)
def test_needed_slices_never_exceed_held_slices(
    profile: Profile, activity: float | None, mem_frac: float, procs: int
) -> None:
    total = profile.memory_mib * 2**20
    u = InstanceUsage(0, 0, profile.name, 10.0, 10.0, activity, activity, int(total * mem_frac), total, procs)
    inner = internal_fragmentation(u, profile)
    for needed, held in ((inner.compute_needed, inner.compute_held), (inner.memory_needed, inner.memory_held)):
        assert needed is None or 0 <= needed <= held
        if needed is not None and procs:
            assert needed >= 1


# ------------------------------------------------------------------------------------------------ oversized
def test_a_job_using_little_of_a_3g_fits_a_2g_with_headroom() -> None:
    smaller = smaller_profile(usage(0, activity=0.40, used_gib=20.0), H200, P3G, 0.25)
    assert smaller is not None and smaller.name == "2g.35gb"


@settings(max_examples=200, deadline=None)
@given(
    activity=st.floats(0.0, 1.0),
    used_gib=st.floats(0.0, 140.0),
    margin=st.floats(0.0, 1.0),
    profile=st.sampled_from([p.name for p in H200.profiles]),
)
def test_both_answers_of_one_pass_are_the_smallest_profiles_that_fit(
    activity: float, used_gib: float, margin: float, profile: str
) -> None:
    held = H200.profile(profile)
    u = usage(0, activity=activity, used_gib=used_gib, profile=profile)

    def smallest(m: float) -> Profile | None:  # the rule, written out: smaller in both dimensions, fits with m
        fits = [
            q for q in H200.profiles
            if q.compute_slices <= held.compute_slices and q.memory_slices <= held.memory_slices
            and (q.compute_slices, q.memory_slices) != (held.compute_slices, held.memory_slices)
            and activity * held.sm_count * (1 + m) <= q.sm_count
            and int(used_gib * GIB) * (1 + m) <= q.memory_mib * 2**20 and not q.is_media_variant
        ]  # fmt: skip
        return min(fits, key=lambda q: (q.compute_slices, q.memory_slices, q.name), default=None)

    assert smaller_profiles(u, H200, held, margin) == (smallest(margin), smallest(0.0))


def test_the_margin_can_refuse_a_tight_fit() -> None:
    # 0.5 * 60 SMs = 30 SMs fit a 2g (32 SMs) exactly-ish, but not with 25% headroom (37.5 SMs)
    smaller = smaller_profile(usage(0, activity=0.5, used_gib=10.0), H200, P3G, 0.0)
    assert smaller is not None and smaller.name == "2g.35gb"
    assert smaller_profile(usage(0, activity=0.5, used_gib=10.0), H200, P3G, 0.25) is None


def test_no_job_or_unknown_activity_is_never_oversized() -> None:
    assert smaller_profile(usage(0, activity=0.01, used_gib=1.0, processes=0), H200, P3G, 0.25) is None
    assert smaller_profile(usage(0, activity=None, used_gib=1.0), H200, P3G, 0.25) is None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(H200.plain_profiles), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_suggested_profile_is_smaller_and_holds_the_job(
    profile: Profile, activity: float, mem_frac: float, margin: float
) -> None:
    total = profile.memory_mib * 2**20
    u = InstanceUsage(0, 0, profile.name, 10.0, 10.0, activity, activity, int(total * mem_frac), total, 1)
    q = smaller_profile(u, H200, profile, margin)
    if q is not None:
        assert q.compute_slices <= profile.compute_slices and q.memory_slices <= profile.memory_slices
        assert (q.compute_slices, q.memory_slices) != (profile.compute_slices, profile.memory_slices)
        assert activity * profile.sm_count * (1 + margin) <= q.sm_count
        assert u.memory_used_bytes is not None
        assert u.memory_used_bytes * (1 + margin) <= q.memory_mib * 2**20


def test_an_oversized_job_is_reported_after_its_window() -> None:
    windows = [usage(t, activity=0.40, used_gib=20.0) for t in range(30, 331, 30)]
    transitions, _, report = run(windows, kind="OversizedFinding")
    assert transitions == [(300, "started", "OversizedFinding")]
    (finding,) = instance_findings(report.active)
    assert isinstance(finding, OversizedFinding)
    assert finding.suggested == "2g.35gb"
    assert "2g.35gb would hold it with 25% headroom" in finding.reason
