"""The detection step over whole sweeps: instance changes, lost GPUs and fragmentation findings."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.detect import (
    DetectSettings,
    DetectState,
    FragmentationFinding,
    InstanceUsage,
    Observation,
    Report,
    observe,
)
from flexmig.mig import H200, Layout
from support.layouts import FRAGMENTATION, FRAGMENTED, PACKED

FS = FRAGMENTATION
S = DetectSettings(fragmentation=FS)


def sweep(state: DetectState, now: float, layouts: dict[int, Layout], **kw: Any) -> tuple[DetectState, Report]:
    return observe(state, Observation(now=now, layouts=layouts, **kw), S)


def test_the_first_sweep_is_a_baseline_not_a_burst_of_creations() -> None:
    _, report = sweep(DetectState(), 0, {0: FRAGMENTED})
    assert report.created == () and report.destroyed == ()


def test_created_and_destroyed_instances_are_reported_once() -> None:
    state, _ = sweep(DetectState(), 0, {0: Layout.of(H200, [("3g.71gb", 0)])})
    state, report = sweep(state, 1, {0: Layout.of(H200, [("3g.71gb", 4)])})
    assert [(c.start, c.profile) for c in report.created] == [(4, "3g.71gb")]
    assert [(c.start, c.profile) for c in report.destroyed] == [(0, "3g.71gb")]
    _, report = sweep(state, 2, {0: Layout.of(H200, [("3g.71gb", 4)])})
    assert report.created == () and report.destroyed == ()


def test_an_instance_recreated_in_place_is_reported_even_when_the_layout_object_is_shared() -> None:
    # The daemon hands detection the same Layout object while the GPU's instances keep their places (its layout
    # cache); a destroy and create in place between two sweeps changes only the UUID at that start.
    layout = Layout.of(H200, [("3g.71gb", 0), ("1g.18gb", 4)])
    state, _ = sweep(DetectState(), 0, {0: layout}, uuids={(0, 0): "MIG-a", (0, 4): "MIG-b"})
    state, report = sweep(state, 1, {0: layout}, uuids={(0, 0): "MIG-a", (0, 4): "MIG-c"})
    assert [(c.start, c.profile, c.uuid) for c in report.destroyed] == [(4, "1g.18gb", "MIG-b")]
    assert [(c.start, c.profile, c.uuid) for c in report.created] == [(4, "1g.18gb", "MIG-c")]
    _, report = sweep(state, 2, {0: layout}, uuids={(0, 0): "MIG-a", (0, 4): "MIG-c"})
    assert report.created == () and report.destroyed == ()


def test_a_lost_gpu_is_reported_once_and_its_instances_are_not_called_destroyed() -> None:
    state, _ = sweep(DetectState(), 0, {0: FRAGMENTED, 1: PACKED})
    state, report = sweep(state, 1, {1: PACKED}, lost_gpus=frozenset({0}))
    assert report.lost == (0,)
    assert report.destroyed == ()
    state, report = sweep(state, 2, {1: PACKED}, lost_gpus=frozenset({0}))
    assert report.lost == ()
    _, report = sweep(state, 3, {0: FRAGMENTED, 1: PACKED})  # it came back as it was
    assert report.created == () and report.destroyed == ()


def test_fragmentation_starts_after_its_window_and_ends_after_repacking() -> None:
    state = DetectState()
    started, ended = [], []
    for t, layout in [(0, FRAGMENTED), (10, FRAGMENTED), (20, FRAGMENTED), (30, PACKED), (40, PACKED), (50, PACKED)]:
        state, report = sweep(state, t, {0: layout})
        assert all(isinstance(f, FragmentationFinding) for f in report.started)
        started += [(t, f.gpu, round(f.score, 2)) for f in report.started if isinstance(f, FragmentationFinding)]
        ended += [(t, e.finding.gpu) for e in report.ended]
    assert started == [(20, 0, 0.57)]
    assert ended == [(50, 0)]


def test_a_fragmentation_finding_explains_itself() -> None:
    state = DetectState()
    for t in (0, 10, 20):
        state, report = sweep(state, t, {0: FRAGMENTED})
    (finding,) = report.started
    assert isinstance(finding, FragmentationFinding)
    assert finding.unfit == ("3g.71gb", "4g.71gb", "7g.141gb")
    assert finding.reason.startswith("GPU 0 (h200) has 4 free compute slice(s) that cannot host 3g.71gb")
    assert "repacking the running instances would free room for 1 2g.35gb, 1 3g.71gb, 1 4g.71gb" in finding.reason


def test_a_window_for_an_instance_that_is_not_there_is_ignored_and_said_so() -> None:
    w = InstanceUsage(0, 4, "3g.71gb", 10.0, 10.0, 0.0, 0.0, 0, 1, 0)
    _, report = sweep(DetectState(), 10, {0: FRAGMENTED}, usage=(w,))
    assert report.ignored == ("window for 3g.71gb at GPU 0 slice 4 matches no current instance",)
    assert report.internal == ()


def test_repacked_capacities_are_searched_once_per_multiset() -> None:
    state, _ = sweep(DetectState(), 0, {0: FRAGMENTED})
    state2, _ = sweep(state, 1, {0: FRAGMENTED, 1: PACKED})  # same multiset as GPU 0
    assert state2.memo is state.memo


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([FRAGMENTED, PACKED, Layout.empty(H200)]), min_size=1, max_size=30))
def test_fragmentation_findings_alternate_start_end_and_never_overlap(seq: list[Layout]) -> None:
    state = DetectState()
    on = False
    for t, layout in enumerate(seq):
        state, report = sweep(state, t * 10, {0: layout})
        for _ in report.started:
            assert not on
            on = True
        for _ in report.ended:
            assert on
            on = False
        assert on == any(f.key[0] == "fragmentation" for f in report.active)
