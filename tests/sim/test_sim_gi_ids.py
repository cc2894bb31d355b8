"""GPU-instance IDs: the driver's rule against every published ID sequence, and the adversary's legality."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass

import pytest

from flexmig.errors import SimError
from flexmig.sim import install, uninstall
from flexmig.sim.gi_ids import AdversarialIds, DriverIds, buddy_id, class_ids, infer_fused_slot, policy_from

# size in memory slices, compute slices, allowed starts (the MIG placement table, any of the four models)
PROFILES = {"1g": (1, 1, range(7)), "2g": (2, 2, (0, 2, 4)), "3g": (4, 3, (0, 4)), "4g": (4, 4, (0,))}


@dataclass
class Gi:
    id: int
    start: int
    size: int


def cgi(policy: DriverIds | AdversarialIds, fused: int, order: list[str]) -> list[tuple[int, int] | None]:
    """``nvidia-smi mig -cgi`` of ``order`` on an empty GPU: (ID, start) per instance, None when nothing fits."""
    taken: list[Gi] = []
    out: list[tuple[int, int] | None] = []
    for name in order:
        size, _, starts = PROFILES[name]
        used = {s for gi in taken for s in range(gi.start, gi.start + gi.size)}
        fits = [s for s in starts if not used & set(range(s, s + size))]
        if not fits:
            out.append(None)
            continue
        start = policy.choose_start(0, fused, size, fits, taken)
        gi = Gi(policy.assign(0, fused, size, start, taken), start, size)
        taken.append(gi)
        out.append((gi.id, gi.start))
    return out


def ids(results: list[tuple[int, int] | None]) -> list[int]:
    """The IDs of instances that were created."""
    return [r[0] for r in results if r is not None]


def test_seven_1g_on_an_a100_40gb_get_dask_cuda_583s_ids() -> None:
    # https://github.com/rapidsai/dask-cuda/issues/583: `nvidia-smi mig -cgi 19,19,19,19,19,19,19`
    assert ids(cgi(DriverIds(), 3, ["1g"] * 7)) == [9, 7, 8, 11, 12, 13, 14]


def test_the_mig_user_guides_examples_get_its_ids_and_placements() -> None:
    # https://docs.nvidia.com/datacenter/tesla/mig-user-guide/ (A100-SXM4-40GB), with `-lgi` for the placements
    assert cgi(DriverIds(), 7, ["3g", "1g", "2g", "1g"]) == [(2, 4), (7, 0), (4, 2), (8, 1)]
    two_one = [(5, 4), (13, 6), (7, 0), (8, 1), (9, 2), (10, 3)]
    assert cgi(DriverIds(), 7, ["2g", "1g", "1g", "1g", "1g", "1g"]) == two_one
    assert cgi(DriverIds(), 7, ["1g", "1g", "2g", "3g"]) == [(13, 6), (11, 4), (3, 0), None]


def test_three_2g_get_nvitop_8s_ids_on_either_kind_of_gpu() -> None:
    # https://github.com/XuehaiPan/nvitop/pull/8: GIs 3, 5, 6 on one A100-80GB and 3, 4, 5 on another
    assert sorted(ids(cgi(DriverIds(), 3, ["2g"] * 3))) == [3, 5, 6]
    assert sorted(ids(cgi(DriverIds(), 7, ["2g"] * 3))) == [3, 4, 5]


def test_one_layout_on_two_gpus_gets_dcgm_138s_two_id_sets() -> None:
    # https://github.com/NVIDIA/DCGM/issues/138: 1g@2, 1g@3, 2g@0, 3g@4 are 9, 10, 3, 2 on GPU 0 and 13, 14, 5, 1
    # on GPU 1 of the same node
    layout = [(1, 2), (1, 3), (2, 0), (4, 4)]
    assert [DriverIds().assign(0, 7, size, start, []) for size, start in layout] == [9, 10, 3, 2]
    assert [DriverIds().assign(1, 3, size, start, []) for size, start in layout] == [13, 14, 5, 1]
    assert infer_fused_slot([(2, 1, 13), (3, 1, 14), (0, 2, 5), (4, 4, 1)], fallback=0) == 3


def test_the_ids_of_a_size_are_its_buddy_numbers() -> None:
    assert [list(class_ids(s)) for s in (8, 4, 2, 1)] == [[0], [1, 2], [3, 4, 5, 6], list(range(7, 15))]
    assert (buddy_id(0, 8), buddy_id(4, 4), buddy_id(6, 2), buddy_id(7, 1)) == (0, 2, 6, 14)
    with pytest.raises(ValueError, match="size 2 starts at memory slice 3"):
        buddy_id(3, 2)


def test_the_adversary_hands_out_free_ids_of_the_size_class_and_reuses_freed_ones() -> None:
    adversary = AdversarialIds(7)
    seen: set[int] = set()
    for _ in range(200):
        taken = [Gi(adversary.assign(0, 7, 1, s, []), s, 1) for s in range(3)]
        ids = [gi.id for gi in taken]
        assert len(set(ids)) <= 3 and all(i in class_ids(1) for i in ids)
        adversary.released(0, ids[0])
        again = adversary.assign(0, 7, 1, 0, taken[1:])
        assert again in class_ids(1) and again not in ids[1:]
        seen.add(again)
    assert len(seen) > 3  # not one fixed mapping


def test_the_id_mode_is_named_and_a_bad_one_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(policy_from("driver"), DriverIds)
    assert isinstance(policy_from("adversarial:12"), AdversarialIds)
    monkeypatch.setenv("FLEXMIG_SIM_IDS", "sneaky")
    with pytest.raises(SimError, match="FLEXMIG_SIM_IDS='sneaky'"):
        policy_from(None)
    with pytest.raises(SimError, match="adversarial:SEED"):
        install("h200", ids="adversarial:x")


def test_gpu_uuids_are_not_rfc_4122_and_mig_uuids_are_version_5() -> None:
    # Real GPUs print GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16 (no version nibble), their MIG devices
    # MIG-feb88891-0321-5fef-9c87-d4af3b54259e (version 5): DataDog/datadog-agent pull request #33120's `nvidia-smi -L`.
    node = install("h200x8:1g.18gb@0")
    try:
        gpus = [uuidlib.UUID(g.uuid.removeprefix("GPU-")) for g in node.gpus()]
        assert not all(u.version == 5 and u.variant == uuidlib.RFC_4122 for u in gpus)
        assert all(not (u.version == 5 and u.variant == uuidlib.RFC_4122) for u in gpus)
        migs = [uuidlib.UUID(u.removeprefix("MIG-")) for u in node.mig_uuids()]
        assert all(u.version == 5 for u in migs)
    finally:
        uninstall()
