"""Errors injected into the simulated library on demand: "the next nvmlGpuInstanceDestroy on GPU 1 fails IN_USE".

Besides errors, the two ways real drivers have been seen to answer wrongly with SUCCESS: a reading that is a
sentinel rather than a value (a temperature of 4294967295 °C, ``0xFFFFFFFF``), and a MIG device that reports
another one's UUID. Tests set them with :meth:`FaultTable.garble` and :meth:`FaultTable.alias`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import SimError

__all__ = ["Fault", "FaultTable", "error_code", "error_name"]

_VERSION_SUFFIX = re.compile(r"(_v\d+|V)$")


def base_call(name: str) -> str:
    """A C symbol without its version suffix: ``nvmlDeviceGetCount_v2`` and ``...ProfileInfoV`` match their base."""
    return _VERSION_SUFFIX.sub("", name)


def error_code(code: int | str) -> int:
    """An NVML return code from an int or a name (``"IN_USE"``, ``"NVML_ERROR_IN_USE"``)."""
    if isinstance(code, int):
        if code <= 0:
            raise SimError(f"an injected error must be a non-zero NVML return code, not {code}")
        return code
    name = code.upper().removeprefix("NVML_ERROR_")
    value = getattr(N, f"NVML_ERROR_{name}", None)
    if not isinstance(value, int):
        raise SimError(f"unknown NVML error {code!r} (expected a name such as IN_USE or GPU_IS_LOST)")
    return value


def error_name(code: int) -> str:
    """``IN_USE`` for 19: the NVML_ERROR_ constant's name without its prefix (``UNKNOWN_<code>`` if none)."""
    for attr, value in vars(N).items():
        if attr.startswith("NVML_ERROR_") and value == code:
            return str(attr).removeprefix("NVML_ERROR_")
    return f"UNKNOWN_{code}"


@dataclass(slots=True)
class Fault:
    """Return ``code`` from ``call`` (optionally only for GPU ``gpu``), ``times`` more times (None: forever)."""

    call: str
    code: int
    gpu: int | None
    times: int | None


class FaultTable:
    """The active faults, matched in the order they were added."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._readings: dict[tuple[str, int | None], int] = {}
        self._aliases: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self._faults)

    def garble(self, call: str, value: int, *, gpu: int | None = None) -> None:
        """From now on ``call`` (a reading: ``nvmlDeviceGetTemperature``, ``...PowerUsage``, ``...ClockInfo``)
        answers SUCCESS with ``value`` (on GPU ``gpu`` only, when given) until :meth:`clear`."""
        if not call.startswith("nvml"):
            raise SimError(f"{call!r} is not an NVML call name (they start with 'nvml')")
        self._readings[(base_call(call), gpu)] = value

    def reading(self, call: str, gpu: int, value: int) -> int:
        """``value``, or the garbled one set for ``call`` on ``gpu``."""
        if not self._readings:
            return value
        base = base_call(call)
        return self._readings.get((base, gpu), self._readings.get((base, None), value))

    def alias(self, uuid: str, reported: str) -> None:
        """From now on the device ``uuid`` reports ``reported`` as its UUID (``nvmlDeviceGetUUID``)."""
        self._aliases[uuid] = reported

    def uuid(self, uuid: str) -> str:
        """The UUID reported for ``uuid``."""
        return self._aliases.get(uuid, uuid)

    def add(self, call: str, code: int | str, *, gpu: int | None = None, times: int | None = 1) -> Fault:
        """Add a fault; ``call`` is a C symbol name with or without its version suffix."""
        if not call.startswith("nvml"):
            raise SimError(f"{call!r} is not an NVML call name (they start with 'nvml')")
        if times is not None and times < 1:
            raise SimError(f"times must be >= 1 or None (persistent), not {times}")
        fault = Fault(base_call(call), error_code(code), gpu, times)
        self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every fault, garbled reading and UUID alias."""
        self._faults.clear()
        self._readings.clear()
        self._aliases.clear()

    def take(self, call: str, gpu: int | None) -> int:
        """The code the call must return now (consuming a one-shot fault), or 0 for none."""
        base = base_call(call)
        for fault in self._faults:
            if fault.call == base and (fault.gpu is None or fault.gpu == gpu):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                return fault.code
        return 0
