"""flexmig.nvml's inventory read through the real pynvml wrappers over the simulator: it equals the ground truth,
and a failing field is None plus an issue, never a crash and never the end of the walk."""

from __future__ import annotations

import ctypes.util
from collections.abc import Iterator
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.errors import NvmlUnavailableError
from flexmig.nvml import Inventory, Nvml
from flexmig.sim import SimNode, install, uninstall

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"


@pytest.fixture
def node() -> SimNode:
    return install(SPEC)


@pytest.fixture
def nvml(node: SimNode) -> Iterator[Nvml]:
    with Nvml.open() as session:
        yield session


def inventory_view(inv: Inventory) -> list[dict[str, Any]]:
    """The inventory's content in the shape of the simulator's ground truth."""
    return [
        {
            "uuid": g.uuid,
            "mig": (g.mig_current, g.mig_pending),
            "lost": g.lost,
            "gis": [
                (
                    gi.id,
                    gi.profile_id,
                    gi.profile_name,
                    gi.start,
                    gi.size,
                    [(c.id, c.profile_id, c.start, c.size) for c in gi.compute_instances],
                )
                for gi in g.gpu_instances
            ],
            "mig_devices": [
                (
                    d.uuid,
                    d.gpu_instance_id,
                    d.compute_instance_id,
                    d.memory_total_bytes,
                    d.memory_used_bytes,
                    sorted((p.pid, p.used_memory_bytes) for p in d.processes or ()),
                )
                for d in g.mig_devices
            ],
        }
        for g in inv.gpus
    ]


def truth_view(node: SimNode) -> list[dict[str, Any]]:
    """The simulator's ground truth in the same shape."""
    out = []
    for g in node.gpus():
        devices = []
        for uuid in g.mig_uuids:
            gi, ci = g.mig_device(uuid)
            used = sum(p.memory_bytes for c in gi.compute_instances for p in c.processes) + gi.idle_used_bytes
            devices.append(
                (uuid, gi.id, ci.id, gi.memory_bytes, used, sorted((p.pid, p.memory_bytes) for p in ci.processes))
            )
        out.append(
            {
                "uuid": g.uuid,
                "mig": (g.mig_current, g.mig_pending),
                "lost": g.lost,
                "gis": [
                    (
                        gi.id,
                        gi.profile.profile_id,
                        gi.profile.name,
                        gi.start,
                        gi.size,
                        [(c.id, c.profile_id, c.start, c.slices) for c in gi.compute_instances],
                    )
                    for gi in g.gpu_instances
                ],
                "mig_devices": devices,
            }
        )
    return out


def test_inventory_equals_the_simulators_ground_truth(node: SimNode, nvml: Nvml) -> None:
    node.start_process(node.mig_uuids(0)[1], memory_bytes=5 << 30)
    node.start_process(node.mig_uuids(1)[0], memory_bytes=7 << 30)
    inv = nvml.inventory()
    assert inventory_view(inv) == truth_view(node)
    assert inv.errors == () and all(g.errors == () for g in inv.gpus)


def test_inventory_names_driver_gpus_and_profiles(nvml: Nvml) -> None:
    inv = nvml.inventory()
    assert inv.driver_version == "570.124.06"
    gpu = inv.gpus[0]
    assert (gpu.index, gpu.name, gpu.memory_total_bytes) == (0, "NVIDIA H200", 143771 << 20)
    assert sorted((gi.start, gi.profile_name, gi.size) for gi in gpu.gpu_instances) == [
        (0, "3g.71gb", 4),
        (4, "2g.35gb", 2),
        (6, "1g.18gb", 1),
    ]
    assert [gi.id for gi in gpu.gpu_instances] == sorted(gi.id for gi in gpu.gpu_instances)
    assert [d.index for d in gpu.mig_devices] == [0, 1, 2]
    assert [uuid for _, d in inv.mig_devices() for uuid in [d.uuid]][:3] == [d.uuid for d in gpu.mig_devices]


def test_inventory_reads_a_gpu_with_mig_disabled_read_only() -> None:
    install("a100-40x2:-")
    try:
        with Nvml.open() as nvml:
            inv = nvml.inventory()
        gpu = inv.gpus[1]
        assert (gpu.mig_current, gpu.mig_pending, gpu.gpu_instances, gpu.mig_devices) == (False, False, (), ())
        assert gpu.memory_total_bytes == 40960 << 20
    finally:
        uninstall()


def test_inventory_sees_a_gpu_instance_without_compute_instances_but_no_mig_device(node: SimNode, nvml: Nvml) -> None:
    truth = node.gpu(0)
    gi = N.nvmlDeviceGetGpuInstanceById(N.nvmlDeviceGetHandleByIndex(0), truth.gi_id_at(6))
    N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    gpu = nvml.inventory().gpus[0]
    assert [gi.id for gi in gpu.gpu_instances] == list(truth.gi_ids)
    assert [gi.compute_instances for gi in gpu.gpu_instances if gi.start == 6] == [()]
    assert {d.gpu_instance_id for d in gpu.mig_devices} == {truth.gi_id_at(0), truth.gi_id_at(4)}


def test_a_lost_gpu_is_marked_lost_and_the_walk_goes_on(node: SimNode, nvml: Nvml) -> None:
    nvml.inventory()
    node.lose_gpu(0)
    inv = nvml.inventory()
    lost, other = inv.gpus
    assert lost.lost and lost.uuid == node.gpu(0).uuid and lost.mig_devices == ()
    assert any(issue.name == "GPU_IS_LOST" for issue in lost.errors)
    assert not other.lost and len(other.mig_devices) == 3
    node.reset_gpu(0)
    assert not nvml.inventory().gpus[0].lost


def test_a_failing_field_is_none_with_an_issue_and_the_rest_is_read(node: SimNode, nvml: Nvml) -> None:
    node.inject_error("nvmlDeviceGetMemoryInfo", "UNKNOWN", gpu=0, times=None)
    inv = nvml.inventory()
    gpu0 = inv.gpus[0]
    assert gpu0.memory_total_bytes is None
    assert [d.memory_total_bytes for d in gpu0.mig_devices] == [None, None, None]
    assert [d.processes for d in gpu0.mig_devices] == [(), (), ()]
    assert {i.call for i in gpu0.errors} == {"nvmlDeviceGetMemoryInfo"}
    assert all(i.name == "UNKNOWN" and i.code == 999 for i in gpu0.errors)
    assert {d.memory_total_bytes for d in inv.gpus[1].mig_devices} == {71168 << 20, 33024 << 20, 16384 << 20}


def test_an_error_at_one_mig_index_skips_that_device_not_the_ones_after_it(node: SimNode, nvml: Nvml) -> None:
    # nvitop breaks out of its MIG loop at the first error; flexmig records it and goes on.
    node.inject_error("nvmlDeviceGetMigDeviceHandleByIndex", "UNKNOWN", gpu=1)
    gpu1 = nvml.inventory().gpus[1]
    assert len(gpu1.mig_devices) == 2
    assert [d.index for d in gpu1.mig_devices] == [1, 2]
    assert gpu1.errors[0].target == "GPU 1 MIG 0"


def test_without_privileges_aggregate_memory_is_none_and_recorded(node: SimNode, nvml: Nvml) -> None:
    node.set_privileged(False)
    gpu = nvml.inventory().gpus[0]
    assert gpu.memory_total_bytes is None
    # nvml.h marks GetGpuInstances "Requires privileged user": asked once, recorded once, not per profile.
    assert [(i.call, i.name) for i in gpu.errors] == [
        ("nvmlDeviceGetMemoryInfo", "NO_PERMISSION"),
        ("nvmlDeviceGetGpuInstances", "NO_PERMISSION"),
    ]
    assert gpu.gpu_instances == ()
    assert {d.memory_total_bytes for d in gpu.mig_devices} == {71168 << 20, 33024 << 20, 16384 << 20}
    assert [d.gpu_instance_id for d in gpu.mig_devices] == list(node.gpu(0).gi_ids)


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVIDIA driver is installed")
def test_open_without_a_driver_says_so() -> None:
    uninstall()
    with pytest.raises(NvmlUnavailableError, match="no NVIDIA driver found"):
        Nvml.open()


def test_close_after_the_simulator_went_away_is_quiet(node: SimNode) -> None:
    nvml = Nvml.open()
    uninstall()
    nvml.close()
    nvml.close()
