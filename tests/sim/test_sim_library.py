"""The simulated libnvidia-ml, spoken to through the real pynvml wrappers: what a driver would answer."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from ctypes import byref, c_uint
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.errors import SimError
from flexmig.sim import FAKE_PID_BASE, SimNode, install, installed, uninstall
from flexmig.sim.state import pid_alive
from support.wait import wait_until

H200_LAYOUT = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
Sim = Callable[..., SimNode]  # sim(spec, **install_options) -> the node, NVML initialised


@pytest.fixture
def sim() -> Iterator[Sim]:
    """Install a simulator per test; the test calls ``sim(spec)`` and gets the node with NVML initialised."""
    nodes = []

    def make(spec: str = H200_LAYOUT, **kw: Any) -> SimNode:
        node = install(spec, **kw)
        N.nvmlInit()
        nodes.append(node)
        return node

    yield make
    uninstall()


def _proc_state(pid: int) -> str:
    """The state letter /proc shows for ``pid`` ("R", "S", "Z", ...)."""
    return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]


def gpu(i: int = 0) -> Any:
    return N.nvmlDeviceGetHandleByIndex(i)


def create_gi(dev: Any, profile_id: int, start: int, size: int) -> Any:
    placement = N.c_nvmlGpuInstancePlacement_t(start, size)
    return N.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, byref(placement))


def gi_id(gi: Any) -> int:
    return int(N.nvmlGpuInstanceGetInfo(gi).id)


def first_gi_id() -> int:
    """The GI ID of GPU 0's first MIG device, read through its MIG handle (which needs no privileges)."""
    return int(N.nvmlDeviceGetGpuInstanceId(N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)))


def mig_handles(dev: Any) -> list[Any]:
    out = []
    for i in range(N.nvmlDeviceGetMaxMigDeviceCount(dev)):
        try:
            out.append(N.nvmlDeviceGetMigDeviceHandleByIndex(dev, i))
        except N.NVMLError_NotFound:
            continue
    return out


# ------------------------------------------------------------------------------------------- install
def test_uninstall_puts_back_no_library_so_init_says_library_not_found(sim: Sim) -> None:
    sim("h200")
    uninstall()
    assert not installed()
    with pytest.raises(N.NVMLError_LibraryNotFound):
        N.nvmlInit()


def test_calls_before_init_are_uninitialized() -> None:
    install("h200")
    try:
        with pytest.raises(N.NVMLError_Uninitialized):
            N.nvmlDeviceGetCount()
    finally:
        uninstall()


def test_a_bad_spec_is_refused_before_anything_is_installed() -> None:
    with pytest.raises(ValueError, match=r"3g\.71gb may start only"):
        install("h200:3g.71gb@2")
    assert not installed()


def test_node_reports_driver_versions_gpu_names_and_memory(sim: Sim) -> None:
    sim("a100-80x3")
    assert N.nvmlSystemGetDriverVersion() == "570.124.06"
    assert N.nvmlSystemGetNVMLVersion().startswith("12.")
    assert N.nvmlDeviceGetCount() == 3
    assert N.nvmlDeviceGetName(gpu(2)) == "NVIDIA A100-SXM4-80GB"
    assert N.nvmlDeviceGetMemoryInfo(gpu(0)).total == 81920 << 20
    assert N.nvmlDeviceGetUUID(gpu(0)) != N.nvmlDeviceGetUUID(gpu(1))


# ------------------------------------------------------------------------------------------ profiles
def test_profile_index_and_profile_id_are_different_numbers(sim: Sim) -> None:
    sim("h200@580")  # nvmlDeviceGetGpuInstanceProfileInfoByIdV: CUDA 13.0's header, driver branch 580
    info = N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(), N.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.name, info.sliceCount, info.memorySizeMB) == (9, "MIG 3g.71gb", 3, 71168)
    assert N.nvmlDeviceGetGpuInstanceProfileInfoById(gpu(), 9).name == "MIG 3g.71gb"


def test_profile_indices_a_gpu_does_not_offer_are_not_supported(sim: Sim) -> None:
    sim("h200")
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(), N.NVML_GPU_INSTANCE_PROFILE_8_SLICE)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(), N.NVML_GPU_INSTANCE_PROFILE_COUNT)


def test_possible_placements_answer_a_null_array_with_the_count_then_fill_it(sim: Sim) -> None:
    sim("h200")
    count = c_uint(0)
    N.nvmlDeviceGetGpuInstancePossiblePlacements(gpu(), 9, None, byref(count))
    assert count.value == 2
    arr = (N.c_nvmlGpuInstancePlacement_t * count.value)()
    N.nvmlDeviceGetGpuInstancePossiblePlacements(gpu(), 9, arr, byref(count))
    assert [(p.start, p.size) for p in arr] == [(0, 4), (4, 4)]


def test_possible_placements_refuse_a_too_small_array(sim: Sim) -> None:
    sim("h200")
    count = c_uint(1)
    arr = (N.c_nvmlGpuInstancePlacement_t * 1)()
    with pytest.raises(N.NVMLError_InsufficientSize):
        N.nvmlDeviceGetGpuInstancePossiblePlacements(gpu(), 19, arr, byref(count))
    assert count.value == 7


# ------------------------------------------------------------------------------------ GPU instances
def test_3g_cannot_start_at_2_nor_1g_at_7_the_placement_is_invalid(sim: Sim) -> None:
    # nvml.h, CreateGpuInstanceWithPlacement: INVALID_ARGUMENT "If [...] placement [...] are invalid";
    # INSUFFICIENT_RESOURCES is for a placement the profile allows that is taken.
    sim("h200")
    with pytest.raises(N.NVMLError_InvalidArgument):
        create_gi(gpu(), 9, 2, 4)
    with pytest.raises(N.NVMLError_InvalidArgument):
        create_gi(gpu(), 19, 7, 1)
    create_gi(gpu(), 9, 0, 4)
    with pytest.raises(N.NVMLError_InsufficientResources):
        create_gi(gpu(), 19, 3, 1)  # a valid 1g start inside the 3g


def test_overlapping_instances_are_insufficient_resources(sim: Sim) -> None:
    sim("h200:3g.71gb@0")
    with pytest.raises(N.NVMLError_InsufficientResources):
        create_gi(gpu(), 14, 2, 2)  # 2g at 2 overlaps the 3g at 0..3


def test_a_second_1g_me_is_insufficient_resources(sim: Sim) -> None:
    sim("h200:1g.18gb+me@0")
    with pytest.raises(N.NVMLError_InsufficientResources):
        create_gi(gpu(), 20, 1, 1)


def test_a_placement_size_that_is_not_the_profiles_is_invalid(sim: Sim) -> None:
    sim("h200")
    with pytest.raises(N.NVMLError_InvalidArgument):
        create_gi(gpu(), 9, 0, 3)  # 3g spans 4 memory slices, not 3


def test_a_placement_passed_by_value_is_refused(sim: Sim) -> None:
    sim("h200")
    placement = N.c_nvmlGpuInstancePlacement_t(0, 4)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceCreateGpuInstanceWithPlacement(gpu(), 9, placement)


def test_one_layout_gets_other_gi_ids_on_the_gpu_next_door(sim: Sim) -> None:
    # DCGM issue #138: two A100-80GB of one node, one layout; GPU 0 lists GIs 9, 10, 3, 2 and GPU 1 13, 14, 5, 1.
    node = sim("a100-80x2:1g.10gb@2+1g.10gb@3+2g.20gb@0+3g.40gb@4", ids="driver")
    assert node.gpu(0).layout == node.gpu(1).layout
    assert node.gpu(0).gi_ids != node.gpu(1).gi_ids
    for g in node.gpus():
        assert {gi.id for gi in g.gpu_instances if gi.size == 1} <= set(range(7, 15))


def test_seven_1g_without_placement_get_the_ids_dask_cuda_583_shows(sim: Sim) -> None:
    # dask-cuda issue #583, `nvidia-smi mig -cgi 19,19,19,19,19,19,19` on an A100-SXM4-40GB: GI IDs 9, 7, 8, 11,
    # 12, 13, 14 in that order (its fused-off compute slot is memory slice 3: no GI 10).
    node = sim("a100-40x8", ids="driver")
    index = next(g.index for g in node.gpus() if g.fused_slot == 3)
    ids = [gi_id(N.nvmlDeviceCreateGpuInstance(gpu(index), 19)) for _ in range(7)]
    assert ids == [9, 7, 8, 11, 12, 13, 14]
    with pytest.raises(N.NVMLError_InsufficientResources):
        N.nvmlDeviceCreateGpuInstance(gpu(index), 19)


def test_the_mig_user_guides_creation_orders_give_its_ids(sim: Sim) -> None:
    # NVIDIA MIG User Guide (A100-SXM4-40GB): `-cgi 9,19,14,19` gives GIs 2, 7, 4, 8 and `-lgi` shows 7 at 0:1,
    # 8 at 1:1, 4 at 2:2, 2 at 4:4; `-cgi 19,19,14,9` gives 13, 11, 3 and then Insufficient Resources.
    node = sim("a100-40x8", ids="driver")
    index = next(g.index for g in node.gpus() if g.fused_slot == 7)

    def cgi(profile_id: int) -> tuple[int, int]:
        info = N.nvmlGpuInstanceGetInfo(N.nvmlDeviceCreateGpuInstance(gpu(index), profile_id))
        return int(info.id), int(info.placement.start)

    assert [cgi(p) for p in (9, 19, 14, 19)] == [(2, 4), (7, 0), (4, 2), (8, 1)]
    for gi in [N.nvmlDeviceGetGpuInstanceById(gpu(index), i) for i in (2, 7, 4, 8)]:
        N.nvmlGpuInstanceDestroy(gi)
    assert [cgi(p)[0] for p in (19, 19, 14)] == [13, 11, 3]
    with pytest.raises(N.NVMLError_InsufficientResources):
        cgi(9)


def test_a_gpu_instance_recreated_on_the_same_slices_gets_its_id_back(sim: Sim) -> None:
    node = sim("h200:2g.35gb@2", ids="driver")
    before = node.gpu(0).gi_id_at(2)
    gi = N.nvmlDeviceGetGpuInstanceById(gpu(), before)
    N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    N.nvmlGpuInstanceDestroy(gi)
    assert gi_id(create_gi(gpu(), 14, 2, 2)) == before


def test_without_placement_two_3g_take_both_halves_and_nothing_else_fits(sim: Sim) -> None:
    sim("h200")
    first = N.nvmlGpuInstanceGetInfo(N.nvmlDeviceCreateGpuInstance(gpu(), 9))
    second = N.nvmlGpuInstanceGetInfo(N.nvmlDeviceCreateGpuInstance(gpu(), 9))
    assert {first.placement.start, second.placement.start} == {0, 4}
    assert {first.id, second.id} <= {1, 2} and first.id != second.id
    with pytest.raises(N.NVMLError_InsufficientResources):
        N.nvmlDeviceCreateGpuInstance(gpu(), 19)


def test_remaining_capacity_counts_what_still_fits(sim: Sim) -> None:
    sim("h200:3g.71gb@0")
    assert N.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu(), 19) == 3  # slices 4, 5, 6
    assert N.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu(), 5) == 0


def test_gpu_instances_are_listed_per_profile_into_a_caller_array(sim: Sim) -> None:
    node = sim("h200:1g.18gb@0+1g.18gb@1+3g.71gb@4")
    arr = (N.c_nvmlGpuInstance_t * 7)()
    count = c_uint(0)
    N.nvmlDeviceGetGpuInstances(gpu(), 19, arr, byref(count))
    truth = node.gpu(0)
    assert sorted(gi_id(arr[i]) for i in range(count.value)) == sorted([truth.gi_id_at(0), truth.gi_id_at(1)])


def test_gpu_instance_by_id_is_not_found_when_absent(sim: Sim) -> None:
    sim("h200")
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetGpuInstanceById(gpu(), 1)


def test_destroying_a_gi_with_a_compute_instance_is_in_use(sim: Sim) -> None:
    node = sim("h200:3g.71gb@0")
    gi = N.nvmlDeviceGetGpuInstanceById(gpu(), node.gpu(0).gi_id_at(0))
    with pytest.raises(N.NVMLError_InUse):
        N.nvmlGpuInstanceDestroy(gi)


def test_destroying_a_ci_with_a_process_is_in_use_and_without_it_succeeds(sim: Sim) -> None:
    node = sim("h200:3g.71gb@0")
    pid = node.start_process(node.mig_uuids(0)[0], memory_bytes=1 << 30)
    gi = N.nvmlDeviceGetGpuInstanceById(gpu(), node.gpu(0).gi_id_at(0))
    ci = N.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    with pytest.raises(N.NVMLError_InUse):
        N.nvmlComputeInstanceDestroy(ci)
    node.stop_process(pid)
    N.nvmlComputeInstanceDestroy(ci)
    N.nvmlGpuInstanceDestroy(gi)
    assert node.gpu(0).gpu_instances == ()


def test_a_destroyed_instances_handle_is_invalid_until_a_new_instance_reuses_it(sim: Sim) -> None:
    # nvml.h, GetMigDeviceHandleByIndex: the handle "would remain invalid and must be requested again [...]
    # Handles may be reused and their properties can change in the process."
    node = sim("h200:3g.71gb@0")
    gi = N.nvmlDeviceGetGpuInstanceById(gpu(), node.gpu(0).gi_id_at(0))
    mig = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)
    old_uuid = N.nvmlDeviceGetUUID(mig)
    N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    N.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpuInstanceGetInfo(gi)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetUUID(mig)
    new_gi = create_gi(gpu(), 14, 4, 2)  # a 2g elsewhere: a different instance
    N.nvmlGpuInstanceCreateComputeInstance(new_gi, N.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    fresh = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)
    # The stale handles now read the new instance: same address, other properties.
    assert N.nvmlGpuInstanceGetInfo(gi).id == N.nvmlGpuInstanceGetInfo(new_gi).id == node.gpu(0).gi_id_at(4)
    assert N.nvmlDeviceGetUUID(mig) == N.nvmlDeviceGetUUID(fresh) == node.mig_uuids(0)[0] != old_uuid
    assert N.nvmlDeviceGetName(mig) == "NVIDIA H200 MIG 2g.35gb"


def test_handle_reuse_is_deterministic_lowest_free_slot_first(sim: Sim) -> None:
    node = sim("h200:1g.18gb@0+1g.18gb@1+1g.18gb@2")
    truth = node.gpu(0)
    address = {
        N.nvmlDeviceGetUUID(h): ctypes.addressof(h.contents)
        for h in (N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), i) for i in range(3))
    }
    for start in (2, 0):  # destroy the 1g at 2, then the one at 0
        gi = N.nvmlDeviceGetGpuInstanceById(gpu(), truth.gi_id_at(start))
        N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
        N.nvmlGpuInstanceDestroy(gi)
    gi = create_gi(gpu(), 19, 5, 1)
    N.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    now = node.gpu(0)
    reborn = {
        N.nvmlDeviceGetUUID(h): ctypes.addressof(h.contents)
        for h in (N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), i) for i in range(2))
    }
    # The live 1g keeps its handle; the new one takes the first slot freed, the one the 1g at 0 had.
    assert reborn[truth.mig_uuid_at(1)] == address[truth.mig_uuid_at(1)]
    assert reborn[now.mig_uuid_at(5)] == address[truth.mig_uuid_at(0)]


def test_mig_calls_on_a_gpu_with_mig_disabled_are_not_supported(sim: Sim) -> None:
    sim("a100-40:-")
    assert N.nvmlDeviceGetMigMode(gpu()) == [0, 0]
    assert N.nvmlDeviceGetMaxMigDeviceCount(gpu()) == 0
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceCreateGpuInstance(gpu(), 19)


# ------------------------------------------------------------------------------------ compute instances
def test_smaller_compute_instances_fill_a_gpu_instance(sim: Sim) -> None:
    sim("h200")
    gi = create_gi(gpu(), 9, 0, 4)
    prof = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
    assert (prof.sliceCount, prof.instanceCount, prof.name) == (1, 3, "MIG 1c.3g.71gb")
    cis = [N.nvmlGpuInstanceCreateComputeInstance(gi, prof.id) for _ in range(3)]
    with pytest.raises(N.NVMLError_InsufficientResources):
        N.nvmlGpuInstanceCreateComputeInstance(gi, prof.id)
    assert [N.nvmlComputeInstanceGetInfo(c).id for c in cis] == [0, 1, 2]
    assert len(mig_handles(gpu())) == 3  # every compute instance is a MIG device


def test_a_hopper_2g_offers_a_second_one_slice_compute_profile_id_7_with_26_sms(sim: Sim) -> None:
    # 1c.2g.20gb REV1 on an H100 2g: NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1, ID 7, 26 SMs against 16 for the
    # plain 1c; it takes the instance's SMs, so nothing else fits beside it.
    sim("h100-80")
    gi = create_gi(gpu(), 14, 0, 2)
    rev1 = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1, 0)
    plain = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
    assert (rev1.id, rev1.sliceCount, rev1.multiprocessorCount, rev1.instanceCount) == (7, 1, 26, 1)
    assert (plain.id, plain.multiprocessorCount, plain.instanceCount) == (0, 16, 2)
    assert rev1.name == plain.name == "MIG 1c.2g.20gb"
    ci = N.nvmlGpuInstanceCreateComputeInstance(gi, rev1.id)
    assert N.nvmlComputeInstanceGetInfo(ci).profileId == 7
    assert N.nvmlDeviceGetAttributes(N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)).multiprocessorCount == 26
    with pytest.raises(N.NVMLError_InsufficientResources):
        N.nvmlGpuInstanceCreateComputeInstance(gi, plain.id)


def test_the_one_slice_rev1_profile_is_hoppers_and_needs_two_memory_slices(sim: Sim) -> None:
    # go-nvlib #85: a 1_SLICE_REV2 GPU instance takes 1_SLICE and 1_SLICE_REV1, a 1_SLICE one only 1_SLICE.
    sim("h200")
    wide = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(create_gi(gpu(), 15, 0, 2), 7, 0)
    assert (wide.multiprocessorCount, wide.sliceCount) == (26, 1)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpuInstanceGetComputeInstanceProfileInfo(create_gi(gpu(), 19, 2, 1), 7, 0)
    uninstall()
    sim("a100-80")
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpuInstanceGetComputeInstanceProfileInfo(create_gi(gpu(), 14, 0, 2), 7, 0)


def test_a_compute_profile_the_gpu_instance_lacks_is_not_supported(sim: Sim) -> None:
    sim("h200")
    gi = create_gi(gpu(), 9, 0, 4)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE, 0)


# ------------------------------------------------------------------------------------------ MIG devices
def test_mig_index_without_a_device_is_not_found_and_past_the_maximum_is_invalid(sim: Sim) -> None:
    sim("h200:3g.71gb@0")
    N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 1)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 7)


def test_mig_devices_are_re_enumerated_after_a_change(sim: Sim) -> None:
    node = sim("h200:3g.71gb@0+3g.71gb@4")
    before = [N.nvmlDeviceGetUUID(h) for h in mig_handles(gpu())]
    gone = node.gpu(0).mig_uuid_at(0)
    gi = N.nvmlDeviceGetGpuInstanceById(gpu(), node.gpu(0).gi_id_at(0))
    N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    after = [N.nvmlDeviceGetUUID(h) for h in mig_handles(gpu())]
    assert after == [u for u in before if u != gone] == list(node.mig_uuids(0))


def test_mig_uuid_is_stable_for_the_life_of_the_instance_and_new_after_recreation(sim: Sim) -> None:
    node = sim("h200:3g.71gb@0")
    old = node.mig_uuids(0)[0]
    assert N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)) == old
    gi = N.nvmlDeviceGetGpuInstanceById(gpu(), node.gpu(0).gi_id_at(0))
    N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    N.nvmlGpuInstanceCreateComputeInstance(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    new = N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0))
    assert new.startswith("MIG-") and new != old


def test_handle_by_uuid_accepts_mig_uuids_and_leads_back_to_the_parent(sim: Sim) -> None:
    node = sim()
    uuid = node.gpu(1).mig_uuid_at(6)
    mig = N.nvmlDeviceGetHandleByUUID(uuid)
    assert bool(N.nvmlDeviceIsMigDeviceHandle(mig))
    assert N.nvmlDeviceGetIndex(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == 1
    assert (N.nvmlDeviceGetGpuInstanceId(mig), N.nvmlDeviceGetComputeInstanceId(mig)) == (node.gpu(1).gi_id_at(6), 0)
    assert N.nvmlDeviceGetName(mig) == "NVIDIA H200 MIG 1g.18gb"
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetHandleByUUID("MIG-00000000-0000-0000-0000-000000000000")


def test_utilization_rates_are_not_supported_on_mig(sim: Sim) -> None:
    node = sim()
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetUtilizationRates(N.nvmlDeviceGetHandleByUUID(node.mig_uuids(0)[0]))
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetUtilizationRates(gpu())


def test_memory_of_a_mig_device_is_its_instance_and_its_processes(sim: Sim) -> None:
    node = sim()
    uuid = node.gpu(0).mig_uuid_at(4)  # the 2g.35gb
    handle = N.nvmlDeviceGetHandleByUUID(uuid)
    idle = N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)
    node.start_process(uuid, memory_bytes=3 << 30)
    mem = N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)
    assert (mem.total, mem.used - idle.used) == (33024 << 20, 3 << 30)
    assert mem.total == mem.reserved + mem.used + mem.free


@pytest.mark.parametrize(
    ("spec", "mib"),
    [("a100-40:1g.5gb@6", 3), ("a100-80:2g.20gb@4", 13), ("a100-40:3g.20gb@4", 11), ("h100-80:1g.10gb@6", 12)],
)
def test_an_idle_mig_device_shows_the_few_mib_a_real_driver_does_through_either_struct(
    sim: Sim, spec: str, mib: int
) -> None:
    # `nvidia-smi`'s MIG devices table on idle instances: 1g.5gb 3 MiB, 3g.20gb 11 MiB (NVIDIA MIG User Guide),
    # 2g.20gb 13 MiB (nvitop pull request #8), H100 1g.10gb 12 MiB. The v1 struct says the same as v2: a MIG device
    # has no reserve of its own to add to "used".
    node = sim(spec)
    handle = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)
    v2 = N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2)
    v1 = N.nvmlDeviceGetMemoryInfo(handle)
    assert (v1.used, v2.used, v2.reserved) == (mib << 20, mib << 20, 0)
    assert v1.total == v2.total == v1.used + v1.free == v2.reserved + v2.used + v2.free
    assert node.gpu(0).gpu_instances[0].idle_used_bytes == v1.used


def test_a_whole_gpu_counts_its_reserve_as_used_in_v1_and_apart_in_v2(sim: Sim) -> None:
    # nvml.h: v1 "used" is the "Sum of Reserved and Allocated device memory"; v2 accounts reserved separately.
    sim("h200:-")
    v2 = N.nvmlDeviceGetMemoryInfo(gpu(), version=N.nvmlMemory_v2)
    v1 = N.nvmlDeviceGetMemoryInfo(gpu())
    assert (v2.reserved, v2.used) == (700 << 20, 1 << 20)
    assert (v1.total, v1.used, v1.free) == (v2.total, v2.reserved + v2.used, v2.free)


# ------------------------------------------------------------------------------------------- processes
def test_processes_come_back_through_the_v3_size_probe(sim: Sim) -> None:
    node = sim()
    uuid = node.gpu(0).mig_uuid_at(0)
    pids = [node.start_process(uuid, memory_bytes=(i + 1) << 30) for i in range(3)]
    procs = N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByUUID(uuid))
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [
        (pids[i], (i + 1) << 30, node.gpu(0).gi_id_at(0), 0) for i in range(3)
    ]
    assert all(pid >= FAKE_PID_BASE for pid in pids)


def test_the_gpu_handle_lists_every_process_of_its_mig_devices(sim: Sim) -> None:
    node = sim()
    a, b = node.mig_uuids(0)[:2]
    node.start_process(a)
    node.start_process(b)
    assert len(N.nvmlDeviceGetComputeRunningProcesses(gpu(0))) == 2
    assert N.nvmlDeviceGetComputeRunningProcesses(gpu(1)) == []


@pytest.mark.integration
def test_a_real_process_disappears_once_its_pid_is_gone(sim: Sim) -> None:
    node = sim()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    uuid = node.mig_uuids(0)[0]
    node.start_process(uuid, pid=child.pid, memory_bytes=1 << 20)
    node.start_process(uuid, pid=os.getpid(), memory_bytes=1 << 20)
    procs = N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByUUID(uuid))
    assert [p.pid for p in procs] == [os.getpid()]


@pytest.mark.integration
def test_a_real_process_that_exited_unreaped_a_zombie_is_gone_from_the_device(sim: Sim) -> None:
    node = sim()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Exited, not waited for: a zombie until we reap it.
        wait_until(lambda: _proc_state(child.pid) == "Z", 30, "the child to exit", every_s=0.01)
        uuid = node.mig_uuids(0)[0]
        node.start_process(uuid, pid=child.pid, memory_bytes=1 << 20)
        procs = N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByUUID(uuid))
        assert [p.pid for p in procs] == []
        assert not pid_alive(child.pid)
    finally:
        child.wait(30)


def test_a_running_process_is_alive_and_a_zombie_is_not_whatever_its_command_name(tmp_path: Path) -> None:
    def fake(pid: int, stat: bytes) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_bytes(stat)

    me = os.getpid()
    fake(me, f"{me} (a) R (b) Z 1 1 1".encode())  # a command name may hold ") R ("; the state follows the last ")"
    assert not pid_alive(me, proc=tmp_path)
    assert pid_alive(me)  # the real /proc says running
    assert pid_alive(me, proc=tmp_path / "none")  # no /proc to read: the signal probe decides


def test_mistakes_on_the_node_handle_name_the_culprit(sim: Sim) -> None:
    node = sim()
    uuid = node.mig_uuids(0)[2]
    with pytest.raises(SimError, match="MIG-nope"):
        node.start_process("MIG-nope")
    with pytest.raises(SimError, match="do not fit"):
        node.start_process(uuid, memory_bytes=1 << 40)
    pid = node.start_process(uuid)
    with pytest.raises(SimError, match=f"pid {pid} already"):
        node.start_process(node.mig_uuids(0)[0], pid=pid)
    with pytest.raises(SimError, match="MIG is enabled"):
        node.start_process(node.gpu(0).uuid)


# ------------------------------------------------------------------------------------------- MIG mode
def test_set_mig_mode_with_processes_running_stays_pending_with_in_use(sim: Sim) -> None:
    node = sim("h200x2:3g.71gb@0")
    node.start_process(node.mig_uuids(0)[0])
    assert N.nvmlDeviceSetMigMode(gpu(0), N.NVML_DEVICE_MIG_DISABLE) == N.NVML_ERROR_IN_USE
    assert N.nvmlDeviceGetMigMode(gpu(0)) == [1, 0]
    assert N.nvmlDeviceSetMigMode(gpu(1), N.NVML_DEVICE_MIG_DISABLE) == N.NVML_SUCCESS
    assert N.nvmlDeviceGetMigMode(gpu(1)) == [0, 0]
    assert node.gpu(1).gpu_instances == ()


def test_a_gpu_reset_applies_the_pending_mig_mode_once_idle(sim: Sim) -> None:
    node = sim("h200:3g.71gb@0")
    pid = node.start_process(node.mig_uuids(0)[0])
    N.nvmlDeviceSetMigMode(gpu(0), N.NVML_DEVICE_MIG_DISABLE)
    with pytest.raises(SimError, match="still runs processes"):
        node.reset_gpu(0)
    node.stop_process(pid)
    node.reset_gpu(0)
    assert N.nvmlDeviceGetMigMode(gpu(0)) == [0, 0]


# ------------------------------------------------------------------------------------ faults on demand
def test_without_privileges_mig_changes_are_no_permission(sim: Sim) -> None:
    node = sim("h200:3g.71gb@0")
    node.set_privileged(False)
    with pytest.raises(N.NVMLError_NoPermission):
        create_gi(gpu(), 9, 4, 4)
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceSetMigMode(gpu(), 0)
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetMemoryInfo(gpu())  # aggregate MIG memory needs privileges
    assert N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(), 0)).total == 71168 << 20


def test_a_lost_gpu_answers_gpu_is_lost_and_the_others_keep_working(sim: Sim) -> None:
    node = sim()
    mig = N.nvmlDeviceGetHandleByUUID(node.mig_uuids(0)[0])
    node.lose_gpu(0)
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetMemoryInfo(mig)
    assert N.nvmlDeviceGetCount() == 2
    assert N.nvmlDeviceGetName(gpu(1)) == "NVIDIA H200"
    node.reset_gpu(0)
    assert N.nvmlDeviceGetMemoryInfo(mig).total == 71168 << 20


def test_an_injected_error_fires_once_on_the_named_call(sim: Sim) -> None:
    node = sim()
    node.inject_error("nvmlDeviceGetUUID", "UNKNOWN")
    with pytest.raises(N.NVMLError_Unknown):
        N.nvmlDeviceGetUUID(gpu(0))
    assert N.nvmlDeviceGetUUID(gpu(0)).startswith("GPU-")


def test_an_injected_error_can_target_one_gpu_and_persist_until_cleared(sim: Sim) -> None:
    node = sim()
    node.inject_error("nvmlDeviceGetPowerUsage", N.NVML_ERROR_GPU_IS_LOST, gpu=1, times=None)
    assert N.nvmlDeviceGetPowerUsage(gpu(0)) > 0
    for _ in range(3):
        with pytest.raises(N.NVMLError_GpuIsLost):
            N.nvmlDeviceGetPowerUsage(gpu(1))
    node.clear_errors()
    assert N.nvmlDeviceGetPowerUsage(gpu(1)) > 0


def test_an_injected_error_matches_the_versioned_c_symbol(sim: Sim) -> None:
    node = sim()
    node.inject_error("nvmlDeviceGetComputeRunningProcesses", "NO_PERMISSION")
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetComputeRunningProcesses(gpu(0))  # the C symbol is ..._v3


def test_injecting_an_unknown_error_name_is_refused(sim: Sim) -> None:
    node = sim()
    with pytest.raises(SimError, match="NOT_AN_ERROR"):
        node.inject_error("nvmlDeviceGetUUID", "NOT_AN_ERROR")


def test_error_strings_come_from_the_library_for_codes_pynvml_does_not_know(sim: Sim) -> None:
    sim()
    assert N.nvmlErrorString(N.NVML_ERROR_INSUFFICIENT_RESOURCES) == "Insufficient Resources"


# ------------------------------------------------------------------------------------------- clocks
def test_power_temperature_and_clocks_rise_with_activity(sim: Sim) -> None:
    node = sim("h200:7g.141gb@0")
    idle = (N.nvmlDeviceGetPowerUsage(gpu()), N.nvmlDeviceGetTemperature(gpu(), 0))
    assert N.nvmlDeviceGetClockInfo(gpu(), N.NVML_CLOCK_SM) == 345
    uuid = node.mig_uuids(0)[0]
    node.start_process(uuid)
    node.set_activity(uuid, sm=0.9, dram=0.5)
    busy = (N.nvmlDeviceGetPowerUsage(gpu()), N.nvmlDeviceGetTemperature(gpu(), 0))
    assert busy[0] > idle[0] and busy[1] > idle[1]
    assert N.nvmlDeviceGetClockInfo(gpu(), N.NVML_CLOCK_SM) == 1980
    assert busy[0] <= N.nvmlDeviceGetPowerManagementLimit(gpu())


# ------------------------------------------------------------------------------- Hopper profile fields
@pytest.mark.parametrize("model", ["h100-80", "h200"])
def test_hopper_profiles_have_the_engines_nvidia_smi_mig_lgip_prints(sim: Sim, model: str) -> None:
    # `nvidia-smi mig -lgip` on an H200 (NVIDIA/mig-parted#120): DEC 1/1/1/2/3/4/7, JPEG the same, OFA on 1g+me
    # and 7g only, and P2P "No" on every profile.
    sim(model)
    seen = {}
    for idx in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(), idx)
        except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
            continue
        seen[info.id] = (info.decoderCount, info.jpegCount, info.ofaCount, info.copyEngineCount, info.isP2pSupported)
    assert seen == {
        19: (1, 1, 0, 1, 0),
        20: (1, 1, 1, 1, 0),
        15: (1, 1, 0, 1, 0),
        14: (2, 2, 0, 2, 0),
        9: (3, 3, 0, 3, 0),
        5: (4, 4, 0, 4, 0),
        0: (7, 7, 1, 8, 0),
    }


# ------------------------------------------------------------------------------------ semantics of nvml.h
def test_get_index_of_a_mig_handle_is_the_index_get_mig_device_handle_by_index_takes(sim: Sim) -> None:
    # nvml.h, nvmlDeviceGetIndex: "When used with MIG device handles this API returns indices that can be
    # passed to nvmlDeviceGetMigDeviceHandleByIndex to retrieve an identical handle."
    node = sim()
    for i, uuid in enumerate(node.mig_uuids(1)):
        mig = N.nvmlDeviceGetHandleByUUID(uuid)
        index = N.nvmlDeviceGetIndex(mig)
        assert index == i
        same = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu(1), index)
        assert ctypes.addressof(same.contents) == ctypes.addressof(mig.contents)
    assert N.nvmlDeviceGetIndex(gpu(1)) == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: N.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu(), 19),
        lambda: N.nvmlDeviceGetGpuInstanceById(gpu(), first_gi_id()),
        lambda: N.nvmlDeviceGetGpuInstances(gpu(), 9, (N.c_nvmlGpuInstance_t * 2)(), byref(c_uint(0))),
        lambda: N.nvmlDeviceGetGpuInstancePossiblePlacements(gpu(), 9, None, byref(c_uint(0))),
    ],
    ids=["RemainingCapacity", "GetGpuInstanceById", "GetGpuInstances", "PossiblePlacements_v2"],
)
def test_calls_the_header_marks_requires_privileged_user_are_no_permission_unprivileged(
    sim: Sim, call: Callable[[], object]
) -> None:
    node = sim("h200:3g.71gb@0")
    call()  # privileged: answers
    node.set_privileged(False)
    with pytest.raises(N.NVMLError_NoPermission):
        call()
