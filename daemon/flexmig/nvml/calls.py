"""The border between pynvml and flexmig: NVML failures become flexmig errors or recorded issues here.

Two ways to meet a failure, as nvitop's ``nvmlQuery`` does but without giving up on the rest of the walk:

* :func:`nvml_call` for actions (create, destroy): the failure is raised as a :class:`~flexmig.errors.NvmlCallError`
  subclass carrying the NVML code, its name, the call and the target;
* :class:`Walk` for reads: NOT_SUPPORTED gives ``None`` silently, any other failure gives ``None`` and an
  :class:`~flexmig.nvml.types.NvmlIssue`, and GPU_IS_LOST stops the walk of that one GPU (:class:`GpuLost`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import (
    NvmlCallError,
    NvmlGpuLostError,
    NvmlInsufficientResourcesError,
    NvmlInUseError,
    NvmlNoPermissionError,
    NvmlNotFoundError,
)
from flexmig.nvml.types import NvmlIssue

__all__ = ["GpuLost", "Walk", "call_error", "error_name", "nvml_call"]

T = TypeVar("T")

_NAMES: dict[int, str] = {
    value: attr.removeprefix("NVML_ERROR_")
    for attr, value in vars(N).items()
    if attr.startswith("NVML_ERROR_") and isinstance(value, int)
}
_SUBCLASS: dict[int, type[NvmlCallError]] = {
    N.NVML_ERROR_IN_USE: NvmlInUseError,
    N.NVML_ERROR_INSUFFICIENT_RESOURCES: NvmlInsufficientResourcesError,
    N.NVML_ERROR_NOT_FOUND: NvmlNotFoundError,
    N.NVML_ERROR_NO_PERMISSION: NvmlNoPermissionError,
    N.NVML_ERROR_GPU_IS_LOST: NvmlGpuLostError,
}
NOT_SUPPORTED = N.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = N.NVML_ERROR_GPU_IS_LOST
NOT_FOUND = N.NVML_ERROR_NOT_FOUND
INVALID_ARGUMENT = N.NVML_ERROR_INVALID_ARGUMENT
#: The code of issues that are no NVML error but answers flexmig refuses (a reading out of any physical range, a
#: UUID two devices report): NVML's own catch-all, so the issue stays an int code like the others.
OUT_OF_RANGE = N.NVML_ERROR_UNKNOWN
NO_PERMISSION = N.NVML_ERROR_NO_PERMISSION


def error_name(code: int) -> str:
    """``IN_USE`` for 19; log names and codes, never ``str(err)`` (pynvml has no text for 19, 23 and others)."""
    return _NAMES.get(code, f"UNKNOWN_{code}")


def call_error(call: str, exc: Any, target: str) -> NvmlCallError:
    """The flexmig error for pynvml error ``exc`` raised by ``call`` on ``target``."""
    code = int(exc.value)
    cls = _SUBCLASS.get(code, NvmlCallError)
    return cls(call, code, error_name(code), target)


def nvml_call(target: str, fn: Callable[..., T], *args: Any) -> T:
    """Call pynvml function ``fn``; an NVML failure is raised as an NvmlCallError naming ``target``."""
    try:
        return fn(*args)
    except N.NVMLError as exc:
        raise call_error(fn.__name__, exc, target) from exc


class GpuLost(Exception):
    """GPU_IS_LOST seen during a walk: abandon this GPU, keep walking the others."""


class Walk:
    """Collects the issues of one read-only walk of the node."""

    __slots__ = ("issues",)

    def __init__(self) -> None:
        self.issues: list[NvmlIssue] = []

    def get(self, target: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None when NVML cannot say (recorded unless NOT_SUPPORTED); GpuLost on GPU_IS_LOST."""
        try:
            return fn(*args)
        except N.NVMLError as exc:
            self.note(target, fn.__name__, exc)
            return None

    def note(self, target: str, call: str, exc: Any) -> None:
        """Record a failure of ``call``; raises GpuLost for GPU_IS_LOST."""
        code = int(exc.value)
        if code == GPU_IS_LOST:
            self.issues.append(NvmlIssue(call, code, error_name(code), target))
            raise GpuLost(target) from exc
        if code != NOT_SUPPORTED:
            self.issues.append(NvmlIssue(call, code, error_name(code), target))

    def bounded(self, target: str, call: str, value: T | None, lo: float, hi: float) -> T | None:
        """``value`` if NVML's answer is a number between ``lo`` and ``hi``; else None (unavailable), recorded as
        an ``OUT_OF_RANGE`` issue of ``call``. Drivers answer SUCCESS with sentinels such as 0xFFFFFFFF (a GPU at
        4,294,967,295 °C): exported as they come they would be believed; unavailable is the truth."""
        if value is None:
            return None
        if isinstance(value, int | float) and lo <= value <= hi:
            return value
        self.issues.append(NvmlIssue(call, OUT_OF_RANGE, "OUT_OF_RANGE", target))
        return None

    def take(self) -> tuple[NvmlIssue, ...]:
        """The issues so far, clearing them (one walk per GPU)."""
        out = tuple(self.issues)
        self.issues.clear()
        return out
