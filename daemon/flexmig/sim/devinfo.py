"""Device-information entry points of the simulated library: what ``nvidia-smi -q``, nvitop, gpustat and dask read.

PCI, BAR1, board identity (serial, brand, minor number, VBIOS, InfoROM, board ID), MIG-device attributes, process
lists in every struct version, PCIe counters and link, power state, temperature thresholds, energy, ECC, display,
accounting, P2P, NVLink, CPU and memory affinity, process names.

How each call treats a MIG device handle follows nvml.h where it says (``nvmlDeviceGetAttributes_v2`` "only supports
MIG device handles"; per-instance BAR1 "can be queried by using specific MIG device handles"; "On MIG-enabled GPUs,
accounting mode would be set to DISABLED"; memory error counters per instance only for "non-DRAM uncorrectable
volatile errors", volatile ones "using device handles is currently not supported"). Where the header is silent,
board identity reads as the parent's and physical telemetry (power state, thresholds, energy, PCIe counters,
NVLink, display, P2P) is NOT_SUPPORTED on a MIG handle; ``flexmig nvml record`` on a real GPU settles each case.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.mig import GpuModel
from flexmig.sim.cabi import INVALID, NOT_SUPPORTED, SUCCESS, LibraryCore, entry, int_arg, out, physical, write_str
from flexmig.sim.memory import bar1_total_bytes, gi_bar1_total_bytes
from flexmig.sim.model import MIB
from flexmig.sim.state import NvmlReturn, SimGpu

__all__ = ["DeviceInfoCalls", "pci_bus_id"]

# HGX baseboards put their eight SXM GPUs on these buses (as `nvidia-smi` lists them on HGX H100 systems).
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_PCI_DEVICE_ID = {"a100-40": 0x20B010DE, "a100-80": 0x20B210DE, "h100-80": 0x233010DE, "h200": 0x233510DE}
_PCI_SUBSYSTEM_ID = {"a100-40": 0x134F10DE, "a100-80": 0x147F10DE, "h100-80": 0x16C110DE, "h200": 0x18BE10DE}
_VBIOS = {
    "a100-40": "92.00.45.00.03",
    "a100-80": "92.00.45.00.06",
    "h100-80": "96.00.89.00.01",
    "h200": "96.00.AF.00.01",
}
_INFOROM_IMAGE = {"a100-40": "G506.0202.00.02", "a100-80": "G506.0212.00.01", "h100-80": "G520.0200.00.05"}
_INFOROM = {N.NVML_INFOROM_OEM: "2.1", N.NVML_INFOROM_ECC: "7.16"}  # the POWER object is absent on SXM modules
_THRESHOLDS = {
    N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92,
    N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89,
    N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95,
    N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87,
}
_NVLINKS = {"Ampere": 12, "Hopper": 18}
_CPUS_PER_SOCKET = 64  # the simulated host: two sockets of 64 logical CPUs, GPUs split between them
_ACCOUNTING_BUFFER = 4000
_P2P_INDICES = frozenset({0, 1, 2, 3, 4})  # READ, WRITE, NVLINK, ATOMICS, PCI


def pci_bus_id(gpu: SimGpu) -> str:
    """The GPU's PCI bus ID as NVML writes it (``00000000:18:00.0``)."""
    return f"00000000:{_bus(gpu):02X}:00.0"


def _bus(gpu: SimGpu) -> int:
    return _HGX_BUSES[gpu.index] if gpu.index < len(_HGX_BUSES) else 0x100 - len(_HGX_BUSES) + gpu.index


def _serial(gpu: SimGpu) -> str:
    """A 13-digit board serial, fixed by the GPU's UUID (real ones are 13 digits, e.g. 1654922012345)."""
    return str(1650000000000 + zlib.crc32(gpu.uuid.encode()) % 10_000_000_000)


def _socket(gpu: SimGpu, count: int) -> int:
    return 0 if gpu.index < max(1, count // 2) else 1


def _load_kbps(load: float) -> int:
    return round(4_000_000 * load)  # KB/s, up to ~4 GB/s under full load (host-device copies of a training job)


def _link_gen(model: GpuModel) -> int:
    return 5 if model.architecture == "Hopper" else 4


class DeviceInfoCalls:
    """Mixed into :class:`~flexmig.sim.library.SimLibrary`; every method is one C entry point."""

    # ------------------------------------------------------------------------------------------------- PCI
    def _fill_pci(self: LibraryCore, handle: Any, ref: Any, legacy_only: bool) -> int:
        gpu, _ = self._device(handle)  # a MIG device sits on its parent's bus
        pci = out(ref)
        bus_id = pci_bus_id(gpu)
        pci.domain, pci.bus, pci.device = 0, _bus(gpu), 0
        pci.pciDeviceId = _PCI_DEVICE_ID.get(gpu.model.key, 0x20B010DE)
        pci.pciSubSystemId = _PCI_SUBSYSTEM_ID.get(gpu.model.key, 0x134F10DE)
        legacy = bus_id[4:].encode()  # 16-byte field: "0000:18:00.0"
        if legacy_only:
            pci.busId = legacy
        else:
            pci.busIdLegacy = legacy
            pci.busId = bus_id.encode()
        return SUCCESS

    @entry
    def nvmlDeviceGetPciInfo_v3(self: LibraryCore, handle: Any, ref: Any) -> int:
        return DeviceInfoCalls._fill_pci(self, handle, ref, legacy_only=False)

    @entry
    def nvmlDeviceGetPciInfo_v2(self: LibraryCore, handle: Any, ref: Any) -> int:
        return DeviceInfoCalls._fill_pci(self, handle, ref, legacy_only=False)

    @entry
    def nvmlDeviceGetHandleByPciBusId_v2(self: LibraryCore, bus_id: Any, ref: Any) -> int:
        raw = getattr(bus_id, "value", bus_id)
        text = (raw.decode() if isinstance(raw, bytes) else str(raw)).upper()
        for gpu in self._state.gpus:
            if text in (pci_bus_id(gpu), pci_bus_id(gpu)[4:]):
                self._live(gpu)
                return int(self._give(ref, "gpu", gpu.index))
        return int(N.NVML_ERROR_NOT_FOUND)

    @entry
    def nvmlDeviceGetHandleBySerial(self: LibraryCore, serial: Any, ref: Any) -> int:
        raw = getattr(serial, "value", serial)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        for gpu in self._state.gpus:
            if _serial(gpu) == text:
                self._live(gpu)
                return self._give(ref, "gpu", gpu.index)
        return int(N.NVML_ERROR_NOT_FOUND)

    # ------------------------------------------------------------------------------------------------ BAR1
    @entry
    def nvmlDeviceGetBAR1MemoryInfo(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu, ci = self._device(handle)
        bar1 = out(ref)
        if ci is not None:
            total = gi_bar1_total_bytes(ci.gi)
            used = 2 * MIB if ci.processes else 0
        else:
            if gpu.mig_current and not self._state.privileged:
                raise NvmlReturn(N.NVML_ERROR_NO_PERMISSION)  # "aggregate information, only if [...] privileges"
            total = bar1_total_bytes(gpu.model)
            used = MIB + 2 * MIB * sum(1 for _ in gpu.all_processes())
        bar1.bar1Total, bar1.bar1Used, bar1.bar1Free = total, used, total - used
        return SUCCESS

    # -------------------------------------------------------------------------------------- board identity
    @entry
    def nvmlDeviceGetSerial(self: LibraryCore, handle: Any, buf: Any, size: Any) -> int:
        gpu, _ = self._device(handle)
        return write_str(buf, size, _serial(gpu))

    @entry
    def nvmlDeviceGetBrand(self: LibraryCore, handle: Any, ref: Any) -> int:
        self._device(handle)
        out(ref).value = N.NVML_BRAND_NVIDIA  # datacenter GPUs report the "NVIDIA" brand on current drivers
        return SUCCESS

    @entry
    def nvmlDeviceGetMinorNumber(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu, _ = self._device(handle)
        out(ref).value = gpu.index  # /dev/nvidia<minor>
        return SUCCESS

    @entry
    def nvmlDeviceGetBoardId(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu, _ = self._device(handle)
        out(ref).value = _bus(gpu) << 8
        return SUCCESS

    @entry
    def nvmlDeviceGetMultiGpuBoard(self: LibraryCore, handle: Any, ref: Any) -> int:
        self._device(handle)
        out(ref).value = 0
        return SUCCESS

    @entry
    def nvmlDeviceGetBoardPartNumber(self: LibraryCore, handle: Any, buf: Any, size: Any) -> int:
        gpu, _ = self._device(handle)
        return write_str(buf, size, f"692-2G{_PCI_DEVICE_ID.get(gpu.model.key, 0) >> 16:04X}-0200-000")

    @entry
    def nvmlDeviceGetVbiosVersion(self: LibraryCore, handle: Any, buf: Any, size: Any) -> int:
        gpu, _ = self._device(handle)
        return write_str(buf, size, _VBIOS.get(gpu.model.key, "92.00.00.00.01"))

    @entry
    def nvmlDeviceGetInforomVersion(self: LibraryCore, handle: Any, obj: Any, buf: Any, size: Any) -> int:
        self._device(handle)
        version = _INFOROM.get(int_arg(obj))
        if version is None:
            raise NvmlReturn(INVALID if int_arg(obj) >= N.NVML_INFOROM_COUNT else NOT_SUPPORTED)
        return write_str(buf, size, version)

    @entry
    def nvmlDeviceGetInforomImageVersion(self: LibraryCore, handle: Any, buf: Any, size: Any) -> int:
        gpu, _ = self._device(handle)
        return write_str(buf, size, _INFOROM_IMAGE.get(gpu.model.key, "G520.0201.00.01"))

    @entry
    def nvmlDeviceGetVirtualizationMode(self: LibraryCore, handle: Any, ref: Any) -> int:
        self._device(handle)
        out(ref).value = N.NVML_GPU_VIRTUALIZATION_MODE_NONE  # bare metal
        return SUCCESS

    # -------------------------------------------------------------------------------------- MIG attributes
    @entry
    def nvmlDeviceGetAttributes_v2(self: LibraryCore, handle: Any, ref: Any) -> int:
        _, ci = self._device(handle)
        if ci is None:
            raise NvmlReturn(NOT_SUPPORTED)  # nvml.h: "This API currently only supports MIG device handles."
        p = ci.gi.profile
        attrs = out(ref)
        attrs.multiprocessorCount = ci.shape.sm_count
        attrs.sharedCopyEngineCount = p.copy_engines
        attrs.sharedDecoderCount = p.decoders
        attrs.sharedEncoderCount = p.encoders
        attrs.sharedJpegCount = p.jpegs
        attrs.sharedOfaCount = p.ofas
        attrs.gpuInstanceSliceCount = p.compute_slices
        attrs.computeInstanceSliceCount = ci.slices
        attrs.memorySizeMB = p.memory_mib
        return SUCCESS

    # ------------------------------------------------------------------------------------------- processes
    def _compute_processes(self: LibraryCore, handle: Any, count_ref: Any, infos: Any, with_ids: bool) -> int:
        gpu, ci = self._device(handle)
        if ci is None and gpu.mig_current and not self._state.privileged:
            raise NvmlReturn(N.NVML_ERROR_NO_PERMISSION)
        procs = self._state.live_processes(gpu, ci)
        count = out(count_ref)
        if infos is None or count.value < len(procs):
            count.value = len(procs)
            return int(N.NVML_ERROR_INSUFFICIENT_SIZE) if procs else SUCCESS
        for i, (p, gi_id, ci_id) in enumerate(procs):
            infos[i].pid = p.pid
            infos[i].usedGpuMemory = p.memory_bytes
            if with_ids:
                infos[i].gpuInstanceId = gi_id
                infos[i].computeInstanceId = ci_id
        count.value = len(procs)
        return SUCCESS

    @entry
    def nvmlDeviceGetComputeRunningProcesses_v2(self: LibraryCore, handle: Any, count_ref: Any, infos: Any) -> int:
        return DeviceInfoCalls._compute_processes(self, handle, count_ref, infos, True)

    @entry
    def nvmlDeviceGetComputeRunningProcesses(self: LibraryCore, handle: Any, count_ref: Any, infos: Any) -> int:
        # v1: nvmlProcessInfo_v1_t has only pid and usedGpuMemory.
        return DeviceInfoCalls._compute_processes(self, handle, count_ref, infos, False)

    def _none_running(self: LibraryCore, handle: Any, count_ref: Any) -> int:
        self._device(handle)
        out(count_ref).value = 0
        return SUCCESS

    @entry
    def nvmlDeviceGetGraphicsRunningProcesses_v2(self: LibraryCore, handle: Any, count_ref: Any, infos: Any) -> int:
        return DeviceInfoCalls._none_running(self, handle, count_ref)

    @entry
    def nvmlDeviceGetGraphicsRunningProcesses(self: LibraryCore, handle: Any, count_ref: Any, infos: Any) -> int:
        return DeviceInfoCalls._none_running(self, handle, count_ref)

    @entry
    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self: LibraryCore, handle: Any, count_ref: Any, infos: Any) -> int:
        return DeviceInfoCalls._none_running(self, handle, count_ref)

    @entry
    def nvmlSystemGetProcessName(self: LibraryCore, pid: Any, buf: Any, size: Any) -> int:
        p = int_arg(pid)
        where = self._state.pids.get(p)
        try:
            raw = (Path("/proc") / str(p) / "cmdline").read_bytes()
        except OSError:
            raw = b""
        name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        if not name:
            if where is None:
                raise NvmlReturn(N.NVML_ERROR_NOT_FOUND)
            name = "flexmig-sim-process"  # a simulated process has no /proc entry
        return write_str(buf, size, name)

    # -------------------------------------------------------------------------------- PCIe link, throughput
    @entry
    def nvmlDeviceGetPcieThroughput(self: LibraryCore, handle: Any, counter: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        c = int_arg(counter)
        if c not in (N.NVML_PCIE_UTIL_TX_BYTES, N.NVML_PCIE_UTIL_RX_BYTES):
            raise NvmlReturn(INVALID)
        load = self._state.gpu_load(gpu)
        out(ref).value = _load_kbps(load) // (2 if c == N.NVML_PCIE_UTIL_TX_BYTES else 1)
        return SUCCESS

    @entry
    def nvmlDeviceGetCurrPcieLinkGeneration(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu, _ = self._device(handle)
        out(ref).value = _link_gen(gpu.model)
        return SUCCESS

    @entry
    def nvmlDeviceGetMaxPcieLinkGeneration(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu, _ = self._device(handle)
        out(ref).value = _link_gen(gpu.model)
        return SUCCESS

    @entry
    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu, _ = self._device(handle)
        out(ref).value = _link_gen(gpu.model)
        return SUCCESS

    @entry
    def nvmlDeviceGetCurrPcieLinkWidth(self: LibraryCore, handle: Any, ref: Any) -> int:
        self._device(handle)
        out(ref).value = 16
        return SUCCESS

    @entry
    def nvmlDeviceGetMaxPcieLinkWidth(self: LibraryCore, handle: Any, ref: Any) -> int:
        self._device(handle)
        out(ref).value = 16
        return SUCCESS

    @entry
    def nvmlDeviceGetPcieReplayCounter(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = 0
        return SUCCESS

    # ------------------------------------------------------------------------- power state, heat, energy
    @entry
    def nvmlDeviceGetPowerState(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = N.NVML_PSTATE_0
        return SUCCESS

    @entry
    def nvmlDeviceGetTemperatureThreshold(self: LibraryCore, handle: Any, kind: Any, ref: Any) -> int:
        physical(self, handle)
        k = int_arg(kind)
        if not 0 <= k < N.NVML_TEMPERATURE_THRESHOLD_COUNT:
            raise NvmlReturn(INVALID)
        value = _THRESHOLDS.get(k)
        if value is None:
            raise NvmlReturn(NOT_SUPPORTED)  # acoustic and GPS thresholds: not on datacenter SXM modules
        out(ref).value = value
        return SUCCESS

    @entry
    def nvmlDeviceGetTotalEnergyConsumption(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        now = self._state.clock()
        _, totals = gpu.counters.snapshot(now)
        limit = gpu.model.power_limit_w
        idle = 0.12 * limit
        busy_s = 0.8 * totals[0] + 0.2 * totals[2]  # the integral of gpu_load over time
        joules = idle * max(0.0, now - self._born) + (limit - idle) * busy_s
        out(ref).value = round(1000 * joules)  # millijoules since the driver was loaded
        return SUCCESS

    @entry
    def nvmlDeviceGetPowerManagementMode(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = N.NVML_FEATURE_ENABLED
        return SUCCESS

    @entry
    def nvmlDeviceGetPowerManagementDefaultLimit(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        out(ref).value = 1000 * gpu.model.power_limit_w
        return SUCCESS

    @entry
    def nvmlDeviceGetPowerManagementLimitConstraints(self: LibraryCore, handle: Any, min_ref: Any, max_ref: Any) -> int:
        gpu = physical(self, handle)
        out(min_ref).value = 1000 * (gpu.model.power_limit_w // 7 * 2)  # 200 W of 700 W, 114 W of 400 W
        out(max_ref).value = 1000 * gpu.model.power_limit_w
        return SUCCESS

    def _clock_reasons(self: LibraryCore, handle: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        # GPU_IDLE (bit 0, the same in the old "throttle" and the new "event" names) while nothing runs.
        out(ref).value = 0 if self._state.gpu_load(gpu) > 0.005 else N.nvmlClocksEventReasonGpuIdle
        return SUCCESS

    @entry
    def nvmlDeviceGetCurrentClocksEventReasons(self: LibraryCore, handle: Any, ref: Any) -> int:
        return DeviceInfoCalls._clock_reasons(self, handle, ref)

    @entry
    def nvmlDeviceGetCurrentClocksThrottleReasons(self: LibraryCore, handle: Any, ref: Any) -> int:
        return DeviceInfoCalls._clock_reasons(self, handle, ref)

    @entry
    def nvmlDeviceGetSupportedClocksThrottleReasons(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = N.nvmlClocksThrottleReasonAll
        return SUCCESS

    @entry
    def nvmlDeviceGetSupportedClocksEventReasons(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = N.nvmlClocksEventReasonAll
        return SUCCESS

    # -------------------------------------------------------------------------------------------------- ECC
    @entry
    def nvmlDeviceGetEccMode(self: LibraryCore, handle: Any, current: Any, pending: Any) -> int:
        self._device(handle)
        out(current).value = N.NVML_FEATURE_ENABLED
        out(pending).value = N.NVML_FEATURE_ENABLED
        return SUCCESS

    @entry
    def nvmlDeviceGetDefaultEccMode(self: LibraryCore, handle: Any, ref: Any) -> int:
        self._device(handle)
        out(ref).value = N.NVML_FEATURE_ENABLED
        return SUCCESS

    def _ecc_allowed(self: LibraryCore, handle: Any, error: int, counter: int, location: int | None) -> None:
        """nvml.h's MIG rule for memory error counters (see the module docstring); raises when it refuses."""
        gpu, ci = self._device(handle)
        if error not in (N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            raise NvmlReturn(INVALID)
        if counter not in (N.NVML_VOLATILE_ECC, N.NVML_AGGREGATE_ECC):
            raise NvmlReturn(INVALID)
        if ci is not None:
            ok = (
                error == N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
                and counter == N.NVML_VOLATILE_ECC
                and location is not None
                and location != N.NVML_MEMORY_LOCATION_DRAM
            )
            if not ok:
                raise NvmlReturn(NOT_SUPPORTED)
        elif gpu.mig_current and counter == N.NVML_VOLATILE_ECC:
            raise NvmlReturn(NOT_SUPPORTED)  # "Querying volatile errors using device handles is not supported"

    @entry
    def nvmlDeviceGetTotalEccErrors(self: LibraryCore, handle: Any, error: Any, counter: Any, ref: Any) -> int:
        DeviceInfoCalls._ecc_allowed(self, handle, int_arg(error), int_arg(counter), None)
        out(ref).value = 0
        return SUCCESS

    @entry
    def nvmlDeviceGetDetailedEccErrors(self: LibraryCore, handle: Any, error: Any, counter: Any, ref: Any) -> int:
        DeviceInfoCalls._ecc_allowed(self, handle, int_arg(error), int_arg(counter), None)
        counts = out(ref)
        counts.l1Cache = counts.l2Cache = counts.deviceMemory = counts.registerFile = 0
        return SUCCESS

    @entry
    def nvmlDeviceGetMemoryErrorCounter(
        self: LibraryCore, handle: Any, error: Any, counter: Any, location: Any, ref: Any
    ) -> int:
        loc = int_arg(location)
        if not 0 <= loc < N.NVML_MEMORY_LOCATION_COUNT:
            raise NvmlReturn(INVALID)
        DeviceInfoCalls._ecc_allowed(self, handle, int_arg(error), int_arg(counter), loc)
        out(ref).value = 0
        return SUCCESS

    # --------------------------------------------------------------------------- display, accounting modes
    @entry
    def nvmlDeviceGetDisplayMode(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = N.NVML_FEATURE_ENABLED  # `nvidia-smi -q` on A100-SXM4-80GB and H100: Display Mode Enabled
        return SUCCESS

    @entry
    def nvmlDeviceGetDisplayActive(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = N.NVML_FEATURE_DISABLED  # ... and Display Active Disabled: no monitor attached
        return SUCCESS

    @entry
    def nvmlDeviceGetAccountingMode(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = N.NVML_FEATURE_DISABLED  # "On MIG-enabled GPUs, accounting mode would be set to DISABLED"
        return SUCCESS

    @entry
    def nvmlDeviceGetAccountingBufferSize(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).value = _ACCOUNTING_BUFFER
        return SUCCESS

    @entry
    def nvmlDeviceGetAccountingPids(self: LibraryCore, handle: Any, count_ref: Any, pids: Any) -> int:
        physical(self, handle)
        out(count_ref).value = 0  # accounting is disabled, so no pid was recorded
        return SUCCESS

    # ------------------------------------------------------------------------------------- P2P and NVLink
    @entry
    def nvmlDeviceGetP2PStatus(self: LibraryCore, first: Any, second: Any, index: Any, ref: Any) -> int:
        a = physical(self, first)  # MIG devices have no P2P (CUDA does none between them): NOT_SUPPORTED
        b = physical(self, second)
        i = int_arg(index)
        if i == N.NVML_P2P_CAPS_INDEX_UNKNOWN:
            out(ref).value = N.NVML_P2P_STATUS_UNKNOWN
            return SUCCESS
        if i not in _P2P_INDICES:
            raise NvmlReturn(INVALID)
        # The board's answer between two GPUs (``nvidia-smi topo -p2p``), MIG mode or not: NVLink through the
        # NVSwitches for reads, writes and atomics; plain PCIe P2P only between GPUs of one socket.
        if a is b:
            status = N.NVML_P2P_STATUS_NOT_SUPPORTED
        elif i != N.NVML_P2P_CAPS_INDEX_PCI or _socket(a, len(self._state.gpus)) == _socket(b, len(self._state.gpus)):
            status = N.NVML_P2P_STATUS_OK
        else:
            status = N.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
        out(ref).value = status
        return SUCCESS

    @entry
    def nvmlDeviceGetNvLinkCapability(self: LibraryCore, handle: Any, link: Any, cap: Any, ref: Any) -> int:
        physical(self, handle)
        # Drivers answer capabilities for every index below NVML_NVLINK_MAX_LINKS (36), links the GPU does not have
        # included, and refuse those only in the state query: measured on a B200 with 18 links (NVIDIA/TensorRT-LLM
        # pull request #19210, "capability TRUE: 36 indices [0..35]; state UP: 18 indices [0..17]").
        if not 0 <= int_arg(link) < N.NVML_NVLINK_MAX_LINKS:
            raise NvmlReturn(INVALID)
        c = int_arg(cap)
        if not 0 <= c < N.NVML_NVLINK_CAP_COUNT:
            raise NvmlReturn(INVALID)
        # GPU-to-GPU links through NVSwitch: peer access and atomics, no system memory over NVLink, no SLI.
        supported = {N.NVML_NVLINK_CAP_P2P_SUPPORTED, N.NVML_NVLINK_CAP_P2P_ATOMICS, N.NVML_NVLINK_CAP_VALID}
        out(ref).value = int(c in supported)
        return SUCCESS

    @entry
    def nvmlDeviceGetNvLinkState(self: LibraryCore, handle: Any, link: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        if not 0 <= int_arg(link) < _NVLINKS.get(gpu.model.architecture, 12):
            raise NvmlReturn(INVALID)
        out(ref).value = N.NVML_FEATURE_ENABLED
        return SUCCESS

    @entry
    def nvmlDeviceGetNvLinkVersion(self: LibraryCore, handle: Any, link: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        if not 0 <= int_arg(link) < _NVLINKS.get(gpu.model.architecture, 12):
            raise NvmlReturn(INVALID)
        out(ref).value = N.NVML_NVLINK_VERSION_4_0 if gpu.model.architecture == "Hopper" else N.NVML_NVLINK_VERSION_3_0
        return SUCCESS  # the nvmlNvlinkVersion_t values nvml.h documents from CUDA 12.8: 4.0 is 6, 3.0 is 4

    # ----------------------------------------------------------------------------------------- affinity
    def _affinity(self: LibraryCore, handle: Any, size: Any, ref: Any, words_per_socket: int) -> int:
        gpu, _ = self._device(handle)  # a MIG device has its parent's affinity
        n = int_arg(size)
        arr = out(ref)
        if n < 1:
            raise NvmlReturn(INVALID)
        socket = _socket(gpu, len(self._state.gpus))
        for i in range(min(n, len(arr))):
            arr[i] = 0
        bits = (1 << _CPUS_PER_SOCKET) - 1 if words_per_socket else 1 << socket
        word, shift = (socket, 0) if words_per_socket else (0, 0)
        if word < min(n, len(arr)):
            arr[word] = bits << shift
        return SUCCESS

    @entry
    def nvmlDeviceGetCpuAffinity(self: LibraryCore, handle: Any, size: Any, ref: Any) -> int:
        return DeviceInfoCalls._affinity(self, handle, size, ref, 1)

    @entry
    def nvmlDeviceGetCpuAffinityWithinScope(self: LibraryCore, handle: Any, size: Any, ref: Any, scope: Any) -> int:
        return DeviceInfoCalls._affinity(self, handle, size, ref, 1)

    @entry
    def nvmlDeviceGetMemoryAffinity(self: LibraryCore, handle: Any, size: Any, ref: Any, scope: Any) -> int:
        return DeviceInfoCalls._affinity(self, handle, size, ref, 0)
