"""flexmig.nvml never trusts a MIG handle across a change: NVML may hand a destroyed device's handle to a new one.

nvml.h, ``nvmlDeviceGetMigDeviceHandleByIndex``: "Handles may be reused and their properties can change in the
process." The simulator reuses them deterministically, so these tests make the reuse happen on purpose.
"""

from __future__ import annotations

from ctypes import byref

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.nvml import Nvml
from flexmig.nvml.calls import Walk
from flexmig.sim import SimNode, install

SPEC = "h200:3g.71gb@0+1g.18gb@6"


@pytest.fixture
def node() -> SimNode:
    return install(SPEC)


def repartition_reusing_the_handle_of(node: SimNode, start: int) -> str:
    """Destroy the GI at ``start`` behind flexmig's back and create a 2g at 0 whose MIG device takes its handle slot;
    returns the new MIG device's UUID."""
    N.nvmlInit()
    try:
        dev = N.nvmlDeviceGetHandleByIndex(0)
        gi = N.nvmlDeviceGetGpuInstanceById(dev, node.gpu(0).gi_id_at(start))
        N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
        N.nvmlGpuInstanceDestroy(gi)
        placement = N.c_nvmlGpuInstancePlacement_t(0, 2)
        new = N.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 14, byref(placement))
        N.nvmlGpuInstanceCreateComputeInstance(new, N.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    finally:
        N.nvmlShutdown()
    return node.gpu(0).mig_uuid_at(0)


def test_reads_through_a_handle_reused_since_the_enumeration_are_dropped_not_misattributed(node: SimNode) -> None:
    with Nvml.open() as nvml:
        nvml.inventory()
        g = nvml._cache(0)
        walk = Walk()
        stale = next(m for m in g.mig_handles(walk) if m.uuid == node.gpu(0).mig_uuid_at(0))  # the 3g, before
        new_uuid = repartition_reusing_the_handle_of(node, 0)
        node.start_process(new_uuid, memory_bytes=5 << 30)
        sample = nvml._mig_sample(g, stale, None, walk, set())
        assert sample is not None  # enumerated in this sweep (confirmed): kept, its reads dropped
        assert N.nvmlDeviceGetUUID(stale.handle) == new_uuid  # the handle really was reused
        assert (sample.uuid, sample.memory_used_bytes, sample.processes) == (stale.uuid, None, None)
        assert [(i.name, i.target) for i in walk.take()] == [("HANDLE_REUSED", stale.uuid)]


def test_the_next_sweep_finds_the_new_device_under_its_own_uuid(node: SimNode) -> None:
    with Nvml.open() as nvml:
        old_3g = node.gpu(0).mig_uuid_at(0)
        assert old_3g in [d.uuid for g in nvml.sample() for d in g.mig_devices]
        new_uuid = repartition_reusing_the_handle_of(node, 0)
        pid = node.start_process(new_uuid, memory_bytes=5 << 30)
        swept = nvml.sample()
        after = {d.uuid: d for g in swept for d in g.mig_devices}
        assert old_3g not in after
        assert after[new_uuid].gpu_instance_id == node.gpu(0).gi_id_at(0)
        assert after[new_uuid].memory_total_bytes == 33024 << 20
        # Read as the new device in that very sweep (the handle kept from the last one is checked, not trusted).
        assert [p.pid for p in after[new_uuid].processes or ()] == [pid]
        assert swept[0].errors == ()
