"""Opaque NVML handles of the simulated library, and their reuse after an instance is destroyed.

nvml.h, ``nvmlDeviceGetMigDeviceHandleByIndex``: "If the compute instance is destroyed [...] the MIG device handle
would remain invalid and must be requested again using this API. Handles may be reused and their properties can
change in the process." So a destroyed instance's handle is refused (INVALID_ARGUMENT) only until the driver hands
its slot to a new instance; from then on the old handle silently reads the new one. The simulator models that
deterministically: handles of GPU instances, compute instances and MIG devices live in one pool per (kind, GPU), and
a new instance takes the lowest-numbered slot whose instance is gone before a fresh slot is made. Code that detects
a repartition by waiting for INVALID_ARGUMENT on a cached handle therefore fails here as it would on hardware.

GPU handles are never reused: a GPU does not go away while the library is loaded.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, ClassVar

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

__all__ = ["HandleTable"]


class HandleTable:
    """Handle structs by (kind, key), kept alive for the library's life so their addresses stay valid.

    ``kind`` is ``gpu`` (key: GPU index), ``gi``, ``ci`` or ``mig`` (key: the instance's lifetime serial).
    ``alive(kind, key)`` says whether the instance still exists; ``pool(kind, key)`` names the GPU it lives on.
    """

    _STRUCT: ClassVar[dict[str, Any]] = {
        "gpu": N.struct_c_nvmlDevice_t,
        "mig": N.struct_c_nvmlDevice_t,
        "gi": N.struct_c_nvmlGpuInstance_t,
        "ci": N.struct_c_nvmlComputeInstance_t,
    }

    def __init__(self, alive: Callable[[str, int], bool], pool: Callable[[str, int], int]) -> None:
        self._alive = alive
        self._pool_of = pool
        self._by_key: dict[tuple[str, int], Any] = {}  # (kind, key) -> struct, for live (or GPU) keys
        self._slots: dict[tuple[str, int], list[Any]] = {}  # (kind, GPU) -> structs in slot order
        self._owner: dict[int, tuple[str, int]] = {}  # struct address -> (kind, key) it refers to now

    def struct(self, kind: str, key: int) -> Any:
        """The handle struct of (kind, key), taking over a dead instance's slot of the same pool if there is one."""
        found = self._by_key.get((kind, key))
        if found is not None:
            return found
        s = None
        if kind != "gpu":
            slots = self._slots.setdefault((kind, self._pool_of(kind, key)), [])
            for candidate in slots:
                old = self._owner[ctypes.addressof(candidate)]
                if not self._alive(*old):
                    del self._by_key[old]
                    s = candidate
                    break
            if s is None:
                s = self._STRUCT[kind]()
                slots.append(s)
        else:
            s = self._STRUCT[kind]()
        self._by_key[(kind, key)] = s
        self._owner[ctypes.addressof(s)] = (kind, key)
        return s

    def lookup(self, address: int) -> tuple[str, int] | None:
        """What the handle at ``address`` refers to now (possibly an instance that is gone), or None if unknown."""
        return self._owner.get(address)
