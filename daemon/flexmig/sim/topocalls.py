"""How the GPUs of a simulated HGX node are wired, and the field values a real one answers.

The node is an HGX baseboard: every GPU reaches every other over NVLink through NVSwitches (``nvidia-smi topo -m``
on a DGX H100 shows ``NV18`` between all eight GPUs, CPU affinity by socket, four GPUs per socket), and each GPU sits
behind a PCIe switch of its own, so two GPUs of one socket meet at the socket (``NODE``) and two of different
sockets across the interconnect (``SYS``). P2P status is the board's: what ``nvidia-smi topo -p2p`` prints between
two physical GPUs, MIG mode or not; MIG devices have none (CUDA does not do P2P between MIG devices), so a MIG handle
is NOT_SUPPORTED. Links are NVLink 4.0 on Hopper (18 links, 26.562 GB/s each as ``nvidia-smi nvlink -s`` prints)
and 3.0 on Ampere (12 links, 25 GB/s); the version is the ``nvmlNvlinkVersion_t`` value nvml.h documents from CUDA
12.8 (4.0 is 6, 3.0 is 4). Every link ends at an NVSwitch.

``nvmlDeviceGetC2cModeInfoV`` (nvml.h from CUDA 12.3, driver branch 545): the C2C link is Grace's; an x86 HGX
H100/H200 has it disabled, an A100 has no such mode (NOT_SUPPORTED). Assumed: the enabled flag reads 0 rather
than NOT_SUPPORTED on Hopper.

Field values (``nvmlDeviceGetFieldValues``): instant and average power (nvml.h from CUDA 12.2, branch 535), total
energy, NVLink link count, common and per-link speed (``NVLINK_GET_SPEED`` from CUDA 11.8, branch 520) and the
NVLink throughput counters (zero: MIG work does not cross NVLink), and resetless MIG (branch 535, Hopper). Every other
field answers NOT_SUPPORTED in its own slot, as the call does for fields a GPU lacks.
"""

from __future__ import annotations

from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.sim.cabi import INVALID, NOT_SUPPORTED, SUCCESS, LibraryCore, entry, int_arg, out, physical
from flexmig.sim.state import NvmlReturn, SimGpu

__all__ = ["TopologyCalls", "link_count", "link_speed_mbps"]

_LINKS = {"Hopper": 18, "Ampere": 12}
_SPEED_MBPS = {"Hopper": 26562, "Ampere": 25000}
_SWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)  # the baseboard's four NVSwitches, as their PCI buses (synthesized)
_CPUS_PER_SOCKET = 64  # as devinfo's affinity: two sockets of 64 logical CPUs


def link_count(gpu: SimGpu) -> int:
    """NVLinks of the GPU (18 on Hopper SXM, 12 on A100 SXM)."""
    return _LINKS.get(gpu.model.architecture, 12)


def link_speed_mbps(gpu: SimGpu) -> int:
    """Speed of one link in MB/s (``nvidia-smi nvlink -s``: 26.562 GB/s on H100, 25 GB/s on A100)."""
    return _SPEED_MBPS.get(gpu.model.architecture, 25000)


def _socket(gpu: SimGpu, count: int) -> int:
    return 0 if gpu.index < max(1, count // 2) else 1


def _level(a: SimGpu, b: SimGpu, count: int) -> int:
    if a is b:
        return int(N.NVML_TOPOLOGY_INTERNAL)
    return int(N.NVML_TOPOLOGY_NODE if _socket(a, count) == _socket(b, count) else N.NVML_TOPOLOGY_SYSTEM)


def _gpu_link(core: LibraryCore, handle: Any, link: Any) -> tuple[SimGpu, int]:
    gpu = physical(core, handle)
    n = int_arg(link)
    if not 0 <= n < link_count(gpu):
        raise NvmlReturn(INVALID)
    return gpu, n


class TopologyCalls:
    """Mixed into :class:`~flexmig.sim.library.SimLibrary`; every method is one C entry point."""

    # ---------------------------------------------------------------------------------------- PCIe topology
    @entry
    def nvmlDeviceGetTopologyCommonAncestor(self: LibraryCore, first: Any, second: Any, ref: Any) -> int:
        a, b = physical(self, first), physical(self, second)
        out(ref).value = _level(a, b, len(self._state.gpus))
        return SUCCESS

    def _fill_gpus(self: LibraryCore, gpus: list[SimGpu], count_ref: Any, arr: Any) -> int:
        count = out(count_ref)
        if arr is None:
            count.value = len(gpus)  # pynvml asks with NULL first and wants SUCCESS with the count
            return SUCCESS
        if count.value < len(gpus):
            count.value = len(gpus)
            return int(N.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, g in enumerate(gpus):
            arr[i] = N.c_nvmlDevice_t(self._struct("gpu", g.index))
        count.value = len(gpus)
        return SUCCESS

    @entry
    def nvmlDeviceGetTopologyNearestGpus(self: LibraryCore, handle: Any, level: Any, count_ref: Any, arr: Any) -> int:
        gpu = physical(self, handle)
        lvl = int_arg(level)
        n = len(self._state.gpus)
        near = [g for g in self._state.gpus if g is not gpu and _level(gpu, g, n) <= lvl]
        return TopologyCalls._fill_gpus(self, near, count_ref, arr)

    @entry
    def nvmlSystemGetTopologyGpuSet(self: LibraryCore, cpu: Any, count_ref: Any, arr: Any) -> int:
        c = int_arg(cpu)
        n = len(self._state.gpus)
        if not 0 <= c < 2 * _CPUS_PER_SOCKET:
            raise NvmlReturn(INVALID)
        socket = c // _CPUS_PER_SOCKET
        return TopologyCalls._fill_gpus(self, [g for g in self._state.gpus if _socket(g, n) == socket], count_ref, arr)

    # ---------------------------------------------------------------------------------------------- NVLink
    @entry
    def nvmlDeviceGetNvLinkRemoteDeviceType(self: LibraryCore, handle: Any, link: Any, ref: Any) -> int:
        _gpu_link(self, handle, link)
        out(ref).value = N.NVML_NVLINK_DEVICE_TYPE_SWITCH
        return SUCCESS

    @entry
    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self: LibraryCore, handle: Any, link: Any, ref: Any) -> int:
        _, n = _gpu_link(self, handle, link)
        bus = _SWITCH_BUSES[n % len(_SWITCH_BUSES)]
        pci = out(ref)
        pci.domain, pci.bus, pci.device = 0, bus, 0
        pci.pciDeviceId = 0x22A310DE  # an NVSwitch
        pci.busId = f"00000000:{bus:02X}:00.0".encode()
        pci.busIdLegacy = f"0000:{bus:02X}:00.0".encode()
        return SUCCESS

    # ------------------------------------------------------------------------------------------------- C2C
    @entry
    def nvmlDeviceGetC2cModeInfoV(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        if gpu.model.architecture != "Hopper":
            raise NvmlReturn(NOT_SUPPORTED)
        out(ref).isC2cEnabled = 0  # an x86 HGX board: no Grace at the other end
        return SUCCESS

    # --------------------------------------------------------------------------------------- field values
    @entry
    def nvmlDeviceGetFieldValues(self: LibraryCore, handle: Any, count: Any, values_ref: Any) -> int:
        gpu, ci = self._device(handle)
        values = out(values_ref)
        n = int_arg(count)
        if n < 0:
            raise NvmlReturn(INVALID)
        stamp = int(self._state.clock() * 1e6)
        for i in range(min(n, len(values))):
            v = values[i]
            v.timestamp = stamp
            v.latencyUsec = 0
            answer = None if ci is not None else _field(self, gpu, int(v.fieldId), int(v.scopeId))
            if answer is None:
                v.nvmlReturn = NOT_SUPPORTED
                continue
            kind, value = answer
            v.valueType = kind
            if kind == N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
                v.value.ullVal = value
            else:
                v.value.uiVal = value
            v.nvmlReturn = SUCCESS
        return SUCCESS


_UINT = int(N.NVML_VALUE_TYPE_UNSIGNED_INT)
_ULL = int(N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
_PER_LINK_SPEED = (
    *range(N.NVML_FI_DEV_NVLINK_SPEED_MBPS_L0, N.NVML_FI_DEV_NVLINK_SPEED_MBPS_L5 + 1),
    *range(N.NVML_FI_DEV_NVLINK_SPEED_MBPS_L6, N.NVML_FI_DEV_NVLINK_SPEED_MBPS_L11 + 1),
)
_THROUGHPUT = (
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
)


def _field(core: LibraryCore, gpu: SimGpu, field: int, scope: int) -> tuple[int, int] | None:
    """(value type, value) of one field of a physical GPU, None when it does not answer it."""
    branch = core._state.driver.branch
    hopper = gpu.model.architecture == "Hopper"
    if field in (N.NVML_FI_DEV_POWER_INSTANT, N.NVML_FI_DEV_POWER_AVERAGE):
        if branch < 535 or scope != 0:  # scope 0: the GPU (NVML_POWER_SCOPE_GPU)
            return None
        limit = gpu.model.power_limit_w
        idle = 0.12 * limit
        return _UINT, round(1000 * (idle + (limit - idle) * core._state.gpu_load(gpu)))
    if field == N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
        now = core._state.clock()
        _, totals = gpu.counters.snapshot(now)
        limit = gpu.model.power_limit_w
        idle = 0.12 * limit
        joules = idle * max(0.0, now - core._born) + (limit - idle) * (0.8 * totals[0] + 0.2 * totals[2])
        return _ULL, round(1000 * joules)
    if field == N.NVML_FI_DEV_NVLINK_LINK_COUNT:
        return _UINT, link_count(gpu)
    if field == N.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
        return _UINT, link_speed_mbps(gpu)
    if field in _PER_LINK_SPEED:
        return (_UINT, link_speed_mbps(gpu)) if _PER_LINK_SPEED.index(field) < link_count(gpu) else None
    if field == N.NVML_FI_DEV_NVLINK_GET_SPEED:
        return (_UINT, link_speed_mbps(gpu)) if branch >= 520 and 0 <= scope < link_count(gpu) else None
    if field in _THROUGHPUT:
        return _ULL, 0  # KiB through NVLink since the driver loaded: MIG work does not cross NVLink
    if field == N.NVML_FI_DEV_IS_RESETLESS_MIG_SUPPORTED:
        return (_UINT, 1 if hopper else 0) if branch >= 535 else None
    return None
