"""The simulated nvidia-smi's ``--query-gpu`` and ``--query-compute-apps`` CSV output, field by field.

Field names, units and the ``[N/A]`` of an unanswered field are the real tool's (tests/sim/test_sim_smi.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import ConfigError
from flexmig.sim.smi_devices import MIB, NA, Gpu, memory_info, nvml_text, try_nvml

__all__ = ["APP_FIELDS", "GPU_FIELDS", "process_name", "query_apps", "query_gpu"]


def _mib(value: int | None) -> tuple[str, str] | None:
    return None if value is None else (str(value // MIB), "MiB")


def _utilization(g: Gpu, which: str) -> tuple[str, str] | None:
    if g.mig:
        return None  # NVML has no utilization rates with MIG enabled; nvidia-smi prints [N/A]
    rates = try_nvml(N.nvmlDeviceGetUtilizationRates, g.handle)
    return None if rates is None else (str(getattr(rates, which)), "%")


def _clock(g: Gpu, kind: int) -> tuple[str, str] | None:
    mhz = try_nvml(N.nvmlDeviceGetClockInfo, g.handle, kind)
    return None if mhz is None else (str(mhz), "MHz")


def _mig_mode(g: Gpu, which: int) -> tuple[str, str] | None:
    mode = try_nvml(N.nvmlDeviceGetMigMode, g.handle)
    return None if mode is None else ("Enabled" if mode[which] else "Disabled", "")


def _power(g: Gpu, fn: Callable[[Any], Any]) -> tuple[str, str] | None:
    mw = try_nvml(fn, g.handle)
    return None if mw is None else (f"{mw / 1000:.2f}", "W")


def _plain(value: object) -> tuple[str, str] | None:
    return None if value is None else (str(value), "")


def _persistence(g: Gpu) -> tuple[str, str] | None:
    mode = try_nvml(N.nvmlDeviceGetPersistenceMode, g.handle)
    return None if mode is None else ("Enabled" if mode else "Disabled", "")


def _pstate(g: Gpu) -> tuple[str, str] | None:
    state = try_nvml(N.nvmlDeviceGetPerformanceState, g.handle)
    return None if state is None else (f"P{state}", "")


def _fan(g: Gpu) -> tuple[str, str] | None:
    speed = try_nvml(N.nvmlDeviceGetFanSpeed, g.handle)
    return None if speed is None else (str(speed), "%")


def _mem_field(g: Gpu, which: str) -> tuple[str, str] | None:
    info = memory_info(g.handle)
    return _mib(None if info is None else getattr(info, which))


#: ``--query-gpu`` fields: name -> (unit shown in the header, value and unit of one GPU, or None for [N/A]).
GPU_FIELDS: dict[str, tuple[str, Callable[[Gpu, int], tuple[str, str] | None]]] = {
    "timestamp": ("", lambda g, n: (time.strftime("%Y/%m/%d %H:%M:%S.000"), "")),
    "driver_version": ("", lambda g, n: _plain(nvml_text(N.nvmlSystemGetDriverVersion()))),
    "count": ("", lambda g, n: (str(n), "")),
    "index": ("", lambda g, n: (str(g.index), "")),
    "name": ("", lambda g, n: (g.name, "")),
    "uuid": ("", lambda g, n: (g.uuid, "")),
    "gpu_uuid": ("", lambda g, n: (g.uuid, "")),
    "serial": ("", lambda g, n: _plain(try_nvml(N.nvmlDeviceGetSerial, g.handle))),
    "gpu_serial": ("", lambda g, n: _plain(try_nvml(N.nvmlDeviceGetSerial, g.handle))),
    "pci.bus_id": ("", lambda g, n: _plain(try_nvml(lambda h: nvml_text(N.nvmlDeviceGetPciInfo(h).busId), g.handle))),
    "gpu_bus_id": ("", lambda g, n: _plain(try_nvml(lambda h: nvml_text(N.nvmlDeviceGetPciInfo(h).busId), g.handle))),
    "display_mode": ("", lambda g, n: ("Disabled", "")),
    "display_active": ("", lambda g, n: ("Disabled", "")),
    "persistence_mode": ("", lambda g, n: _persistence(g)),
    "pstate": ("", lambda g, n: _pstate(g)),
    "fan.speed": ("%", lambda g, n: _fan(g)),
    "temperature.gpu": (
        "",
        lambda g, n: _plain(try_nvml(N.nvmlDeviceGetTemperature, g.handle, N.NVML_TEMPERATURE_GPU)),
    ),
    "utilization.gpu": ("%", lambda g, n: _utilization(g, "gpu")),
    "utilization.memory": ("%", lambda g, n: _utilization(g, "memory")),
    "memory.total": ("MiB", lambda g, n: _mem_field(g, "total")),
    "memory.used": ("MiB", lambda g, n: _mem_field(g, "used")),
    "memory.free": ("MiB", lambda g, n: _mem_field(g, "free")),
    "power.draw": ("W", lambda g, n: _power(g, N.nvmlDeviceGetPowerUsage)),
    "power.limit": ("W", lambda g, n: _power(g, N.nvmlDeviceGetPowerManagementLimit)),
    "clocks.sm": ("MHz", lambda g, n: _clock(g, N.NVML_CLOCK_SM)),
    "clocks.mem": ("MHz", lambda g, n: _clock(g, N.NVML_CLOCK_MEM)),
    "clocks.gr": ("MHz", lambda g, n: _clock(g, N.NVML_CLOCK_GRAPHICS)),
    "mig.mode.current": ("", lambda g, n: _mig_mode(g, 0)),
    "mig.mode.pending": ("", lambda g, n: _mig_mode(g, 1)),
}

#: ``--query-compute-apps`` fields.
APP_FIELDS = ("timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid", "process_name", "used_memory")


def _csv(values: list[tuple[str, str] | None], nounits: bool) -> str:
    shown = []
    for v in values:
        if v is None:
            shown.append(NA)
        else:
            text, unit = v
            shown.append(text if nounits or not unit else f"{text} {unit}")
    return ", ".join(shown)


def _header(names: list[str], units: list[str]) -> str:
    return ", ".join(f"{n} [{u}]" if u else n for n, u in zip(names, units, strict=True))


def _format(spec: str | None) -> tuple[bool, bool]:
    """``--format=csv[,noheader][,nounits]`` -> (noheader, nounits)."""
    if spec is None:
        raise ConfigError('"--format" is required with a query; "csv" is the only format')
    parts = [p.strip() for p in spec.split(",")]
    if parts[0] != "csv" or any(p not in ("csv", "noheader", "nounits") for p in parts):
        raise ConfigError(f'"{spec}" is not a valid format: csv[,noheader][,nounits]')
    return "noheader" in parts, "nounits" in parts


def query_gpu(gpus: list[Gpu], fields: str, fmt: str | None, out: IO[str]) -> int:
    """``--query-gpu=...``."""
    noheader, nounits = _format(fmt)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in GPU_FIELDS:
            raise ConfigError(f'Field "{name}" is not a valid field to query.')
    if not noheader:
        out.write(_header(names, [GPU_FIELDS[n][0] for n in names]) + "\n")
    count = len(gpus)
    for g in gpus:
        out.write(_csv([GPU_FIELDS[n][1](g, count) for n in names], nounits) + "\n")
    return 0


def process_name(pid: int) -> str:
    try:
        with Path(f"/proc/{pid}/cmdline").open("rb") as f:
            argv = f.read(4096).split(b"\0")
    except OSError:
        return NA
    return argv[0].decode(errors="replace") if argv and argv[0] else NA


def query_apps(gpus: list[Gpu], fields: str, fmt: str | None, out: IO[str]) -> int:
    """``--query-compute-apps=...``: every compute process, on its GPU (MIG devices' processes included)."""
    noheader, nounits = _format(fmt)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in APP_FIELDS:
            raise ConfigError(f'Field "{name}" is not a valid field to query.')
    if not noheader:
        out.write(_header(names, ["MiB" if n == "used_memory" else "" for n in names]) + "\n")
    for g in gpus:
        for p in try_nvml(N.nvmlDeviceGetComputeRunningProcesses, g.handle) or ():
            row: dict[str, tuple[str, str] | None] = {
                "timestamp": (time.strftime("%Y/%m/%d %H:%M:%S.000"), ""),
                "gpu_name": (g.name, ""),
                "gpu_bus_id": GPU_FIELDS["pci.bus_id"][1](g, 0),
                "gpu_serial": GPU_FIELDS["serial"][1](g, 0),
                "gpu_uuid": (g.uuid, ""),
                "pid": (str(p.pid), ""),
                "process_name": (process_name(p.pid), ""),
                "used_memory": _mib(p.usedGpuMemory),
            }
            out.write(_csv([row[n] for n in names], nounits) + "\n")
    return 0
