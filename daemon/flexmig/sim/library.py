"""The C-function surface of the simulated ``libnvidia-ml``: what ``pynvml.nvmlLib`` points at after install.

pynvml looks every C symbol up with ``getattr(nvmlLib, name)`` and calls it with ctypes arguments, so each method
here is named after a C symbol and speaks the C protocol: it returns an ``nvmlReturn_t`` int, writes outputs
through ``byref(...)`` arguments (``ref._obj``), fills caller-allocated arrays, and answers a NULL array with the
count (the size-probe protocol). Handles are pointers to opaque structs that the library keeps alive for its
whole life; a destroyed instance's handle is refused until a new instance takes its slot, as nvml.h allows
(:mod:`flexmig.sim.handles`). GPU- and compute-instance management lives in :mod:`flexmig.sim.instancecalls`, GPM in
:mod:`flexmig.sim.gpmcalls`; device-information families (PCI, BAR1, ECC, NVLink, ...) live in
:mod:`flexmig.sim.devinfo`, topology, C2C and field values in :mod:`flexmig.sim.topocalls`;
:data:`flexmig.sim.entrypoints.ENTRY_POINTS` says how each call treats a MIG handle. A driver release lacks some
of these entry points (:func:`library_for`, :mod:`flexmig.sim.drivers`).

Every call takes the node's lock: tests change the node from other threads while the daemon calls NVML.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.sim.boardcalls import BoardCalls
from flexmig.sim.cabi import INVALID as _INVALID
from flexmig.sim.cabi import SUCCESS as _SUCCESS
from flexmig.sim.cabi import entry as _entry
from flexmig.sim.cabi import int_arg as _int
from flexmig.sim.cabi import out as _out
from flexmig.sim.cabi import physical as _physical
from flexmig.sim.cabi import write_str as _write_str
from flexmig.sim.devinfo import DeviceInfoCalls
from flexmig.sim.drivers import DriverRelease
from flexmig.sim.faults import FaultTable, error_name
from flexmig.sim.gpm import GpmSnapshot
from flexmig.sim.gpmcalls import GpmCalls
from flexmig.sim.handles import HandleTable
from flexmig.sim.instancecalls import InstanceCalls
from flexmig.sim.memory import gpu_idle_used_bytes, gpu_reserved_bytes, idle_used_bytes
from flexmig.sim.model import MAX_MIG_DEVICES, ci_name, clock_table
from flexmig.sim.state import NvmlReturn, SimComputeInstance, SimGpu, SimGpuInstance, SimNodeState
from flexmig.sim.topocalls import TopologyCalls

__all__ = ["SimLibrary", "library_for"]

# nvmlErrorString of the codes pynvml has no text of its own for (it asks the library), as real drivers word them
# in published transcripts: `nvidia-smi mig -dgi` on a GPU instance with a compute instance ("Unable to destroy GPU
# instance ID 3 from GPU 0: In use by another client") and the MIG User Guide's `nvidia-smi mig -cgi 19,19,14,9`
# ("Unable to create a GPU instance on GPU 0 using profile 9: Insufficient Resources"). Other codes: their names.
_ERROR_TEXT = {
    int(N.NVML_ERROR_IN_USE): "In use by another client",
    int(N.NVML_ERROR_INSUFFICIENT_RESOURCES): "Insufficient Resources",
}


class SimLibrary(InstanceCalls, GpmCalls, DeviceInfoCalls, BoardCalls, TopologyCalls):
    """A Python object that implements libnvidia-ml's C functions over a :class:`SimNodeState`."""

    def __init__(self, state: SimNodeState, faults: FaultTable) -> None:
        self._state = state
        self._lock = state.lock
        self._faults = faults
        self._table = HandleTable(self._alive, self._pool)
        self._synced = -1  # state.serial when handles were last given to new instances
        self._born = state.clock()  # when the "driver" was loaded: energy counters start here
        self.answers: Any = None  # recorded answers (flexmig.sim.recorded.RecordedAnswers) that override the model
        self._samples: dict[int, tuple[Any, GpmSnapshot]] = {}  # GPM sample address -> (struct, snapshot)
        self.previous: Any = None  # what pynvml.nvmlLib held before install; uninstall puts it back

        def nvml_error_string(result: Any) -> bytes:
            # A plain function, not a method: pynvml assigns ``fn.restype`` on it, which a bound method refuses.
            code = _int(result)
            text = _ERROR_TEXT.get(code) or N.NVMLError._errcode_to_string.get(code)
            if text is None:
                text = error_name(code).replace("_", " ").title()
            return str(text).encode()

        self.nvmlErrorString = nvml_error_string

    # ------------------------------------------------------------------------------------------- handles
    def _alive(self, kind: str, key: int) -> bool:
        if kind == "gi":
            return key in self._state.gis_by_serial
        return kind == "gpu" or key in self._state.cis_by_serial

    def _pool(self, kind: str, key: int) -> int:
        if kind == "gi":
            return self._state.gis_by_serial[key].gpu.index
        return self._state.cis_by_serial[key].gi.gpu.index

    def _struct(self, kind: str, key: int) -> Any:
        self._sync_handles()
        return self._table.struct(kind, key)

    def _sync_handles(self) -> None:
        """Give every instance created since the last call its handles, in creation order (as a driver does at
        creation), so a new instance takes over a destroyed one's handle before anyone asks for it."""
        state = self._state
        if state.serial == self._synced:
            return
        self._synced = state.serial
        for serial in sorted(set(state.gis_by_serial) | set(state.cis_by_serial)):
            if serial in state.gis_by_serial:
                self._table.struct("gi", serial)
            else:
                self._table.struct("ci", serial)
                self._table.struct("mig", serial)

    def _intercept(self, name: str, args: tuple[Any, ...]) -> int | None:
        """A recorded answer for this call, if the node was built from a recording and has one (else None)."""
        if self.answers is None or not self.answers.covers(name):
            return None
        answered: int | None = self.answers.answer(self, name, args)
        return answered

    def _fill_handles(self, arr: Any, count: Any, kind: str, keys: list[int]) -> int:
        """NVML's caller-allocates protocol: too small an array gets INSUFFICIENT_SIZE and the count needed."""
        count.value = len(keys)
        if len(keys) > len(arr):
            return int(N.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, key in enumerate(keys):
            arr[i] = ctypes.pointer(self._struct(kind, key))
        return _SUCCESS

    def _give(self, ref: Any, kind: str, key: int) -> int:
        """Write the handle of (kind, key) through the output pointer ``ref``."""
        _out(ref).contents = self._struct(kind, key)
        return _SUCCESS

    def _lookup(self, handle: Any) -> tuple[str, int]:
        try:
            addr = ctypes.addressof(handle.contents)
        except (AttributeError, ValueError, TypeError):
            raise NvmlReturn(_INVALID) from None
        self._sync_handles()
        found = self._table.lookup(addr)
        if found is None or not self._alive(*found):
            raise NvmlReturn(_INVALID)
        return found

    def _live(self, gpu: SimGpu) -> SimGpu:
        if gpu.lost:
            raise NvmlReturn(N.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _device(self, handle: Any) -> tuple[SimGpu, SimComputeInstance | None]:
        """A GPU or MIG device handle -> (GPU, MIG device or None)."""
        kind, key = self._lookup(handle)
        if kind == "gpu":
            return self._live(self._state.gpus[key]), None
        if kind == "mig":
            ci = self._state.cis_by_serial.get(key)
            if ci is None:
                raise NvmlReturn(_INVALID)
            return self._live(ci.gi.gpu), ci
        raise NvmlReturn(_INVALID)

    def _gpu(self, handle: Any) -> SimGpu:
        """A physical-GPU handle (a MIG device handle is refused)."""
        gpu, ci = self._device(handle)
        if ci is not None:
            raise NvmlReturn(_INVALID)
        return gpu

    def _gi(self, handle: Any) -> SimGpuInstance:
        kind, key = self._lookup(handle)
        gi = self._state.gis_by_serial.get(key) if kind == "gi" else None
        if gi is None:
            raise NvmlReturn(_INVALID)
        self._live(gi.gpu)
        return gi

    def _ci(self, handle: Any) -> SimComputeInstance:
        kind, key = self._lookup(handle)
        ci = self._state.cis_by_serial.get(key) if kind == "ci" else None
        if ci is None:
            raise NvmlReturn(_INVALID)
        self._live(ci.gi.gpu)
        return ci

    def _gpu_hint(self, args: tuple[Any, ...]) -> int | None:
        """The GPU a call is about (for faults injected on one GPU), or None."""
        if not args:
            return None
        first = args[0]
        if isinstance(first, ctypes.c_uint):
            return int(first.value)
        try:
            kind, key = self._lookup(first)
        except NvmlReturn:
            return None
        if kind == "gpu":
            return key
        if kind in ("mig", "ci"):
            ci = self._state.cis_by_serial.get(key)
            return ci.gi.gpu.index if ci else None
        gi = self._state.gis_by_serial.get(key)
        return gi.gpu.index if gi else None

    # ------------------------------------------------------------------------------------- init, system
    def nvmlInitWithFlags(self, flags: Any) -> int:
        """Reference-counted init, like the real library."""
        with self._lock:
            self._state.init_count += 1
        return _SUCCESS

    def nvmlInit_v2(self) -> int:
        """Init without flags."""
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        """Drop one init reference; UNINITIALIZED if there is none."""
        with self._lock:
            if self._state.init_count <= 0:
                return int(N.NVML_ERROR_UNINITIALIZED)
            self._state.init_count -= 1
        return _SUCCESS

    @_entry
    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        return _write_str(buf, size, self._state.driver.version)

    @_entry
    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        return _write_str(buf, size, self._state.driver.nvml_version)

    @_entry
    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        _out(ref).value = self._state.driver.cuda_version
        return _SUCCESS

    @_entry
    def nvmlSystemGetCudaDriverVersion_v2(self, ref: Any) -> int:
        _out(ref).value = self._state.driver.cuda_version
        return _SUCCESS

    # ------------------------------------------------------------------------------------------- devices
    @_entry
    def nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        _out(ref).value = len(self._state.gpus)
        return _SUCCESS

    @_entry
    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        i = _int(index)
        if not 0 <= i < len(self._state.gpus):
            return _INVALID
        self._live(self._state.gpus[i])
        return self._give(ref, "gpu", i)

    @_entry
    def nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        raw = getattr(uuid, "value", uuid)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        found = self._state.by_uuid.get(text)
        if found is None:
            return int(N.NVML_ERROR_NOT_FOUND)
        if isinstance(found, SimGpu):
            self._live(found)
            return self._give(ref, "gpu", found.index)
        self._live(found.gi.gpu)
        return self._give(ref, "mig", found.serial)

    @_entry
    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        gpu, ci = self._device(handle)
        return _write_str(buf, size, self._faults.uuid(ci.uuid if ci else gpu.uuid))

    @_entry
    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        gpu, ci = self._device(handle)
        name = gpu.model.name if ci is None else f"{gpu.model.name} {ci_name(ci.gi.profile, ci.slices)}"
        return _write_str(buf, size, name)

    @_entry
    def nvmlDeviceGetIndex(self, handle: Any, ref: Any) -> int:
        gpu, ci = self._device(handle)
        # nvml.h: with MIG device handles it "returns indices that can be passed to
        # nvmlDeviceGetMigDeviceHandleByIndex to retrieve an identical handle".
        _out(ref).value = gpu.index if ci is None else gpu.mig_order.index(ci)
        return _SUCCESS

    @_entry
    def nvmlDeviceGetArchitecture(self, handle: Any, ref: Any) -> int:
        gpu, _ = self._device(handle)
        _out(ref).value = N.NVML_DEVICE_ARCH_HOPPER if gpu.model.gpm else N.NVML_DEVICE_ARCH_AMPERE
        return _SUCCESS

    @_entry
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        gpu, _ = self._device(handle)
        _out(major).value = 9 if gpu.model.gpm else 8
        _out(minor).value = 0
        return _SUCCESS

    @_entry
    def nvmlDeviceGetPersistenceMode(self, handle: Any, ref: Any) -> int:
        self._device(handle)  # a MIG device reads its GPU's persistence mode
        _out(ref).value = N.NVML_FEATURE_ENABLED
        return _SUCCESS

    @_entry
    def nvmlDeviceGetComputeMode(self, handle: Any, ref: Any) -> int:
        self._device(handle)
        _out(ref).value = N.NVML_COMPUTEMODE_DEFAULT
        return _SUCCESS

    @_entry
    def nvmlDeviceGetPerformanceState(self, handle: Any, ref: Any) -> int:
        _physical(self, handle)
        _out(ref).value = 0  # P0: datacenter GPUs with persistence mode stay in P0
        return _SUCCESS

    @_entry
    def nvmlDeviceGetFanSpeed(self, handle: Any, ref: Any) -> int:
        self._device(handle)
        return int(N.NVML_ERROR_NOT_SUPPORTED)  # SXM modules have no fan of their own

    def _memory(self, handle: Any) -> tuple[int, int, int]:
        """(total, reserved, allocated) bytes of a GPU or MIG device; allocated includes the idle overhead.

        A MIG device reserves nothing of its own (:mod:`flexmig.sim.memory`), so both struct versions show it the
        same few MiB used when idle, as ``nvidia-smi`` does.
        """
        gpu, ci = self._device(handle)
        if ci is not None:
            gi = ci.gi
            return gi.memory_total_bytes, 0, gi.memory_used_bytes() + idle_used_bytes(gi)
        if gpu.mig_current and not self._state.privileged:
            raise NvmlReturn(N.NVML_ERROR_NO_PERMISSION)  # aggregate MIG figures need privileges
        overhead = sum(idle_used_bytes(gi) for gi in gpu.gis.values()) if gpu.mig_current else gpu_idle_used_bytes()
        return gpu.memory_total_bytes, gpu_reserved_bytes(gpu.model), gpu.memory_used_bytes() + overhead

    @_entry
    def nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        # v1 (nvml.h): "used" is the "Sum of Reserved and Allocated device memory"; total = free + used.
        total, reserved, allocated = self._memory(handle)
        mem = _out(ref)
        mem.total, mem.used, mem.free = total, reserved + allocated, total - reserved - allocated
        return _SUCCESS

    @_entry
    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, ref: Any) -> int:
        mem = _out(ref)
        if mem.version != N.nvmlMemory_v2:
            return int(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        total, reserved, allocated = self._memory(handle)
        mem.total, mem.reserved, mem.used, mem.free = total, reserved, allocated, total - reserved - allocated
        return _SUCCESS

    @_entry
    def nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> int:
        gpu, ci = self._device(handle)
        if ci is not None or gpu.mig_current:
            return int(N.NVML_ERROR_NOT_SUPPORTED)  # "On MIG-enabled GPUs, querying utilization is not supported"
        util = _out(ref)
        util.gpu = round(100 * gpu.activity.sm)
        util.memory = round(100 * gpu.activity.dram)
        return _SUCCESS

    def _media_utilization(self, handle: Any, util_ref: Any, period_ref: Any) -> int:
        gpu, ci = self._device(handle)
        if ci is not None or gpu.mig_current:
            return int(N.NVML_ERROR_NOT_SUPPORTED)  # like utilization rates: not per GPU once MIG is enabled
        _out(util_ref).value = 0  # no video work on a compute node
        _out(period_ref).value = 167_000
        return _SUCCESS

    @_entry
    def nvmlDeviceGetEncoderUtilization(self, handle: Any, util_ref: Any, period_ref: Any) -> int:
        return self._media_utilization(handle, util_ref, period_ref)

    @_entry
    def nvmlDeviceGetDecoderUtilization(self, handle: Any, util_ref: Any, period_ref: Any) -> int:
        return self._media_utilization(handle, util_ref, period_ref)

    @_entry
    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count_ref: Any, since: Any) -> int:
        gpu, _ = self._device(handle)
        if gpu.mig_current:
            return int(N.NVML_ERROR_NOT_SUPPORTED)  # per-process utilization does not exist in MIG mode
        return int(N.NVML_ERROR_NOT_FOUND)  # no samples in the buffer since ``since``

    @_entry
    def nvmlDeviceGetPowerUsage(self, handle: Any, ref: Any) -> int:
        gpu = _physical(self, handle)
        limit = gpu.model.power_limit_w
        idle = 0.12 * limit
        value = round(1000 * (idle + (limit - idle) * self._state.gpu_load(gpu)))
        _out(ref).value = self._faults.reading("nvmlDeviceGetPowerUsage", gpu.index, value)
        return _SUCCESS

    @_entry
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any, ref: Any) -> int:
        _out(ref).value = 1000 * _physical(self, handle).model.power_limit_w
        return _SUCCESS

    @_entry
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, ref: Any) -> int:
        _out(ref).value = 1000 * _physical(self, handle).model.power_limit_w
        return _SUCCESS

    def _temperature(self, handle: Any, sensor: int) -> int:
        gpu = _physical(self, handle)
        if sensor != N.NVML_TEMPERATURE_GPU:
            raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
        return self._faults.reading("nvmlDeviceGetTemperature", gpu.index, round(31 + 44 * self._state.gpu_load(gpu)))

    @_entry
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, ref: Any) -> int:
        _out(ref).value = self._temperature(handle, _int(sensor))
        return _SUCCESS

    @_entry
    def nvmlDeviceGetTemperatureV(self, handle: Any, ref: Any) -> int:
        temp = _out(ref)
        if temp.version >> 24 != 1:
            return int(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        temp.temperature = self._temperature(handle, _int(temp.sensorType))
        return _SUCCESS

    def _clock(self, handle: Any, kind: int, current: bool) -> int:
        gpu = _physical(self, handle)
        table = clock_table(gpu.model)
        if kind == N.NVML_CLOCK_MEM:
            return table.mem
        if kind in (N.NVML_CLOCK_GRAPHICS, N.NVML_CLOCK_SM, N.NVML_CLOCK_VIDEO):
            busy = self._state.gpu_load(gpu) > 0.005
            return table.sm_max if (busy or not current) else table.sm_idle
        raise NvmlReturn(_INVALID)

    @_entry
    def nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, ref: Any) -> int:
        value = self._clock(handle, _int(kind), current=True)
        _out(ref).value = self._faults.reading("nvmlDeviceGetClockInfo", _physical(self, handle).index, value)
        return _SUCCESS

    @_entry
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, kind: Any, ref: Any) -> int:
        _out(ref).value = self._clock(handle, _int(kind), current=False)
        return _SUCCESS

    # ------------------------------------------------------------------------------------------ processes
    @_entry
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count_ref: Any, infos: Any) -> int:
        return DeviceInfoCalls._compute_processes(self, handle, count_ref, infos, True)

    @_entry
    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count_ref: Any, infos: Any) -> int:
        return DeviceInfoCalls._none_running(self, handle, count_ref)  # compute-only datacenter node

    @_entry
    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any, count_ref: Any, infos: Any) -> int:
        return DeviceInfoCalls._none_running(self, handle, count_ref)  # no MPS daemon on the simulated node

    # --------------------------------------------------------------------------------------- MIG devices
    @_entry
    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        _, ci = self._device(handle)
        if ci is not None:
            return int(N.NVML_ERROR_NOT_SUPPORTED)  # a MIG device cannot itself be partitioned ("doesn't support")
        gpu = self._gpu(handle)
        _out(current).value = int(gpu.mig_current)
        _out(pending).value = int(gpu.mig_pending)
        return _SUCCESS

    @_entry
    def nvmlDeviceSetMigMode(self, handle: Any, mode: Any, status_ref: Any) -> int:
        status = _out(status_ref)
        status.value = self._state.set_mig_mode(self._gpu(handle), _int(mode))
        return _SUCCESS

    @_entry
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, ref: Any) -> int:
        _out(ref).value = MAX_MIG_DEVICES if self._gpu(handle).mig_current else 0
        return _SUCCESS

    @_entry
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        i = _int(index)
        if not gpu.mig_current or not 0 <= i < MAX_MIG_DEVICES:
            return _INVALID
        if i >= len(gpu.mig_order):
            return int(N.NVML_ERROR_NOT_FOUND)
        return self._give(ref, "mig", gpu.mig_order[i].serial)

    @_entry
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, ref: Any) -> int:
        gpu, ci = self._device(handle)
        if ci is None:
            return _INVALID
        return self._give(ref, "gpu", gpu.index)

    @_entry
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, ref: Any) -> int:
        _, ci = self._device(handle)
        _out(ref).value = int(ci is not None)
        return _SUCCESS

    @_entry
    def nvmlDeviceGetGpuInstanceId(self, handle: Any, ref: Any) -> int:
        _, ci = self._device(handle)
        if ci is None:
            return _INVALID
        _out(ref).value = ci.gi.id
        return _SUCCESS

    @_entry
    def nvmlDeviceGetComputeInstanceId(self, handle: Any, ref: Any) -> int:
        _, ci = self._device(handle)
        if ci is None:
            return _INVALID
        _out(ref).value = ci.id
        return _SUCCESS


class _Absent:
    """Stands for an entry point a driver release lacks: looking it up raises AttributeError, which pynvml's
    ``_nvmlGetFunctionPointer`` turns into ``NVMLError_FunctionNotFound``, as a missing symbol of the real library."""

    def __init__(self, name: str, branch: int) -> None:
        self._name = name
        self._branch = branch

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        raise AttributeError(f"{self._name}: not in the libnvidia-ml of driver branch {self._branch}")


def library_for(release: DriverRelease) -> type[SimLibrary]:
    """The library class of a driver release: :class:`SimLibrary` without the entry points that release lacks."""
    missing = release.missing(name for name in dir(SimLibrary) if name.startswith("nvml"))
    if not missing:
        return SimLibrary
    absent = {name: _Absent(name, release.branch) for name in sorted(missing)}
    return type(f"SimLibrary{release.branch}", (SimLibrary,), {"__doc__": SimLibrary.__doc__, **absent})
