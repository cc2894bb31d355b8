"""flexmig.nvml on a driver older than the symbols pynvml calls by default: branch 470 has no
``nvmlDeviceGetComputeRunningProcesses_v3``, ``nvmlDeviceGetMemoryInfo_v2``, ``nvmlDeviceGetGpuInstanceProfileInfoV``
or GPM, so every read falls back to the version the driver has, and says nothing wrong about it."""

from __future__ import annotations

import pytest

from flexmig.detect.internal import internal_fragmentation
from flexmig.detect.usage import InstanceUsage
from flexmig.mig import A100_40
from flexmig.nvml import GpmWindows, Nvml
from flexmig.sim import SimNode, install

SPEC = "a100-40x2@470.82.01:3g.20gb@4+2g.10gb@0+1g.5gb@2"


@pytest.fixture
def node() -> SimNode:
    return install(SPEC)


def test_inventory_on_driver_470_names_profiles_lists_processes_and_records_no_error(node: SimNode) -> None:
    pid = node.start_process(node.gpu(0).mig_uuid_at(4), memory_bytes=4 << 30)
    with Nvml.open() as nvml:
        inv = nvml.inventory()
    assert inv.driver_version == "470.82.01"
    gpu = inv.gpus[0]
    assert gpu.errors == () and inv.errors == ()
    assert sorted((gi.start, gi.profile_name) for gi in gpu.gpu_instances) == [
        (0, "2g.10gb"),
        (2, "1g.5gb"),
        (4, "3g.20gb"),
    ]
    assert {o.profile_id for o in gpu.offers or ()} == {19, 20, 14, 9, 5, 0}  # 470: +me, but no 1g.10gb yet
    busy = next(d for d in gpu.mig_devices if d.uuid == node.gpu(0).mig_uuid_at(4))
    assert [(p.pid, p.used_memory_bytes) for p in busy.processes or ()] == [(pid, 4 << 30)]
    assert gpu.memory_total_bytes == 40536 << 20


def test_sweeps_on_driver_470_read_memory_through_v1_and_skip_gpm_quietly(node: SimNode) -> None:
    gpm = GpmWindows(min_interval_s=1e-6)
    with Nvml.open() as nvml:
        for _ in range(3):
            samples = nvml.sample(gpm)
            assert all(g.errors == () for g in samples)
        idle = next(d for g in samples for d in g.mig_devices if d.uuid == node.gpu(0).mig_uuid_at(2))
        assert (idle.memory_used_bytes, idle.activity) == (3 << 20, None)  # what nvidia-smi shows: 3 MiB
    gpm.close()


def test_underuse_reads_what_the_driver_reports_through_v1(node: SimNode) -> None:
    # A 3g.20gb (4 memory slices of 4992 MiB) holding a 4864 MiB process needs one memory slice: v1 says 4864 MiB
    # plus the 11 MiB of an idle 3g.20gb, as the driver does, not plus a share of the GPU's reserve.
    uuid = node.gpu(0).mig_uuid_at(4)
    node.start_process(uuid, memory_bytes=4864 << 20)
    with Nvml.open() as nvml:
        dev = next(d for g in nvml.sample() for d in g.mig_devices if d.uuid == uuid)
    assert dev.memory_used_bytes == (4864 + 11) << 20
    usage = InstanceUsage(0, 4, "3g.20gb", 1.0, 1.0, 0.5, 0.5, dev.memory_used_bytes, dev.memory_total_bytes, 1)
    frag = internal_fragmentation(usage, A100_40.profile("3g.20gb"))
    assert (frag.memory_held, frag.memory_needed) == (4, 1)
