"""Device-information entry points, each checked against what nvml.h says about MIG device handles."""

from __future__ import annotations

import os
from collections.abc import Iterator
from ctypes import byref, c_uint

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.sim import SimNode
from support.simnode import gpu, mig, nvml_session

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"


@pytest.fixture
def node() -> Iterator[SimNode]:
    yield from nvml_session(SPEC)


def test_pci_info_gives_each_gpu_its_bus_id_and_a_mig_device_its_parents(node: SimNode) -> None:
    assert [N.nvmlDeviceGetPciInfo_v3(gpu(i)).busId for i in range(2)] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert N.nvmlDeviceGetPciInfo_v3(mig(node, g=1)).busId == "00000000:2A:00.0"
    assert N.nvmlDeviceGetHandleByPciBusId("00000000:2A:00.0").contents is not None
    assert N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId("00000000:2A:00.0")) == 1


def test_bar1_is_per_instance_on_a_mig_handle(node: SimNode) -> None:
    # nvml.h: "Per-instance information can be queried by using specific MIG device handles."
    whole = N.nvmlDeviceGetBAR1MemoryInfo(gpu())
    part = N.nvmlDeviceGetBAR1MemoryInfo(mig(node, 0))  # the 3g: 4 of 8 memory slices
    assert whole.bar1Total == 262144 << 20
    assert part.bar1Total == (whole.bar1Total // 2) - (1 << 20)
    node.set_privileged(False)
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetBAR1MemoryInfo(gpu())  # aggregate "only if the caller has appropriate privileges"


def test_attributes_only_support_mig_device_handles(node: SimNode) -> None:
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetAttributes_v2(gpu())  # nvml.h: "This API currently only supports MIG device handles."
    attrs = N.nvmlDeviceGetAttributes_v2(mig(node, 1))  # 2g.35gb
    assert (attrs.multiprocessorCount, attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (32, 2, 33024)
    assert (attrs.sharedDecoderCount, attrs.sharedJpegCount) == (2, 2)


def test_process_lists_in_every_struct_version_agree(node: SimNode) -> None:
    uuid = node.mig_uuids(0)[0]
    gi_id = node.gpu(0).mig_device(uuid)[0].id
    pid = node.start_process(uuid, memory_bytes=1 << 30)
    h = N.nvmlDeviceGetHandleByUUID(uuid)
    for fn in (N.nvmlDeviceGetComputeRunningProcesses_v2, N.nvmlDeviceGetComputeRunningProcesses_v3):
        assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in fn(h)] == [(pid, 1 << 30, gi_id)]
    assert N.nvmlDeviceGetGraphicsRunningProcesses(h) == []


def test_accounting_is_disabled_on_a_mig_gpu_and_not_asked_of_a_mig_device(node: SimNode) -> None:
    # nvml.h: "On MIG-enabled GPUs, accounting mode would be set to DISABLED"
    assert N.nvmlDeviceGetAccountingMode(gpu()) == N.NVML_FEATURE_DISABLED
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetAccountingMode(mig(node))


def test_memory_error_counters_follow_the_headers_mig_rule(node: SimNode) -> None:
    # nvml.h: per instance only "non-DRAM uncorrectable volatile errors"; volatile errors "using device handles
    # is currently not supported" on MIG-enabled GPUs.
    unc, corr, vol, agg = (
        N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        N.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        N.NVML_VOLATILE_ECC,
        N.NVML_AGGREGATE_ECC,
    )
    l2, dram = N.NVML_MEMORY_LOCATION_L2_CACHE, N.NVML_MEMORY_LOCATION_DRAM
    assert N.nvmlDeviceGetMemoryErrorCounter(mig(node), unc, vol, l2) == 0
    for args in ((unc, vol, dram), (corr, vol, l2), (unc, agg, l2)):
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetMemoryErrorCounter(mig(node), *args)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetMemoryErrorCounter(gpu(), unc, vol, l2)
    assert N.nvmlDeviceGetMemoryErrorCounter(gpu(), unc, agg, dram) == 0
    assert N.nvmlDeviceGetEccMode(gpu()) == [1, 1]


def test_nvlink_state_exists_for_the_models_links_only(node: SimNode) -> None:
    assert all(N.nvmlDeviceGetNvLinkState(gpu(), link) == 1 for link in range(18))
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetNvLinkState(gpu(), 18)  # Hopper SXM has 18 links
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetNvLinkState(mig(node), 0)


def test_affinity_puts_the_two_halves_of_the_gpus_on_the_two_sockets(node: SimNode) -> None:
    assert list(N.nvmlDeviceGetCpuAffinity(gpu(0), 2)) == [(1 << 64) - 1, 0]
    assert list(N.nvmlDeviceGetCpuAffinity(gpu(1), 2)) == [0, (1 << 64) - 1]
    assert list(N.nvmlDeviceGetMemoryAffinity(gpu(1), 1, N.NVML_AFFINITY_SCOPE_NODE)) == [0b10]
    assert list(N.nvmlDeviceGetCpuAffinity(mig(node, g=1), 2)) == [0, (1 << 64) - 1]  # the parent's


def test_energy_only_grows_and_thresholds_are_per_gpu(node: SimNode) -> None:
    node.set_activity(node.mig_uuids(0)[0], sm=0.9)
    first = N.nvmlDeviceGetTotalEnergyConsumption(gpu())
    assert N.nvmlDeviceGetTotalEnergyConsumption(gpu()) >= first
    assert N.nvmlDeviceGetTemperatureThreshold(gpu(), N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == 92
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetTemperatureThreshold(mig(node), N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)


def test_process_names_come_from_proc_and_simulated_processes_have_one(node: SimNode) -> None:
    assert N.nvmlSystemGetProcessName(os.getpid())
    fake = node.start_process(node.mig_uuids(0)[0], memory_bytes=0)
    assert N.nvmlSystemGetProcessName(fake) == "flexmig-sim-process"
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlSystemGetProcessName(fake + 1)


def test_supported_clocks_come_through_the_size_probe(node: SimNode) -> None:
    mems = N.nvmlDeviceGetSupportedMemoryClocks(gpu())
    assert mems == [3201]
    graphics = N.nvmlDeviceGetSupportedGraphicsClocks(gpu(), 3201)
    assert graphics[0] == 1980 and graphics[-1] >= 345
    count = c_uint(0)
    assert N.nvmlLib.nvmlDeviceGetSupportedMemoryClocks(gpu(), byref(count), None) == N.NVML_ERROR_INSUFFICIENT_SIZE
