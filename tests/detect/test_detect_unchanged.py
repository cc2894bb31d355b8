"""An observation that differs from the last one only in time is not judged again, and says exactly what a full
judgement would have said."""

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.detect import (
    DetectSettings,
    DetectState,
    FragmentationFinding,
    InstanceUsage,
    Observation,
    Report,
    UnderuseFinding,
    UnderuseSettings,
    observe,
)
from flexmig.detect import tracker as tracker_module
from flexmig.mig import Layout
from support.layouts import FRAGMENTATION, FRAGMENTED, PACKED

LAYOUTS = (FRAGMENTED, PACKED)  # the first fragmented: a finding after its window
US = UnderuseSettings(enter_after_s=30, exit_after_s=20, oversize_after_s=40, max_gap_s=10)
S = DetectSettings(fragmentation=FRAGMENTATION, underuse=US)
GiB = 2**30


def usage(layout: Layout, at: float, figures: tuple[int, float, int]) -> tuple[InstanceUsage, ...]:
    processes, activity, used_gib = figures
    return tuple(
        InstanceUsage(
            gpu=0,
            start=i.start,
            profile=i.profile.name,
            at=at,
            window_s=min(at + 1.0, 5.0),
            activity_mean=activity,
            activity_p95=activity,
            memory_used_bytes=used_gib * GiB,
            memory_total_bytes=i.profile.memory_mib * 2**20,
            processes=processes,
            uuid=f"MIG-{i.start}",
        )
        for i in layout
    )


def full(state: DetectState, obs: Observation) -> tuple[DetectState, Report]:
    """A judgement that cannot take the shortcut: the last sweep is forgotten first."""
    return observe(replace(state, last=None), obs, S)


FIGURES = st.sampled_from([(0, 0.0, 0), (1, 0.02, 1), (1, 0.9, 10), (1, 0.3, 2)])
STEPS = st.lists(
    st.tuples(st.sampled_from([1, 2, 5, 9, 14, 25, 40]), st.booleans(), st.sampled_from([0, 1]), FIGURES),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(steps=STEPS)
def test_skipping_an_unchanged_sweep_reports_what_judging_it_would(
    steps: list[tuple[int, bool, int, tuple[int, float, int]]],
) -> None:
    fast, slow = DetectState(), DetectState()
    now, layout, figures = 0.0, 0, (1, 0.9, 10)
    for dt, change, new_layout, new_figures in steps:
        now += dt
        if change:
            layout, figures = new_layout, new_figures
        lay = LAYOUTS[layout]
        obs = Observation(now=now, layouts={0: lay}, usage=usage(lay, now, figures))
        fast, got = observe(fast, obs, S)
        slow, want = full(slow, obs)
        assert got == want


def test_an_idle_instance_seen_unchanged_still_becomes_a_finding_on_time(monkeypatch: object) -> None:
    state = DetectState()
    lay = LAYOUTS[1]
    started = []
    judged = counting_judgements(monkeypatch)
    for t in range(0, 60, 5):
        state, report = observe(state, Observation(now=t, layouts={0: lay}, usage=usage(lay, t, (0, 0.0, 0))), S)
        started += [(t, type(f)) for f in report.started]
    assert started == [(30, UnderuseFinding)] * 2  # both instances, once, when the window has passed
    # Judged at the first sweep (pending from its window's start, -1) and at 30, when the pending run has lasted
    # the 30 s: the sweeps between are answered without judging.
    assert judged == [0, 30]


def counting_judgements(monkeypatch: object) -> list[float]:
    """The times of the sweeps judged in full from now on."""
    judged: list[float] = []
    real = tracker_module._windows

    def counting(sweep: object, *args: object, **kw: object) -> object:
        judged.append(sweep.now)  # type: ignore[attr-defined]
        return real(sweep, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(tracker_module, "_windows", counting)  # type: ignore[attr-defined]
    return judged


def test_unchanged_sweeps_after_the_findings_settle_are_not_judged_again(monkeypatch: object) -> None:
    lay = LAYOUTS[1]
    state = DetectState()
    for t in range(0, 40, 5):
        state, _ = observe(state, Observation(now=t, layouts={0: lay}, usage=usage(lay, t, (0, 0.0, 0))), S)
    assert state.last is not None and state.last.until == math.inf  # nothing pending: no flip to come
    judged = counting_judgements(monkeypatch)
    state, report = observe(state, Observation(now=45, layouts={0: lay}, usage=usage(lay, 45, (0, 0.0, 0))), S)
    assert judged == [] and report.now == 45 and len(report.active) == 2 and report.started == ()
    # A change is judged on the very next sweep: the job is back, and the findings end after their exit window.
    ended = []
    for t in range(50, 80, 5):
        state, report = observe(state, Observation(now=t, layouts={0: lay}, usage=usage(lay, t, (1, 0.9, 10))), S)
        ended += [t for _ in report.ended]
    assert judged == [50, 65] and ended == [65, 65]  # the exit window ends at 65: the sweeps between are not judged


def test_new_settings_are_applied_to_an_unchanged_sweep() -> None:
    lay = LAYOUTS[0]
    state = DetectState()
    for t in range(0, 60, 10):
        state, report = observe(state, Observation(now=t, layouts={0: lay}, usage=usage(lay, t, (1, 0.9, 10))), S)
    assert [type(f) for f in report.active] == [FragmentationFinding]
    stricter = replace(S, fragmentation=replace(S.fragmentation, enter=0.9, exit=0.8))
    state, report = observe(state, Observation(now=60, layouts={0: lay}, usage=usage(lay, 60, (1, 0.9, 10))), stricter)
    state, report = observe(state, Observation(now=90, layouts={0: lay}, usage=usage(lay, 90, (1, 0.9, 10))), stricter)
    assert report.active == () and [type(e.finding) for e in report.ended] == [FragmentationFinding]
