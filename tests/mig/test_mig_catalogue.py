"""The MIG profile tables and placement rules, as NVIDIA publishes them (MIG User Guide, `nvidia-smi mig -lgipp`)."""

import pytest

from flexmig.mig import A100_40, A100_80, H100_80, H200, MODELS, GpuModel, Layout, maximal_layouts

# nvidia-smi mig -lgipp, identical on A100-40GB, A100-80GB, H100-80GB and H200 (NVIDIA MIG User Guide):
PUBLISHED_PLACEMENTS = {
    19: ((0, 1, 2, 3, 4, 5, 6), 1),
    20: ((0, 1, 2, 3, 4, 5, 6), 1),
    15: ((0, 2, 4, 6), 2),
    14: ((0, 2, 4), 2),
    9: ((0, 4), 4),
    5: ((0,), 4),
    0: ((0,), 8),
}
# Profile ID -> NVML index (NVML_GPU_INSTANCE_PROFILE_*): they differ, and both are needed.
PUBLISHED_INDEX = {19: 0, 20: 7, 15: 9, 14: 1, 9: 2, 5: 3, 0: 4}
NAMES = {
    "a100-40": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "a100-80": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "h100-80": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "h200": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_placement_table_matches_nvidia_lgipp(model: GpuModel) -> None:
    table = {p.profile_id: (p.starts, p.memory_slices) for p in model.profiles}
    assert table == PUBLISHED_PLACEMENTS


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_profile_index_and_id_are_kept_apart(model: GpuModel) -> None:
    assert {p.profile_id: p.index for p in model.profiles} == PUBLISHED_INDEX


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_profile_names_as_nvidia_smi_prints_them(model: GpuModel) -> None:
    assert [p.name for p in model.profiles] == NAMES[model.key]


def test_h200_sm_counts_from_lgip() -> None:
    assert {p.name: p.sm_count for p in H200.profiles} == {
        "1g.18gb": 16,
        "1g.18gb+me": 16,
        "1g.35gb": 26,
        "2g.35gb": 32,
        "3g.71gb": 60,
        "4g.71gb": 64,
        "7g.141gb": 132,
    }


def test_3g_cannot_start_at_2() -> None:
    assert not Layout.empty(H200).can_place(H200.profile("3g.71gb"), 2)


def test_3g_at_0_blocks_4g() -> None:
    layout = Layout.of(H200, [("3g.71gb", 0)])
    assert layout.creatable(H200.profile("4g.71gb")) == 0
    assert layout.creatable(H200.profile("3g.71gb")) == 1


def test_4g_and_3g_fit_together() -> None:
    assert not Layout.of(A100_40, [("4g.20gb", 0), ("3g.20gb", 4)]).violations()


def test_four_double_memory_1g_use_all_memory_but_four_compute_slices() -> None:
    layout = Layout.of(H100_80, [("1g.20gb", s) for s in (0, 2, 4, 6)])
    assert layout.free_memory_slices() == ()
    assert layout.free_compute_slices() == 3
    assert all(n == 0 for n in layout.capacity().values())


def test_only_one_media_variant_per_gpu() -> None:
    layout = Layout.of(A100_80, [("1g.10gb+me", 0)])
    assert layout.creatable(A100_80.profile("1g.10gb+me")) == 0
    assert layout.creatable(A100_80.profile("1g.10gb")) == 6


def test_empty_gpu_capacity_is_the_published_instance_count() -> None:
    assert Layout.empty(H200).capacity() == {
        "1g.18gb": 7,
        "1g.18gb+me": 1,
        "1g.35gb": 4,
        "2g.35gb": 3,
        "3g.71gb": 2,
        "4g.71gb": 1,
        "7g.141gb": 1,
    }


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_maximal_layout_counts(model: GpuModel) -> None:
    assert len(maximal_layouts(model)) == 78
    assert len(maximal_layouts(model, model.profiles)) == 239


def test_nvidia_diagram_has_19_combinations_of_1g_2g_3g_4g_7g() -> None:
    five = [p for p in H200.plain_profiles if p.name != "1g.35gb"]
    layouts = maximal_layouts(H200, five)
    assert len(layouts) == 19
    assert "4444111." in {lay.slice_map() for lay in layouts}


def test_every_enumerated_layout_is_valid_and_maximal() -> None:
    for lay in maximal_layouts(H200):
        assert not lay.violations()
        assert not any(lay.placements(p) for p in H200.plain_profiles), f"{lay.spec()}: another instance fits"
