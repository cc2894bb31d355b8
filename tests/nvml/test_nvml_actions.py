"""MIG changes through flexmig.nvml: create a GI with placement plus a spanning CI, destroy CIs then the GI, and
NVML refusals as flexmig errors."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.errors import (
    LayoutError,
    NvmlCallError,
    NvmlGpuLostError,
    NvmlInsufficientResourcesError,
    NvmlInUseError,
    NvmlNoPermissionError,
    NvmlNotFoundError,
)
from flexmig.nvml import Nvml
from flexmig.sim import SimNode, install, uninstall


@pytest.fixture
def node() -> SimNode:
    return install("h200x2:3g.71gb@0+2g.35gb@4")


@pytest.fixture
def nvml(node: SimNode) -> Iterator[Nvml]:
    with Nvml.open() as session:
        yield session


def test_create_instance_returns_the_new_mig_device_with_the_drivers_gi_id(node: SimNode, nvml: Nvml) -> None:
    dev = nvml.create_instance(0, "1g.18gb", 6)
    gi, ci = node.gpu(0).mig_device(dev.uuid)
    assert (dev.gpu_instance_id, dev.compute_instance_id) == (gi.id, ci.id) == (node.gpu(0).gi_id_at(6), 0)
    assert (gi.profile.name, gi.start, ci.slices) == ("1g.18gb", 6, 1)
    assert dev.memory_total_bytes == 16384 << 20 and dev.processes == ()
    assert dev.index == list(node.mig_uuids(0)).index(dev.uuid)


def test_create_instance_takes_the_placement_size_in_memory_slices(node: SimNode, nvml: Nvml) -> None:
    nvml.destroy_instance(1, node.gpu(1).gi_id_at(0))
    dev = nvml.create_instance(1, "3g.71gb", 0)  # size 4, not its 3 compute slices
    layout = node.gpu(1).layout
    assert layout is not None and layout.spec() == "3g.71gb@0+2g.35gb@4"
    assert node.gpu(1).mig_device(dev.uuid)[0].size == 4


def test_an_overlapping_create_is_insufficient_resources_and_changes_nothing(node: SimNode, nvml: Nvml) -> None:
    before = node.gpu(0)
    with pytest.raises(NvmlInsufficientResourcesError) as info:
        nvml.create_instance(0, "2g.35gb", 2)
    assert (info.value.code, info.value.name) == (23, "INSUFFICIENT_RESOURCES")
    assert "GPU 0 2g.35gb@2" in str(info.value)
    assert node.gpu(0) == before


def test_a_start_the_profile_never_allows_is_a_layout_error_naming_the_allowed_ones(nvml: Nvml) -> None:
    with pytest.raises(LayoutError, match=r"3g.71gb may start only at memory slice \{0,4\} on GPU 0, not 2"):
        nvml.create_instance(0, "3g.71gb", 2)


def test_an_unknown_profile_is_a_layout_error_listing_the_profiles(nvml: Nvml) -> None:
    with pytest.raises(LayoutError, match=r"no MIG profile '5g\.99gb'; profiles: 1g\.18gb"):
        nvml.create_instance(0, "5g.99gb", 0)


def test_when_the_compute_instance_fails_the_gpu_instance_is_rolled_back(node: SimNode, nvml: Nvml) -> None:
    node.inject_error("nvmlGpuInstanceCreateComputeInstance", "UNKNOWN")
    with pytest.raises(NvmlCallError) as info:
        nvml.create_instance(0, "1g.18gb", 6)
    assert info.value.call == "nvmlGpuInstanceCreateComputeInstance"
    layout = node.gpu(0).layout
    assert layout is not None and layout.spec() == "3g.71gb@0+2g.35gb@4"


def test_destroy_instance_removes_compute_instances_then_the_gpu_instance(node: SimNode, nvml: Nvml) -> None:
    nvml.destroy_instance(0, node.gpu(0).gi_id_at(4))
    assert node.gpu(0).gi_ids == (node.gpu(0).gi_id_at(0),)
    assert len(nvml.inventory().gpus[0].mig_devices) == 1


def test_destroying_an_instance_with_a_process_is_in_use(node: SimNode, nvml: Nvml) -> None:
    node.start_process(node.gpu(0).mig_uuid_at(0), memory_bytes=1 << 30)
    before = node.gpu(0).gi_ids
    gi_3g = node.gpu(0).gi_id_at(0)
    with pytest.raises(NvmlInUseError) as info:
        nvml.destroy_instance(0, gi_3g)
    assert info.value.target == f"GPU 0 GI {gi_3g}"
    assert node.gpu(0).gi_ids == before


def test_destroying_a_gi_that_is_not_there_is_not_found(node: SimNode, nvml: Nvml) -> None:
    absent = next(i for i in range(7, 15) if i not in node.gpu(0).gi_ids)
    with pytest.raises(NvmlNotFoundError):
        nvml.destroy_instance(0, absent)


def test_changes_without_privileges_are_no_permission(node: SimNode, nvml: Nvml) -> None:
    node.set_privileged(False)
    with pytest.raises(NvmlNoPermissionError):
        nvml.create_instance(0, "1g.18gb", 6)
    with pytest.raises(NvmlNoPermissionError):
        nvml.destroy_instance(0, node.gpu(0).gi_id_at(4))


def test_a_lost_gpu_refuses_changes_as_gpu_lost(node: SimNode, nvml: Nvml) -> None:
    gi_2g = node.gpu(1).gi_id_at(4)
    node.lose_gpu(1)
    with pytest.raises(NvmlGpuLostError):
        nvml.destroy_instance(1, gi_2g)


def test_possible_placements(nvml: Nvml) -> None:
    assert nvml.possible_placements(0, "2g.35gb") == ((0, 2), (2, 2), (4, 2))


def test_a_gpu_index_out_of_range_is_a_layout_error(nvml: Nvml) -> None:
    with pytest.raises(LayoutError, match="no GPU 5"):
        nvml.create_instance(5, "1g.18gb", 0)


def test_set_mig_mode_reports_pending_while_processes_run(node: SimNode, nvml: Nvml) -> None:
    node.start_process(node.mig_uuids(0)[0])
    assert nvml.set_mig_mode(0, False) is False
    assert nvml.set_mig_mode(1, False) is True
    inv = nvml.inventory()
    assert (inv.gpus[0].mig_current, inv.gpus[0].mig_pending) == (True, False)
    assert (inv.gpus[1].mig_current, inv.gpus[1].gpu_instances) == (False, ())


def test_a_hopper_1g_with_two_memory_slices_gets_the_compute_profile_with_all_26_sms() -> None:
    # Its GPU instance offers 1_SLICE (16 SMs) and 1_SLICE_REV1 (26 SMs), both one slice: take the one that uses
    # the whole instance, as go-nvlib #85 made mig-parted do.
    node = install("h100-80")
    try:
        with Nvml.open() as nvml:
            dev = nvml.create_instance(0, "1g.20gb", 0)
        _, ci = node.gpu(0).mig_device(dev.uuid)
        assert ci.profile_id == 7
        N.nvmlInit()
        try:
            handle = N.nvmlDeviceGetHandleByUUID(dev.uuid)
            assert N.nvmlDeviceGetAttributes(handle).multiprocessorCount == 26
        finally:
            N.nvmlShutdown()
    finally:
        uninstall()
