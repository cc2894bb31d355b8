"""Invariants of the pure MIG model, over random placement sequences on every model."""

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.errors import LayoutError
from flexmig.mig import MODELS, Layout, parse_node_spec

ops = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 7), st.booleans()), max_size=25)


@settings(max_examples=150, deadline=None)
@given(model_i=st.integers(0, len(MODELS) - 1), seq=ops)
def test_random_place_and_remove_keeps_layout_valid(model_i: int, seq: list[tuple[int, int, bool]]) -> None:
    model = MODELS[model_i]
    layout = Layout.empty(model)
    for prof_i, start, remove in seq:
        if remove and len(layout):
            layout = layout.remove(layout.instances[start % len(layout)].start)
            continue
        profile = model.profiles[prof_i]
        allowed = layout.can_place(profile, start)
        try:
            layout = layout.place(profile, start)
            assert allowed
        except LayoutError:
            assert not allowed
        assert not layout.violations()
        used = [s for i in layout for s in i.slices]
        assert len(used) == len(set(used)), "no two instances share a memory slice"
        assert layout.used_compute_slices() <= model.compute_slices
        for p in model.profiles:
            assert 0 <= layout.creatable(p) <= p.max_instances
            assert all(s in p.starts for s in layout.placements(p))


@settings(max_examples=100, deadline=None)
@given(model_i=st.integers(0, len(MODELS) - 1), seq=ops)
def test_spec_round_trips(model_i: int, seq: list[tuple[int, int, bool]]) -> None:
    model = MODELS[model_i]
    layout = Layout.empty(model)
    for prof_i, start, _ in seq:
        if layout.can_place(model.profiles[prof_i], start):
            layout = layout.place(model.profiles[prof_i], start)
    spec = f"{model.key}x3:{layout.spec()}" if len(layout) else f"{model.key}x3"
    parsed = parse_node_spec(spec)
    assert parsed.count == 3
    assert parsed.layout == layout
