"""The simulator's ``nvidia-smi``: the queries operators and tools type, answered from NVML on the simulated node.

``flexmig sim nvidia-smi ARGS`` (and ``nvidia-smi`` on PATH inside ``flexmig sim exec`` / ``flexmig sim shell``)
reads everything through pynvml, as the real tool reads the driver, so what it prints is what NVML programs (flexmig,
nvitop, gpustat) see. It runs only over a simulated library (:func:`main` refuses otherwise): it is never an
``nvidia-smi`` of a real node. What it answers:

* ``-L`` / ``--list-gpus``: GPUs and their MIG devices with UUIDs;
* ``--query-gpu=FIELD[,FIELD...] --format=csv[,noheader][,nounits]`` (``-i`` to pick GPUs), with the fields of
  :data:`GPU_FIELDS`; ``--query-compute-apps=FIELD[,...]`` with :data:`APP_FIELDS`;
* ``mig -lgip``, ``mig -lgipp``, ``mig -lgi``, ``mig -lci`` (``-i`` to pick GPUs);
* no argument: the summary table (GPUs, MIG devices, processes).

The layouts are the real tool's, copied from published outputs of it (every line position checked in
tests/sim/test_sim_smi.py): ``mig -lgip`` from NVIDIA/mig-parted pull request #139 (GH200) and NVIDIA/gpu-operator
pull request #900 (H100 NVL); ``mig -lgi`` from NVIDIA/DCGM issue #138 (A100-SXM4-80GB); ``mig -lci`` from the
nvidia-smi transcripts in the MIG user guide's examples as reproduced in public issues (A100, H100); ``-L`` and the
summary table from DataDog/datadog-agent pull request #33120 (A100-SXM4-80GB, driver 535).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from ctypes import byref, c_uint
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import ConfigError
from flexmig.sim.install import installed

__all__ = ["APP_FIELDS", "GPU_FIELDS", "main"]

_MIB = 1 << 20
_NA = "[N/A]"
_USAGE = """\
flexmig sim nvidia-smi: the simulated node's nvidia-smi (flexmig's simulator; not NVIDIA's tool)

  nvidia-smi                          the summary table: GPUs, MIG devices, processes
  nvidia-smi -L                       GPUs and MIG devices with their UUIDs
  nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits] [-i N[,N]]
  nvidia-smi --query-compute-apps=F,... --format=csv[,noheader][,nounits]
  nvidia-smi mig -lgip | -lgipp | -lgi | -lci [-i N[,N]]

--query-gpu fields: {gpu}
--query-compute-apps fields: {apps}
"""


# ------------------------------------------------------------------------------------------- NVML reads
def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None where NVML answers with an error (the real tool prints [N/A] there)."""
    try:
        return fn(*args)
    except N.NVMLError:
        return None


@dataclass(slots=True)
class _Mig:
    index: int
    handle: Any
    uuid: str
    name: str
    gi: int | None
    ci: int | None


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    name: str
    uuid: str
    mig: bool
    migs: list[_Mig] = field(default_factory=list)


def _gpus(wanted: set[int] | None) -> list[_Gpu]:
    out = []
    for i in range(N.nvmlDeviceGetCount()):
        if wanted is not None and i not in wanted:
            continue
        h = N.nvmlDeviceGetHandleByIndex(i)
        mode = _try(N.nvmlDeviceGetMigMode, h)
        gpu = _Gpu(i, h, _text(N.nvmlDeviceGetName(h)), _text(N.nvmlDeviceGetUUID(h)), bool(mode and mode[0]))
        if gpu.mig:
            for m in range(_try(N.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
                mh = _try(N.nvmlDeviceGetMigDeviceHandleByIndex, h, m)
                if mh is None:
                    continue  # a gap in the MIG indices: skip it, as nvidia-smi does
                name = _text(N.nvmlDeviceGetName(mh)).removeprefix(gpu.name).strip()
                gi, ci = _try(N.nvmlDeviceGetGpuInstanceId, mh), _try(N.nvmlDeviceGetComputeInstanceId, mh)
                gpu.migs.append(_Mig(len(gpu.migs), mh, _text(N.nvmlDeviceGetUUID(mh)), name, gi, ci))
        out.append(gpu)
    if wanted is not None and len(out) != len(wanted):
        raise ConfigError(f"No devices were found with index {sorted(wanted - {g.index for g in out})}")
    return out


def _gi_profiles(h: Any) -> list[Any]:
    """The GPU's GPU-instance profiles in the order nvidia-smi lists them: by memory, then slices, then ID."""
    profiles = []
    for index in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _try(N.nvmlDeviceGetGpuInstanceProfileInfo, h, index)
        if info is not None and info.instanceCount > 0:
            profiles.append(info)
    return sorted(profiles, key=lambda p: (p.memorySizeMB, p.sliceCount, p.id))


def _gpu_instances(h: Any, profile: Any) -> list[Any]:
    arr = (N.c_nvmlGpuInstance_t * max(1, profile.instanceCount))()
    count = c_uint(0)
    try:
        N.nvmlDeviceGetGpuInstances(h, profile.id, arr, byref(count))
    except N.NVMLError:
        return []
    return [arr[i] for i in range(count.value)]


def _compute_instances(gi: Any) -> list[tuple[Any, Any]]:
    """(CI profile info, CI info) of every compute instance of ``gi``."""
    out = []
    for index in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        prof = _try(N.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, index, 0)
        if prof is None or prof.instanceCount == 0:
            continue
        arr = (N.c_nvmlComputeInstance_t * max(1, prof.instanceCount))()
        count = c_uint(0)
        try:
            N.nvmlGpuInstanceGetComputeInstances(gi, prof.id, arr, byref(count))
        except N.NVMLError:
            continue
        out += [(prof, N.nvmlComputeInstanceGetInfo(arr[i])) for i in range(count.value)]
    return out


# ------------------------------------------------------------------------------------------- mig tables
_LGIP_HEAD = (
    "+-----------------------------------------------------------------------------+",
    "| GPU instance profiles:                                                      |",
    "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
    "|                              Free/Total   GiB              CE    JPEG  OFA  |",
    "|=============================================================================|",
)
_LGI_HEAD = (
    "+-------------------------------------------------------+",
    "| GPU instances:                                        |",
    "| GPU   Name             Profile  Instance   Placement  |",
    "|                          ID       ID       Start:Size |",
    "|=======================================================|",
)
_LCI_HEAD = (
    "+--------------------------------------------------------------------+",
    "| Compute instances:                                                 |",
    "| GPU     GPU       Name             Profile   Instance   Placement  |",
    "|       Instance                       ID        ID       Start:Size |",
    "|         ID                                                         |",
    "|====================================================================|",
)


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def _no_mig(gpus: list[_Gpu], out: IO[str]) -> bool:
    if any(g.mig for g in gpus):
        return False
    out.write("No MIG-enabled devices found.\n")
    return True


def lgip(gpus: list[_Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lgip``: each MIG-enabled GPU's GPU-instance profiles, free and total."""
    if _no_mig(gpus, out):
        return 6
    out.write("\n".join(_LGIP_HEAD) + "\n")
    rule = _LGIP_HEAD[0]
    for g in (g for g in gpus if g.mig):
        for p in _gi_profiles(g.handle):
            free = _try(N.nvmlDeviceGetGpuInstanceRemainingCapacity, g.handle, p.id)
            inst = f"{'?' if free is None else free}/{p.instanceCount}"
            name = _text(p.name) if _text(p.name) else f"MIG {p.sliceCount}g"
            p2p = "Yes" if p.isP2pSupported else "No"
            mem = f"{p.memorySizeMB / 1024:.2f}"
            out.write(
                f"|{g.index:>4}  {name:<16}{p.id:>4}     {inst:<11}{mem:<11}{p2p:<6}{p.multiprocessorCount:>3}"
                f"{p.decoderCount:>6}{p.encoderCount:>6}   |\n"
            )
            out.write(f"|{'':<59}{p.copyEngineCount:>3}{p.jpegCount:>6}{p.ofaCount:>6}   |\n")
            out.write(rule + "\n")
    return 0


def lgipp(gpus: list[_Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lgipp``: where each GPU-instance profile may be placed (memory slices)."""
    if _no_mig(gpus, out):
        return 6
    for g in (g for g in gpus if g.mig):
        for p in _gi_profiles(g.handle):
            arr = (N.c_nvmlGpuInstancePlacement_t * 8)()
            count = c_uint(8)
            try:
                N.nvmlDeviceGetGpuInstancePossiblePlacements_v2(g.handle, p.id, arr, byref(count))
            except N.NVMLError:
                continue
            starts = ",".join(str(arr[i].start) for i in range(count.value))
            size = arr[0].size if count.value else 0
            label = "Placements" if count.value > 1 else "Placement "
            name = _text(p.name) or f"MIG {p.sliceCount}g"
            out.write(f"GPU {g.index:>2} Profile ID {p.id:>2} {label}: {{{starts}}}:{size}  ({name})\n")
    return 0


def lgi(gpus: list[_Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lgi``: the GPU instances, with profile, ID and placement."""
    if _no_mig(gpus, out):
        return 6
    rows = []
    for g in (g for g in gpus if g.mig):
        for p in _gi_profiles(g.handle):
            infos = sorted((N.nvmlGpuInstanceGetInfo(gi) for gi in _gpu_instances(g.handle, p)), key=lambda i: i.id)
            for info in infos:
                rows.append((g.index, info.id, _text(p.name), p.id, f"{info.placement.start}:{info.placement.size}"))
    if not rows:
        out.write("No GPU instances found: Not Found\n")
        return 6
    rule = _LGI_HEAD[0]
    out.write("\n".join(_LGI_HEAD) + "\n")
    for gpu, gi_id, name, pid, placement in rows:  # GPU, then profile (as -lgip lists them), then GI ID
        out.write(f"|{gpu:>4}  {name:<16}{pid:>6}{gi_id:>9}{placement:>13}     |\n{rule}\n")
    return 0


def lci(gpus: list[_Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lci``: the compute instances of every GPU instance."""
    if _no_mig(gpus, out):
        return 6
    rows = []
    for g in (g for g in gpus if g.mig):
        for p in _gi_profiles(g.handle):
            gis = sorted(((N.nvmlGpuInstanceGetInfo(gi).id, gi) for gi in _gpu_instances(g.handle, p)), key=_first)
            for gi_id, gi in gis:
                for prof, info in sorted(_compute_instances(gi), key=lambda c: c[1].id):
                    placement = f"{info.placement.start}:{info.placement.size}"
                    rows.append((g.index, gi_id, info.id, _text(prof.name), prof.id, placement))
    if not rows:
        out.write("No compute instances found: Not Found\n")
        return 6
    rule = _LCI_HEAD[0]
    out.write("\n".join(_LCI_HEAD) + "\n")
    for gpu, gi_id, ci_id, name, pid, placement in rows:  # in the order of -lgi, then CI ID
        out.write(f"|{gpu:>4}{gi_id:>7}       {name:<16}{pid:>6}{ci_id:>10}{placement:>13}     |\n{rule}\n")
    return 0


# ------------------------------------------------------------------------------------------------ -L
def list_gpus(gpus: list[_Gpu], out: IO[str]) -> int:
    """``nvidia-smi -L``."""
    for g in gpus:
        out.write(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n")
        for m in g.migs:
            out.write(f"  {m.name:<16}Device {m.index:>2}: (UUID: {m.uuid})\n")
    return 0


# ------------------------------------------------------------------------------------------- queries
def _memory(h: Any) -> Any:
    return _try(N.nvmlDeviceGetMemoryInfo, h)


def _mib(value: int | None) -> tuple[str, str] | None:
    return None if value is None else (str(value // _MIB), "MiB")


def _utilization(g: _Gpu, which: str) -> tuple[str, str] | None:
    if g.mig:
        return None  # NVML has no utilization rates with MIG enabled; nvidia-smi prints [N/A]
    rates = _try(N.nvmlDeviceGetUtilizationRates, g.handle)
    return None if rates is None else (str(getattr(rates, which)), "%")


def _clock(g: _Gpu, kind: int) -> tuple[str, str] | None:
    mhz = _try(N.nvmlDeviceGetClockInfo, g.handle, kind)
    return None if mhz is None else (str(mhz), "MHz")


def _mig_mode(g: _Gpu, which: int) -> tuple[str, str] | None:
    mode = _try(N.nvmlDeviceGetMigMode, g.handle)
    return None if mode is None else ("Enabled" if mode[which] else "Disabled", "")


def _power(g: _Gpu, fn: Callable[[Any], Any]) -> tuple[str, str] | None:
    mw = _try(fn, g.handle)
    return None if mw is None else (f"{mw / 1000:.2f}", "W")


def _plain(value: object) -> tuple[str, str] | None:
    return None if value is None else (str(value), "")


def _persistence(g: _Gpu) -> tuple[str, str] | None:
    mode = _try(N.nvmlDeviceGetPersistenceMode, g.handle)
    return None if mode is None else ("Enabled" if mode else "Disabled", "")


def _pstate(g: _Gpu) -> tuple[str, str] | None:
    state = _try(N.nvmlDeviceGetPerformanceState, g.handle)
    return None if state is None else (f"P{state}", "")


def _fan(g: _Gpu) -> tuple[str, str] | None:
    speed = _try(N.nvmlDeviceGetFanSpeed, g.handle)
    return None if speed is None else (str(speed), "%")


def _mem_field(g: _Gpu, which: str) -> tuple[str, str] | None:
    info = _memory(g.handle)
    return _mib(None if info is None else getattr(info, which))


#: ``--query-gpu`` fields: name -> (unit shown in the header, value and unit of one GPU, or None for [N/A]).
GPU_FIELDS: dict[str, tuple[str, Callable[[_Gpu, int], tuple[str, str] | None]]] = {
    "timestamp": ("", lambda g, n: (time.strftime("%Y/%m/%d %H:%M:%S.000"), "")),
    "driver_version": ("", lambda g, n: _plain(_text(N.nvmlSystemGetDriverVersion()))),
    "count": ("", lambda g, n: (str(n), "")),
    "index": ("", lambda g, n: (str(g.index), "")),
    "name": ("", lambda g, n: (g.name, "")),
    "uuid": ("", lambda g, n: (g.uuid, "")),
    "gpu_uuid": ("", lambda g, n: (g.uuid, "")),
    "serial": ("", lambda g, n: _plain(_try(N.nvmlDeviceGetSerial, g.handle))),
    "gpu_serial": ("", lambda g, n: _plain(_try(N.nvmlDeviceGetSerial, g.handle))),
    "pci.bus_id": ("", lambda g, n: _plain(_try(lambda h: _text(N.nvmlDeviceGetPciInfo(h).busId), g.handle))),
    "gpu_bus_id": ("", lambda g, n: _plain(_try(lambda h: _text(N.nvmlDeviceGetPciInfo(h).busId), g.handle))),
    "display_mode": ("", lambda g, n: ("Disabled", "")),
    "display_active": ("", lambda g, n: ("Disabled", "")),
    "persistence_mode": ("", lambda g, n: _persistence(g)),
    "pstate": ("", lambda g, n: _pstate(g)),
    "fan.speed": ("%", lambda g, n: _fan(g)),
    "temperature.gpu": ("", lambda g, n: _plain(_try(N.nvmlDeviceGetTemperature, g.handle, N.NVML_TEMPERATURE_GPU))),
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
            shown.append(_NA)
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


def query_gpu(gpus: list[_Gpu], fields: str, fmt: str | None, out: IO[str]) -> int:
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


def _process_name(pid: int) -> str:
    try:
        with Path(f"/proc/{pid}/cmdline").open("rb") as f:
            argv = f.read(4096).split(b"\0")
    except OSError:
        return _NA
    return argv[0].decode(errors="replace") if argv and argv[0] else _NA


def query_apps(gpus: list[_Gpu], fields: str, fmt: str | None, out: IO[str]) -> int:
    """``--query-compute-apps=...``: every compute process, on its GPU (MIG devices' processes included)."""
    noheader, nounits = _format(fmt)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in APP_FIELDS:
            raise ConfigError(f'Field "{name}" is not a valid field to query.')
    if not noheader:
        out.write(_header(names, ["MiB" if n == "used_memory" else "" for n in names]) + "\n")
    for g in gpus:
        for p in _try(N.nvmlDeviceGetComputeRunningProcesses, g.handle) or ():
            row: dict[str, tuple[str, str] | None] = {
                "timestamp": (time.strftime("%Y/%m/%d %H:%M:%S.000"), ""),
                "gpu_name": (g.name, ""),
                "gpu_bus_id": GPU_FIELDS["pci.bus_id"][1](g, 0),
                "gpu_serial": GPU_FIELDS["serial"][1](g, 0),
                "gpu_uuid": (g.uuid, ""),
                "pid": (str(p.pid), ""),
                "process_name": (_process_name(p.pid), ""),
                "used_memory": _mib(p.usedGpuMemory),
            }
            out.write(_csv([row[n] for n in names], nounits) + "\n")
    return 0


# ------------------------------------------------------------------------------------- summary table
_RULE = "+---------------------------------------------------------------------------------------+"
_BANNER = "flexmig's simulated node (flexmig sim nvidia-smi), not NVIDIA's nvidia-smi"
_GPU_RULE = "+-----------------------------------------+----------------------+----------------------+"
_MIG_RULE = "+------------------+--------------------------------+-----------+-----------------------+"
_GPU_HEAD = (
    "|-----------------------------------------+----------------------+----------------------+",
    "| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                      |               MIG M. |",
    "|=========================================+======================+======================|",
)
_MIG_HEAD = (
    _RULE,
    "| MIG devices:                                                                          |",
    _MIG_RULE,
    "| GPU  GI  CI  MIG |                   Memory-Usage |        Vol|      Shared           |",
    "|      ID  ID  Dev |                     BAR1-Usage | SM     Unc| CE ENC DEC OFA JPG    |",
    "|                  |                                |        ECC|                       |",
    "|==================+================================+===========+=======================|",
)
_PROC_HEAD = (
    _RULE,
    "| Processes:                                                                            |",
    "|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |",
    "|        ID   ID                                                             Usage      |",
    "|=======================================================================================|",
)


def _usage(used: int | None, total: int | None) -> str:
    return "N/A" if used is None or total is None else f"{used // _MIB}MiB / {total // _MIB}MiB"


def _gpu_rows(g: _Gpu) -> list[str]:
    h = g.handle
    persist = "On" if _try(N.nvmlDeviceGetPersistenceMode, h) else "Off"
    bus = _try(lambda x: _text(N.nvmlDeviceGetPciInfo(x).busId), h) or "N/A"
    temp = _try(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU)
    pstate = _try(N.nvmlDeviceGetPerformanceState, h)
    power, cap = _try(N.nvmlDeviceGetPowerUsage, h), _try(N.nvmlDeviceGetPowerManagementLimit, h)
    mem = _memory(h)
    rates = None if g.mig else _try(N.nvmlDeviceGetUtilizationRates, h)
    temp_text = "N/A" if temp is None else f"{temp}C"
    perf = "N/A" if pstate is None else f"P{pstate}"
    pwr = "N/A" if power is None or cap is None else f"{power // 1000}W / {cap // 1000}W"
    used = _usage(None if mem is None else mem.used, None if mem is None else mem.total)
    util = "N/A" if rates is None else f"{rates.gpu}%"
    return [
        f"|{g.index:>4}  {g.name[:31]:<31}{persist:<4}| {bus:>16} Off |{'On' if g.mig else 'N/A':>21} |",
        f"| N/A{temp_text:>6}    {perf:<2}{pwr:>24} |{used:>21} |{util:>8}      Default |",
        f"|{'':<41}|{'':<22}|{'Enabled' if g.mig else 'Disabled':>21} |",
        _GPU_RULE,
    ]


def _mig_rows(g: _Gpu, m: _Mig) -> list[str]:
    mem = _memory(m.handle)
    bar1 = _try(N.nvmlDeviceGetBAR1MemoryInfo, m.handle)
    attrs = _try(N.nvmlDeviceGetAttributes, m.handle)
    sm = "N/A" if attrs is None else str(attrs.multiprocessorCount)
    shared = "  N/A                 "
    if attrs is not None:
        shared = (
            f"{attrs.sharedCopyEngineCount:>3}{attrs.sharedEncoderCount:>4}{attrs.sharedDecoderCount:>5}"
            f"{attrs.sharedOfaCount:>5}{attrs.sharedJpegCount:>5}"
        )
    gi, ci = ("N/A" if m.gi is None else m.gi), ("N/A" if m.ci is None else m.ci)
    used = _usage(None if mem is None else mem.used, None if mem is None else mem.total)
    bar = _usage(None if bar1 is None else bar1.bar1Used, None if bar1 is None else bar1.bar1Total)
    return [
        f"|{g.index:>3}{gi:>5}{ci:>4}{m.index:>4}  |{used:>30}  |{sm:>3}{'0':>7} |{shared} |",
        f"|{'':<18}|{bar:>30}  |{'':<11}|{'':<23}|",
        _MIG_RULE,
    ]


def _process_rows(gpus: list[_Gpu]) -> list[str]:
    rows = []
    for g in gpus:
        owners: list[tuple[_Mig | None, Any]] = [
            (m, _try(N.nvmlDeviceGetComputeRunningProcesses, m.handle) or []) for m in g.migs
        ]
        if not g.mig:
            owners = [(None, _try(N.nvmlDeviceGetComputeRunningProcesses, g.handle) or [])]
        for m, procs in owners:
            for p in procs:
                gi = "N/A" if m is None or m.gi is None else str(m.gi)
                ci = "N/A" if m is None or m.ci is None else str(m.ci)
                name = _process_name(p.pid)
                name = name if len(name) <= 38 else "..." + name[-35:]
                mem = "N/A" if p.usedGpuMemory is None else f"{p.usedGpuMemory // _MIB}MiB"
                rows.append(f"|{g.index:>5}{gi:>6}{ci:>5}{p.pid:>10}{'C':>7}   {name:<40}{mem:>10} |")
    return rows or ["|  No running processes found                                                           |"]


def summary(gpus: list[_Gpu], out: IO[str]) -> int:
    """``nvidia-smi``: the GPUs, then their MIG devices, then the processes (the layout of driver 535)."""
    driver = _text(N.nvmlSystemGetDriverVersion())
    cuda = _try(N.nvmlSystemGetCudaDriverVersion)
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "N/A"
    lines = [time.strftime("%a %b %d %H:%M:%S %Y") + "       ", _RULE]
    lines.append(f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<13}CUDA Version: {cuda_text:<9}|")
    lines.append(f"| {_BANNER:<85} |")
    lines += _GPU_HEAD
    for g in gpus:
        lines += _gpu_rows(g)
    if any(g.mig for g in gpus):
        lines += ["", *_MIG_HEAD]
        migs = [(g, m) for g in gpus for m in g.migs]
        for g, m in migs:
            lines += _mig_rows(g, m)
        if not migs:
            lines += [f"| {'No MIG devices found':<85} |", _RULE]
    lines += ["", *_PROC_HEAD, *_process_rows(gpus), _RULE]
    out.write("\n".join(lines) + "\n")
    return 0


# ------------------------------------------------------------------------------------- command line
def _gpu_ids(text: str | None) -> set[int] | None:
    if text is None:
        return None
    try:
        return {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise ConfigError(f"Invalid device ID {text!r}: flexmig's nvidia-smi takes GPU indices (0, 1, ...)") from None


def _take(args: list[str], i: int, flag: str) -> tuple[str, int]:
    """The value of ``flag`` at ``args[i]``: ``--flag=value`` or ``--flag value``; (value, next index)."""
    arg = args[i]
    if "=" in arg:
        return arg.split("=", 1)[1], i + 1
    if i + 1 >= len(args):
        raise ConfigError(f"Option {flag} needs a value")
    return args[i + 1], i + 2


def _parse(argv: Sequence[str]) -> tuple[str, dict[str, str]]:
    """(action, options) of a command line, ConfigError for anything this look-alike does not answer."""
    args = list(argv)
    action, opts = "summary", {}
    i = 0
    if args and args[0] == "mig":
        action, i = "mig", 1
    while i < len(args):
        a = args[i]
        key = a.split("=", 1)[0]
        if a in ("-h", "--help"):
            return "help", {}
        if a in ("-L", "--list-gpus") and action == "summary":
            action, i = "list", i + 1
        elif key in ("-i", "--id"):
            opts["id"], i = _take(args, i, key)
        elif key in ("--query-gpu", "-q-gpu") and action == "summary":
            action = "query-gpu"
            opts["fields"], i = _take(args, i, key)
        elif key == "--query-compute-apps" and action == "summary":
            action = "query-apps"
            opts["fields"], i = _take(args, i, key)
        elif key == "--format":
            opts["format"], i = _take(args, i, key)
        elif action == "mig" and a in ("-lgip", "--list-gpu-instance-profiles"):
            opts["mig"], i = "lgip", i + 1
        elif action == "mig" and a in ("-lgipp", "--list-gpu-instance-possible-placements"):
            opts["mig"], i = "lgipp", i + 1
        elif action == "mig" and a in ("-lgi", "--list-gpu-instances"):
            opts["mig"], i = "lgi", i + 1
        elif action == "mig" and a in ("-lci", "--list-compute-instances"):
            opts["mig"], i = "lci", i + 1
        else:
            raise ConfigError(f"flexmig's simulated nvidia-smi does not answer {a!r}")
    if action == "mig" and "mig" not in opts:
        raise ConfigError("mig: give -lgip, -lgipp, -lgi or -lci")
    return action, opts


def main(argv: Sequence[str], out: IO[str], err: IO[str]) -> int:
    """Answer the ``nvidia-smi`` command line ``argv`` on ``out``; its exit status (2 for a command line it does not
    answer, 9 where pynvml is not on a simulated node: it never stands in for the real tool)."""
    try:
        action, opts = _parse(argv)
    except ConfigError as exc:
        err.write(f"{exc}\n\n")
        err.write(_USAGE.format(gpu=", ".join(GPU_FIELDS), apps=", ".join(APP_FIELDS)))
        return 2
    if action == "help":
        out.write(_USAGE.format(gpu=", ".join(GPU_FIELDS), apps=", ".join(APP_FIELDS)))
        return 0
    if not installed():
        err.write(
            "flexmig sim nvidia-smi answers for a simulated node only, and none is attached to this process "
            "(FLEXMIG_SIM_STATE, or flexmig sim --state FILE)\n"
        )
        return 9
    try:
        N.nvmlInit()
    except N.NVMLError as exc:
        err.write(f"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {exc}\n")
        return 9
    try:
        gpus = _gpus(_gpu_ids(opts.get("id")))
        if action == "list":
            return list_gpus(gpus, out)
        if action == "query-gpu":
            return query_gpu(gpus, opts["fields"], opts.get("format"), out)
        if action == "query-apps":
            return query_apps(gpus, opts["fields"], opts.get("format"), out)
        if action == "mig":
            return {"lgip": lgip, "lgipp": lgipp, "lgi": lgi, "lci": lci}[opts["mig"]](gpus, out)
        return summary(gpus, out)
    except ConfigError as exc:
        err.write(f"{exc}\n")
        return 2
    finally:
        N.nvmlShutdown()
