"""The reads a sweep makes of every MIG device, through buffers made once per session.

pynvml's wrappers allocate a struct (whose attribute access goes through pynvml's formatting hooks) for every read,
and list processes in two calls (a count, then the array). A sweep of 56 MIG devices makes those reads a few hundred
times a second, so here each read calls the C entry point pynvml resolved (``_nvmlGetFunctionPointer``) with one
buffer kept for the session and read through plain ctypes structs of the same layout:

* memory (``nvmlDeviceGetMemoryInfo_v2``): one struct;
* compute processes (``nvmlDeviceGetComputeRunningProcesses_v3``): one array, sized for the most processes seen so
  far, so one call answers (nvml.h: ``infoCount`` gives the array's size and returns the number written;
  INSUFFICIENT_SIZE, with the count needed, when it is too small: the array grows and the call is made again);
* the UUID (``nvmlDeviceGetUUID``): one buffer.

A driver without a versioned entry point (before branch 510) is read through :mod:`flexmig.nvml.cache`'s fallbacks,
as :class:`~flexmig.nvml.cache.Missing` records; failures are noted in the walk exactly as those helpers do.
"""

from __future__ import annotations

import ctypes
from typing import Any, ClassVar

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.nvml.cache import Missing, memory_info, processes
from flexmig.nvml.calls import Walk
from flexmig.nvml.types import ProcessInfo

__all__ = ["SweepReads", "process_infos"]

_SUCCESS = N.NVML_SUCCESS
_INSUFFICIENT_SIZE = N.NVML_ERROR_INSUFFICIENT_SIZE
_FUNCTION_NOT_FOUND = N.NVML_ERROR_FUNCTION_NOT_FOUND
_NOT_AVAILABLE = N.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
_MEMORY_V2 = "nvmlDeviceGetMemoryInfo_v2"
_PROCESSES_V3 = "nvmlDeviceGetComputeRunningProcesses_v3"
_UUID_SIZE = N.NVML_DEVICE_UUID_V2_BUFFER_SIZE


class _Memory(ctypes.Structure):
    """``nvmlMemory_v2_t`` as a plain ctypes struct."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _Process(ctypes.Structure):
    """``nvmlProcessInfo_v2_t`` (which v3 is) as a plain ctypes struct."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


assert ctypes.sizeof(_Memory) == ctypes.sizeof(N.c_nvmlMemory_v2_t), "pynvml changed nvmlMemory_v2_t"
assert ctypes.sizeof(_Process) == ctypes.sizeof(N.c_nvmlProcessInfo_v3_t), "pynvml changed nvmlProcessInfo_v3_t"


def process_infos(raw: Any) -> tuple[ProcessInfo, ...] | None:
    """pynvml's process objects as ProcessInfo (None stays None: NVML would not list them)."""
    if raw is None:
        return None
    return tuple(ProcessInfo(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in raw)


class SweepReads:
    """The per-device reads of a sweep, with the session's buffers. One per :class:`~flexmig.nvml.Nvml`; used on
    the NVML thread only."""

    def __init__(self, missing: Missing) -> None:
        self._missing = missing
        self._memory = _Memory()
        self._memory_ref = ctypes.byref(self._memory)
        self._count = ctypes.c_uint(0)
        self._count_ref = ctypes.byref(self._count)
        self._procs = (_Process * 8)()
        self._uuid = ctypes.create_string_buffer(_UUID_SIZE)
        self._uuid_size = ctypes.c_uint(_UUID_SIZE)

    def _entry(self, name: str) -> Any:
        """The C entry point ``name``, or None when this driver lacks it (recorded in ``missing``)."""
        if name in self._missing.names:
            return None
        try:
            return N._nvmlGetFunctionPointer(name)
        except N.NVMLError as exc:
            if exc.value != _FUNCTION_NOT_FOUND:
                raise
            self._missing.names.add(name)
            return None

    def memory(self, walk: Walk, target: str, handle: Any) -> tuple[int, int] | None:
        """(total, used) bytes of a device's framebuffer, as :func:`flexmig.nvml.cache.memory_info` gives them."""
        fn = self._entry(_MEMORY_V2)
        if fn is not None:
            mem = self._memory
            mem.version = N.nvmlMemory_v2
            ret = fn(handle, self._memory_ref)
            if ret == _SUCCESS:
                return mem.total, mem.used
            if ret != _FUNCTION_NOT_FOUND:
                walk.note(target, "nvmlDeviceGetMemoryInfo", N.NVMLError(ret))
                return None
            self._missing.names.add(_MEMORY_V2)
        old = memory_info(walk, target, handle, self._missing)
        return None if old is None else (int(old.total), int(old.used))

    def processes(self, walk: Walk, target: str, handle: Any) -> tuple[ProcessInfo, ...] | None:
        """The compute processes on a device, as :func:`flexmig.nvml.cache.processes` lists them."""
        fn = self._entry(_PROCESSES_V3)
        if fn is not None:
            count = self._count
            for _ in range(3):  # processes may start between a too-small answer and the next call
                count.value = len(self._procs)
                ret = fn(handle, self._count_ref, self._procs)
                if ret != _INSUFFICIENT_SIZE:
                    break
                self._procs = (_Process * (count.value * 2 + 8))()
            if ret == _SUCCESS:
                return tuple(
                    ProcessInfo(p.pid, None if p.usedGpuMemory == _NOT_AVAILABLE else p.usedGpuMemory)
                    for p in self._procs[: count.value]
                )
            if ret != _FUNCTION_NOT_FOUND:
                walk.note(target, "nvmlDeviceGetComputeRunningProcesses", N.NVMLError(ret))
                return None
            self._missing.names.add(_PROCESSES_V3)
        return process_infos(processes(walk, target, handle, self._missing))

    def uuid(self, handle: Any) -> str:
        """The device's UUID (``nvmlDeviceGetUUID``); NVMLError when NVML will not say."""
        ret = N._nvmlGetFunctionPointer("nvmlDeviceGetUUID")(handle, self._uuid, self._uuid_size)
        if ret != _SUCCESS:
            raise N.NVMLError(ret)
        return self._uuid.value.decode()
