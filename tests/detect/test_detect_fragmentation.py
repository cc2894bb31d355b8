"""Fragmentation definitions (flexmig.detect): free, stranded and demand-weighted external fragmentation.

Hand-checked layouts first, then invariants as hypothesis properties over random valid layouts of all models.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.detect import (
    DEFAULT_DEMAND,
    DemandMix,
    FragmentationSettings,
    StrandedCapacity,
    arrangements,
    demand_from_requests,
    gpu_fragmentation,
    node_fragmentation,
    repacked_capacity,
    stranded_capacity,
)
from flexmig.mig import A100_40, H100_80, H200, MODELS, Layout

MIX = DemandMix(DEFAULT_DEMAND)


def cap(layout: Layout, name: str) -> StrandedCapacity:
    return {c.profile: c for c in stranded_capacity(layout)}[name]


# ------------------------------------------------------------------------------------------------ hand-checked
def test_four_free_compute_slices_cannot_host_a_3g() -> None:
    layout = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    g = gpu_fragmentation(0, layout, MIX)
    assert g.free_compute_slices == 4
    assert g.free_memory_slices == 5
    assert g.creatable()["3g.71gb"] == 0


def test_repacking_the_same_instances_frees_room_for_a_3g() -> None:
    layout = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    c = cap(layout, "3g.71gb")
    assert (c.creatable_now, c.creatable_repacked, c.stranded) == (0, 1, 1)
    g = gpu_fragmentation(0, layout, MIX)
    # ... or, packed the other way (2g@4 + 1g@6), a 4g or a second 2g: the score takes the largest, 4 slices.
    assert g.stranded() == {"2g.35gb": 1, "3g.71gb": 1, "4g.71gb": 1}
    assert g.stranded_compute_slices == 4
    assert g.stranded_score == pytest.approx(4 / 7)


def test_stranded_capacity_disappears_once_repacked() -> None:
    scattered = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    packed = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 2)])
    assert cap(scattered, "3g.71gb").stranded == 1
    assert cap(packed, "3g.71gb").stranded == 0
    assert cap(packed, "3g.71gb").creatable_now == 1


def test_three_scattered_1g_strand_two_2g() -> None:
    layout = Layout.of(H200, [("1g.18gb", 0), ("1g.18gb", 2), ("1g.18gb", 5)])
    c = cap(layout, "2g.35gb")
    # now: 2g may start at 0, 2 or 4, and each of those pairs holds a 1g; packed at 4, 5, 6: 2g at 0 and 2.
    assert (c.creatable_now, c.creatable_repacked) == (0, 2)


def test_external_score_of_the_worked_example() -> None:
    layout = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    g = gpu_fragmentation(0, layout, MIX)
    assert g.unfit == ("3g.71gb", "4g.71gb", "7g.141gb")
    assert g.external_fragment == pytest.approx((0.20 + 0.10 + 0.10) * 4)
    assert g.external_score == pytest.approx(0.4)


def test_an_empty_gpu_is_not_fragmented() -> None:
    g = gpu_fragmentation(0, Layout.empty(H200), MIX)
    assert (g.external_score, g.stranded_score, g.free_compute_slices, g.free_memory_slices) == (0.0, 0.0, 7, 8)


def test_a_full_gpu_has_nothing_to_fragment() -> None:
    g = gpu_fragmentation(0, Layout.of(H200, [("7g.141gb", 0)]), MIX)
    assert (g.external_fragment, g.external_score, g.free_compute_slices) == (0.0, 0.0, 0)


def test_compute_left_without_memory_is_all_fragment() -> None:
    layout = Layout.of(H100_80, [("1g.20gb", s) for s in (0, 2, 4, 6)])
    g = gpu_fragmentation(0, layout, MIX)
    assert g.free_compute_slices == 3
    assert g.free_memory_slices == 0
    assert g.external_score == pytest.approx(1.0)
    assert g.stranded_compute_slices == 0


def test_a_mix_of_only_1g_sees_no_fragment_where_a_1g_fits() -> None:
    layout = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    assert gpu_fragmentation(0, layout, DemandMix((("1g", 1.0),))).external_score == 0.0
    assert gpu_fragmentation(0, layout, DemandMix((("3g", 1.0),))).external_score == 1.0


def test_mix_shapes_resolve_per_model_and_exact_names_are_kept() -> None:
    mix = DemandMix((("3g", 1.0), ("1g.35gb", 1.0), ("nope", 5.0)))
    resolved = {p.name: w for p, w in mix.resolve(H200)}
    assert resolved == {"1g.35gb": 0.5, "3g.71gb": 0.5}
    assert {p.name for p, _ in mix.resolve(A100_40)} == {"3g.20gb"}  # 1g.35gb is not an A100-40 profile


def test_node_score_is_fragment_over_free_of_all_gpus() -> None:
    a = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])  # 1.6 of 4 free
    b = Layout.empty(H200)  # 0 of 7 free
    node = node_fragmentation({0: a, 1: b}, MIX)
    assert node.free_compute_slices == 11
    assert node.external_score == pytest.approx(1.6 / 11)
    assert node.stranded_score == pytest.approx(4 / 14)
    assert node.creatable()["3g.71gb"] == 2


def test_recent_requests_shift_the_mix_and_old_ones_are_forgotten() -> None:
    fs = FragmentationSettings(demand=(("1g", 1.0),), demand_prior_weight=1.0, demand_window_s=100)
    mix = demand_from_requests([(990.0, "3g")] * 9 + [(10.0, "7g")] * 50, now=1000.0, settings=fs)
    weights = {p.name: w for p, w in mix.resolve(H200)}
    assert weights == pytest.approx({"1g.18gb": 0.1, "3g.71gb": 0.9})


def test_a_demand_mix_needs_a_positive_weight() -> None:
    with pytest.raises(ValueError, match="positive weight"):
        DemandMix((("1g", 0.0),))


# ------------------------------------------------------------------------------------------------ properties
@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    model = draw(st.sampled_from(MODELS))
    layout = Layout.empty(model)
    for _ in range(draw(st.integers(0, 9))):
        p = draw(st.sampled_from(model.profiles))
        s = draw(st.integers(0, 7))
        if layout.can_place(p, s):
            layout = layout.place(p, s)
    return layout


mixes = st.lists(st.tuples(st.sampled_from(["1g", "2g", "3g", "4g", "7g"]), st.floats(0.01, 1.0)), min_size=1).map(
    lambda items: DemandMix(tuple(items))
)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_stranded_capacity_is_never_negative_and_repacking_never_loses(layout: Layout) -> None:
    for c in stranded_capacity(layout):
        assert c.creatable_repacked >= c.creatable_now >= 0


@settings(max_examples=80, deadline=None)
@given(layouts(), st.data())
def test_repacked_capacity_depends_only_on_the_multiset_of_profiles(layout: Layout, data: st.DataObject) -> None:
    others = list(arrangements(layout.model, [i.profile for i in layout]))
    assert any(o.spec() == layout.spec() for o in others)  # the layout is one of its own arrangements
    other = data.draw(st.sampled_from(others))
    assert repacked_capacity(other) == repacked_capacity(layout)


@settings(max_examples=80, deadline=None)
@given(layouts())
def test_every_arrangement_holds_the_same_instances_validly(layout: Layout) -> None:
    want = sorted(i.profile.name for i in layout)
    for other in arrangements(layout.model, [i.profile for i in layout]):
        assert not other.violations()
        assert sorted(i.profile.name for i in other) == want


@settings(max_examples=150, deadline=None)
@given(layouts(), mixes)
def test_external_score_is_a_ratio_and_zero_when_nothing_is_free(layout: Layout, mix: DemandMix) -> None:
    g = gpu_fragmentation(0, layout, mix)
    assert 0.0 <= g.external_score <= 1.0 + 1e-9
    assert g.external_fragment <= g.free_compute_slices + 1e-9
    if g.free_compute_slices == 0:
        assert g.external_score == 0.0
    assert g.free_compute_slices == layout.model.compute_slices - sum(i.profile.compute_slices for i in layout)
    assert 0.0 <= g.stranded_score <= 1.0


@settings(max_examples=100, deadline=None)
@given(layouts(), mixes)
def test_a_profile_counts_as_unfit_exactly_when_none_can_be_created(layout: Layout, mix: DemandMix) -> None:
    g = gpu_fragmentation(0, layout, mix)
    if g.free_compute_slices:
        creatable = g.creatable()
        assert set(g.unfit) == {p.name for p, _ in mix.resolve(layout.model) if creatable[p.name] == 0}


@settings(max_examples=80, deadline=None)
@given(st.lists(layouts(), min_size=1, max_size=4), mixes)
def test_node_score_lies_between_its_gpus_scores(gpu_layouts: list[Layout], mix: DemandMix) -> None:
    node = node_fragmentation(dict(enumerate(gpu_layouts)), mix)
    with_free = [g.external_score for g in node.gpus if g.free_compute_slices]
    if with_free:
        assert min(with_free) - 1e-9 <= node.external_score <= max(with_free) + 1e-9
    assert node.free_compute_slices == sum(g.free_compute_slices for g in node.gpus)


# ------------------------------------------------------------------------------------------------ recoverable
@pytest.mark.parametrize(
    ("items", "recoverable", "profile"),
    [
        ([("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)], 1, "1g.18gb"),  # the demo: one stranded slice
        ([("3g.71gb", 0), ("1g.18gb", 4)], 2, "2g.35gb"),
        ([("2g.35gb", 0), ("1g.18gb", 4)], 4, "4g.71gb"),
        ([("2g.35gb", 4), ("1g.18gb", 6)], 0, None),  # packed
    ],
)
def test_recoverable_compute_slices_are_what_a_repack_makes_usable_by_a_demanded_profile(
    items: list[tuple[str, int]], recoverable: int, profile: str | None
) -> None:
    g = gpu_fragmentation(0, Layout.of(H200, items), MIX)
    assert g.recoverable_compute_slices == recoverable
    assert (g.recoverable.profile if g.recoverable else None) == profile
    assert g.recoverable_score == pytest.approx(recoverable / 7)


def test_the_demo_layout_scores_1_on_external_fragmentation_yet_is_no_finding_by_default() -> None:
    g = gpu_fragmentation(0, Layout.of(H200, [("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)]), MIX)
    assert g.external_score == 1.0
    assert g.recoverable_score <= FragmentationSettings().exit


def test_a_profile_the_demand_mix_does_not_ask_for_recovers_nothing() -> None:
    layout = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    small = gpu_fragmentation(0, layout, DemandMix((("1g", 1.0),)))
    assert small.stranded_compute_slices == 4  # a 4g would fit after a repack, but nobody asks for one
    assert small.recoverable_compute_slices == 0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_recoverable_never_exceeds_stranded_or_the_free_compute(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(MODELS))
    layout = Layout.empty(model)
    for _ in range(data.draw(st.integers(0, 5))):
        profile = data.draw(st.sampled_from(model.profiles))
        starts = layout.placements(profile)
        if starts:
            layout = layout.place(profile, data.draw(st.sampled_from(starts)))
    g = gpu_fragmentation(0, layout, MIX)
    assert 0 <= g.recoverable_compute_slices <= g.stranded_compute_slices
    assert g.recoverable_compute_slices <= g.free_compute_slices
