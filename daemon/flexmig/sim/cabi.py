"""How the simulated library speaks libnvidia-ml's C protocol: the entry-point wrapper and argument helpers.

pynvml calls every C symbol with ctypes arguments: inputs as Python ints or ``c_uint``-like values, outputs as
``byref(...)`` (a ``CArgObject``, whose ``_obj`` is the target), strings as a caller buffer plus its size, arrays as
the array object itself (NULL as ``None``). Every entry point returns an ``nvmlReturn_t`` int. These helpers are
shared by :mod:`flexmig.sim.library` and the modules that add entry-point families beside it.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.sim.faults import FaultTable
from flexmig.sim.state import NvmlReturn, SimComputeInstance, SimGpu, SimNodeState

__all__ = [
    "INVALID",
    "NOT_SUPPORTED",
    "NO_INIT",
    "SUCCESS",
    "LibraryCore",
    "entry",
    "int_arg",
    "out",
    "physical",
    "write_str",
]

SUCCESS: int = int(N.NVML_SUCCESS)
INVALID: int = int(N.NVML_ERROR_INVALID_ARGUMENT)
NOT_SUPPORTED: int = int(N.NVML_ERROR_NOT_SUPPORTED)
NO_INIT = frozenset({"nvmlInit_v2", "nvmlInitWithFlags", "nvmlInit"})

Fn = Callable[..., int]
_CARG = type(ctypes.byref(ctypes.c_int()))
# What ctypes converts for a C function without argtypes (pynvml sets none); anything else it refuses with
# ArgumentError before the library is reached, so the simulated library refuses it the same way.
_CONVERTIBLE = (
    int,
    bytes,
    str,
    type(None),
    ctypes._SimpleCData,
    ctypes._Pointer,
    ctypes.Array,
    ctypes.Structure,
    _CARG,
)


class LibraryCore(Protocol):
    """What an entry-point family needs from the library it is mixed into."""

    _state: SimNodeState
    _lock: threading.RLock
    _faults: FaultTable

    def _gpu_hint(self, args: tuple[Any, ...]) -> int | None: ...

    def _device(self, handle: Any) -> tuple[SimGpu, SimComputeInstance | None]: ...

    def _gpu(self, handle: Any) -> SimGpu: ...

    def _intercept(self, name: str, args: tuple[Any, ...]) -> int | None: ...

    def _live(self, gpu: SimGpu) -> SimGpu: ...

    def _give(self, ref: Any, kind: str, key: int) -> int: ...

    def _struct(self, kind: str, key: int) -> Any: ...

    @property
    def _born(self) -> float: ...


def entry(fn: Fn) -> Fn:
    """Wrap a C entry point: ctypes' argument conversion, lock, init check, injected faults, a recorded answer, and
    NvmlReturn -> return code."""
    name = fn.__name__

    @functools.wraps(fn)
    def call(self: LibraryCore, *args: Any) -> int:
        for n, arg in enumerate(args, 1):
            if not isinstance(arg, _CONVERTIBLE):
                raise ctypes.ArgumentError(f"argument {n}: TypeError: Don't know how to convert parameter {n}")
        with self._lock:
            if self._state.init_count <= 0 and name not in NO_INIT:
                return int(N.NVML_ERROR_UNINITIALIZED)
            if self._faults:
                code = self._faults.take(name, self._gpu_hint(args))
                if code:
                    return code
            try:
                answered = self._intercept(name, args)
                if answered is not None:
                    return answered
                return fn(self, *args)
            except NvmlReturn as ret:
                return ret.code

    return call


def physical(core: LibraryCore, handle: Any) -> SimGpu:
    """A GPU handle's GPU; a MIG device handle is NOT_SUPPORTED.

    For physical telemetry (power, temperature, clocks, PCIe counters, NVLink) nvml.h says nothing about MIG
    handles; a MIG handle is a valid device handle (so not INVALID_ARGUMENT), and the quantity is the board's, so
    the simulator answers that the device "does not support" it.
    """
    gpu, ci = core._device(handle)
    if ci is not None:
        raise NvmlReturn(NOT_SUPPORTED)
    return gpu


def int_arg(value: Any) -> int:
    """A C integer argument as Python int: pynvml passes some as ints, some as ``c_uint``."""
    v = getattr(value, "value", value)
    if not isinstance(v, int):
        raise NvmlReturn(INVALID)
    return v


def out(ref: Any) -> Any:
    """The object an output pointer argument points at (``byref(x)`` or ``pointer(x)``); NULL is invalid."""
    obj = getattr(ref, "_obj", None)
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer) and ref:
        return ref.contents
    raise NvmlReturn(INVALID)


def write_str(buf: Any, size: Any, text: str) -> int:
    """Copy ``text`` into a caller's char buffer of ``size`` bytes (INSUFFICIENT_SIZE when it does not fit)."""
    data = text.encode()
    if buf is None or len(data) + 1 > int_arg(size):
        raise NvmlReturn(N.NVML_ERROR_INSUFFICIENT_SIZE)
    buf.value = data
    return SUCCESS
