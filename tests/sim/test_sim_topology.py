"""An HGX node as a real one answers: P2P, PCIe topology, NVLink version and ends, C2C, field values, error texts.

Sources: ``nvidia-smi topo -m`` of a DGX H100 (NV18 between all eight GPUs, four per socket); nvml.h (CUDA 12.8)
for nvmlNvlinkVersion_t; ``nvidia-smi nvlink -s`` (26.562 GB/s per H100 link); NVIDIA's own wording of IN_USE
("In use by another client") in ``nvidia-smi mig -dgi`` transcripts.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.sim import SimNode, install, uninstall
from support.simnode import gpu, mig, nvml_session

SPEC = "h200x8:3g.71gb@0+2g.35gb@4+1g.18gb@6"


@pytest.fixture
def node() -> Iterator[SimNode]:
    yield from nvml_session(SPEC)


def test_p2p_goes_over_nvlink_between_every_pair_of_gpus_in_mig_mode_too(node: SimNode) -> None:
    for other in range(1, 8):
        for index in (N.NVML_P2P_CAPS_INDEX_WRITE, N.NVML_P2P_CAPS_INDEX_NVLINK, N.NVML_P2P_CAPS_INDEX_ATOMICS):
            assert N.nvmlDeviceGetP2PStatus(gpu(0), gpu(other), index) == N.NVML_P2P_STATUS_OK
    with pytest.raises(N.NVMLError_NotSupported):  # MIG devices do no P2P
        N.nvmlDeviceGetP2PStatus(mig(node), gpu(1), N.NVML_P2P_CAPS_INDEX_NVLINK)


def test_a_tuple_where_ctypes_wants_an_int_is_an_argument_error_as_on_a_real_library(node: SimNode) -> None:
    # nvidia-ml-py spells NVML_P2P_CAPS_INDEX_READ as the tuple (0,): ctypes refuses it before any driver sees it.
    with pytest.raises(ctypes.ArgumentError, match="argument 3"):
        N.nvmlDeviceGetP2PStatus(gpu(0), gpu(1), N.NVML_P2P_CAPS_INDEX_READ)


def test_gpus_of_one_socket_meet_at_the_node_and_of_two_sockets_across_the_system(node: SimNode) -> None:
    assert N.nvmlDeviceGetTopologyCommonAncestor(gpu(0), gpu(3)) == N.NVML_TOPOLOGY_NODE
    assert N.nvmlDeviceGetTopologyCommonAncestor(gpu(0), gpu(4)) == N.NVML_TOPOLOGY_SYSTEM
    near = N.nvmlDeviceGetTopologyNearestGpus(gpu(0), N.NVML_TOPOLOGY_NODE)
    assert sorted(N.nvmlDeviceGetIndex(h) for h in near) == [1, 2, 3]
    assert sorted(N.nvmlDeviceGetIndex(h) for h in N.nvmlSystemGetTopologyGpuSet(64)) == [4, 5, 6, 7]


def test_hopper_links_are_nvlink_4_to_nvswitches_and_have_capabilities(node: SimNode) -> None:
    assert N.nvmlDeviceGetNvLinkVersion(gpu(), 0) == N.NVML_NVLINK_VERSION_4_0  # 6, not 4
    assert N.nvmlDeviceGetNvLinkRemoteDeviceType(gpu(), 17) == N.NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert N.nvmlDeviceGetNvLinkRemotePciInfo(gpu(), 0).busId.startswith("00000000:")
    assert N.nvmlDeviceGetNvLinkCapability(gpu(), 0, N.NVML_NVLINK_CAP_P2P_SUPPORTED) == 1
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetNvLinkRemoteDeviceType(gpu(), 18)


def test_link_capabilities_answer_up_to_nvmls_bound_and_the_state_only_for_real_links(node: SimNode) -> None:
    # NVIDIA/TensorRT-LLM pull request #19210, measured on a B200 with 18 links: "capability TRUE : 36 indices
    # [0..35]; state UP : 18 indices [0..17]", the rest of the state queries refused.
    caps = [N.nvmlDeviceGetNvLinkCapability(gpu(), link, N.NVML_NVLINK_CAP_P2P_SUPPORTED) for link in range(36)]
    assert caps == [1] * 36
    assert [N.nvmlDeviceGetNvLinkState(gpu(), link) for link in range(18)] == [1] * 18
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetNvLinkState(gpu(), 18)


def test_field_values_answer_power_and_nvlink_and_not_supported_for_the_rest(node: SimNode) -> None:
    fields = [
        N.NVML_FI_DEV_POWER_INSTANT,
        N.NVML_FI_DEV_POWER_AVERAGE,
        N.NVML_FI_DEV_NVLINK_LINK_COUNT,
        N.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON,
        (N.NVML_FI_DEV_NVLINK_GET_SPEED, 17),
        N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        N.NVML_FI_DEV_IS_RESETLESS_MIG_SUPPORTED,
        N.NVML_FI_DEV_MEMORY_TEMP,
    ]
    values = N.nvmlDeviceGetFieldValues(gpu(), fields)
    returns = [v.nvmlReturn for v in values]
    assert returns == [0, 0, 0, 0, 0, 0, 0, N.NVML_ERROR_NOT_SUPPORTED]
    assert values[0].value.uiVal == N.nvmlDeviceGetPowerUsage(gpu())
    assert (values[2].value.uiVal, values[3].value.uiVal, values[4].value.uiVal) == (18, 26562, 26562)
    assert values[6].value.uiVal == 1
    on_mig = N.nvmlDeviceGetFieldValues(mig(node), [N.NVML_FI_DEV_POWER_INSTANT])
    assert on_mig[0].nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED


def test_c2c_mode_reads_disabled_on_an_x86_hopper_and_does_not_exist_before_545(node: SimNode) -> None:
    assert N.nvmlDeviceGetC2cModeInfoV(gpu()).isC2cEnabled == 0
    uninstall()
    install("h100-80@535")
    N.nvmlInit()
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetC2cModeInfoV(gpu())
    N.nvmlShutdown()
    install(SPEC)  # for the fixture's teardown
    N.nvmlInit()


def test_error_strings_are_the_drivers(node: SimNode) -> None:
    assert N.nvmlErrorString(N.NVML_ERROR_IN_USE) == "In use by another client"
    assert N.nvmlErrorString(N.NVML_ERROR_INSUFFICIENT_RESOURCES) == "Insufficient Resources"
    gi = N.nvmlDeviceGetGpuInstanceById(gpu(), node.gpu(0).gi_id_at(0))
    with pytest.raises(N.NVMLError_InUse, match="In use by another client"):
        N.nvmlGpuInstanceDestroy(gi)
