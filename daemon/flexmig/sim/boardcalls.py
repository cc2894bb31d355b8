"""Clock tables and the platform entry points ``nvidia-smi -q`` style clients ask about on every GPU.

Supported and applications clocks (``nvidia-smi -q -d SUPPORTED_CLOCKS,CLOCK``), row remapping (what A100 and
Hopper have instead of page retirement), and the calls a Linux datacenter GPU answers NOT_SUPPORTED: Windows
driver models, GPU operation modes (a Kepler-era feature), auto boost, page retirement, vGPU licensing,
confidential-computing memory. Physical-GPU facts, so a MIG handle gets NOT_SUPPORTED (nvml.h is silent).
"""

from __future__ import annotations

from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.sim.cabi import INVALID, NOT_SUPPORTED, SUCCESS, LibraryCore, entry, int_arg, out, physical
from flexmig.sim.model import clock_table
from flexmig.sim.state import NvmlReturn, SimGpu

__all__ = ["BoardCalls"]

_GRAPHICS_KINDS = (N.NVML_CLOCK_GRAPHICS, N.NVML_CLOCK_SM, N.NVML_CLOCK_VIDEO)


def _graphics_clocks(gpu: SimGpu) -> list[int]:
    """Supported graphics clocks, highest first, in 15 MHz steps down to the idle clock (as drivers list them)."""
    table = clock_table(gpu.model)
    return list(range(table.sm_max, table.sm_idle - 1, -15))


def _fill(count_ref: Any, arr: Any, values: list[int]) -> int:
    """NVML's caller-allocates protocol for a list of unsigned ints."""
    count = out(count_ref)
    if arr is None or count.value < len(values):
        count.value = len(values)
        return int(N.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, v in enumerate(values):
        arr[i] = v
    count.value = len(values)
    return SUCCESS


class BoardCalls:
    """Mixed into :class:`~flexmig.sim.library.SimLibrary`; every method is one C entry point."""

    @entry
    def nvmlDeviceGetSupportedMemoryClocks(self: LibraryCore, handle: Any, count_ref: Any, arr: Any) -> int:
        gpu = physical(self, handle)
        return _fill(count_ref, arr, [clock_table(gpu.model).mem])  # HBM runs at one clock

    @entry
    def nvmlDeviceGetSupportedGraphicsClocks(
        self: LibraryCore, handle: Any, mem_mhz: Any, count_ref: Any, arr: Any
    ) -> int:
        gpu = physical(self, handle)
        if int_arg(mem_mhz) != clock_table(gpu.model).mem:
            raise NvmlReturn(N.NVML_ERROR_NOT_FOUND)  # not a supported memory clock of this GPU
        return _fill(count_ref, arr, _graphics_clocks(gpu))

    def _app_clock(self: LibraryCore, handle: Any, kind: Any, ref: Any) -> int:
        gpu = physical(self, handle)
        k = int_arg(kind)
        table = clock_table(gpu.model)
        if k == N.NVML_CLOCK_MEM:
            out(ref).value = table.mem
        elif k in _GRAPHICS_KINDS:
            out(ref).value = table.sm_max
        else:
            raise NvmlReturn(INVALID)
        return SUCCESS

    @entry
    def nvmlDeviceGetApplicationsClock(self: LibraryCore, handle: Any, kind: Any, ref: Any) -> int:
        return BoardCalls._app_clock(self, handle, kind, ref)

    @entry
    def nvmlDeviceGetDefaultApplicationsClock(self: LibraryCore, handle: Any, kind: Any, ref: Any) -> int:
        return BoardCalls._app_clock(self, handle, kind, ref)

    @entry
    def nvmlDeviceGetMaxCustomerBoostClock(self: LibraryCore, handle: Any, kind: Any, ref: Any) -> int:
        return BoardCalls._app_clock(self, handle, kind, ref)

    @entry
    def nvmlDeviceGetRemappedRows(
        self: LibraryCore, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any
    ) -> int:
        physical(self, handle)
        for ref in (corr, unc, pending, failure):
            out(ref).value = 0
        return SUCCESS

    @entry
    def nvmlDeviceGetBridgeChipInfo(self: LibraryCore, handle: Any, ref: Any) -> int:
        physical(self, handle)
        out(ref).bridgeCount = 0  # SXM modules sit on the baseboard without a PCIe bridge chip of their own
        return SUCCESS

    def _not_supported(self: LibraryCore, handle: Any) -> int:
        self._device(handle)
        raise NvmlReturn(NOT_SUPPORTED)

    @entry
    def nvmlDeviceGetDriverModel_v2(self: LibraryCore, handle: Any, current: Any, pending: Any) -> int:
        return BoardCalls._not_supported(self, handle)  # WDDM/TCC driver models exist on Windows only

    @entry
    def nvmlDeviceGetDriverModel(self: LibraryCore, handle: Any, current: Any, pending: Any) -> int:
        return BoardCalls._not_supported(self, handle)

    @entry
    def nvmlDeviceGetGpuOperationMode(self: LibraryCore, handle: Any, current: Any, pending: Any) -> int:
        return BoardCalls._not_supported(self, handle)

    @entry
    def nvmlDeviceGetAutoBoostedClocksEnabled(self: LibraryCore, handle: Any, enabled: Any, default: Any) -> int:
        return BoardCalls._not_supported(self, handle)

    @entry
    def nvmlDeviceGetRetiredPages(self: LibraryCore, handle: Any, cause: Any, count: Any, addresses: Any) -> int:
        return BoardCalls._not_supported(self, handle)  # replaced by row remapping since the A100

    @entry
    def nvmlDeviceGetRetiredPagesPendingStatus(self: LibraryCore, handle: Any, ref: Any) -> int:
        return BoardCalls._not_supported(self, handle)

    @entry
    def nvmlDeviceGetGridLicensableFeatures_v4(self: LibraryCore, handle: Any, ref: Any) -> int:
        return BoardCalls._not_supported(self, handle)  # no vGPU software on a bare-metal node

    @entry
    def nvmlDeviceGetConfComputeMemSizeInfo(self: LibraryCore, handle: Any, ref: Any) -> int:
        return BoardCalls._not_supported(self, handle)  # confidential computing is off
