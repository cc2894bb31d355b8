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
from collections.abc import Sequence
from ctypes import byref, c_uint
from typing import IO, Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import ConfigError
from flexmig.sim.install import installed
from flexmig.sim.smi_devices import (
    MIB,
    Gpu,
    Mig,
    compute_instances,
    gi_profiles,
    gpu_instances,
    memory_info,
    nvml_text,
    read_gpus,
    try_nvml,
)
from flexmig.sim.smi_query import APP_FIELDS, GPU_FIELDS, process_name, query_apps, query_gpu

__all__ = ["APP_FIELDS", "GPU_FIELDS", "main"]

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


def _no_mig(gpus: list[Gpu], out: IO[str]) -> bool:
    if any(g.mig for g in gpus):
        return False
    out.write("No MIG-enabled devices found.\n")
    return True


def lgip(gpus: list[Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lgip``: each MIG-enabled GPU's GPU-instance profiles, free and total."""
    if _no_mig(gpus, out):
        return 6
    out.write("\n".join(_LGIP_HEAD) + "\n")
    rule = _LGIP_HEAD[0]
    for g in (g for g in gpus if g.mig):
        for p in gi_profiles(g.handle):
            free = try_nvml(N.nvmlDeviceGetGpuInstanceRemainingCapacity, g.handle, p.id)
            inst = f"{'?' if free is None else free}/{p.instanceCount}"
            name = nvml_text(p.name) if nvml_text(p.name) else f"MIG {p.sliceCount}g"
            p2p = "Yes" if p.isP2pSupported else "No"
            mem = f"{p.memorySizeMB / 1024:.2f}"
            out.write(
                f"|{g.index:>4}  {name:<16}{p.id:>4}     {inst:<11}{mem:<11}{p2p:<6}{p.multiprocessorCount:>3}"
                f"{p.decoderCount:>6}{p.encoderCount:>6}   |\n"
            )
            out.write(f"|{'':<59}{p.copyEngineCount:>3}{p.jpegCount:>6}{p.ofaCount:>6}   |\n")
            out.write(rule + "\n")
    return 0


def lgipp(gpus: list[Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lgipp``: where each GPU-instance profile may be placed (memory slices)."""
    if _no_mig(gpus, out):
        return 6
    for g in (g for g in gpus if g.mig):
        for p in gi_profiles(g.handle):
            arr = (N.c_nvmlGpuInstancePlacement_t * 8)()
            count = c_uint(8)
            try:
                N.nvmlDeviceGetGpuInstancePossiblePlacements_v2(g.handle, p.id, arr, byref(count))
            except N.NVMLError:
                continue
            starts = ",".join(str(arr[i].start) for i in range(count.value))
            size = arr[0].size if count.value else 0
            label = "Placements" if count.value > 1 else "Placement "
            name = nvml_text(p.name) or f"MIG {p.sliceCount}g"
            out.write(f"GPU {g.index:>2} Profile ID {p.id:>2} {label}: {{{starts}}}:{size}  ({name})\n")
    return 0


def lgi(gpus: list[Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lgi``: the GPU instances, with profile, ID and placement."""
    if _no_mig(gpus, out):
        return 6
    rows = []
    for g in (g for g in gpus if g.mig):
        for p in gi_profiles(g.handle):
            infos = sorted((N.nvmlGpuInstanceGetInfo(gi) for gi in gpu_instances(g.handle, p)), key=lambda i: i.id)
            for info in infos:
                rows.append(
                    (g.index, info.id, nvml_text(p.name), p.id, f"{info.placement.start}:{info.placement.size}")
                )
    if not rows:
        out.write("No GPU instances found: Not Found\n")
        return 6
    rule = _LGI_HEAD[0]
    out.write("\n".join(_LGI_HEAD) + "\n")
    for gpu, gi_id, name, pid, placement in rows:  # GPU, then profile (as -lgip lists them), then GI ID
        out.write(f"|{gpu:>4}  {name:<16}{pid:>6}{gi_id:>9}{placement:>13}     |\n{rule}\n")
    return 0


def lci(gpus: list[Gpu], out: IO[str]) -> int:
    """``nvidia-smi mig -lci``: the compute instances of every GPU instance."""
    if _no_mig(gpus, out):
        return 6
    rows = []
    for g in (g for g in gpus if g.mig):
        for p in gi_profiles(g.handle):
            gis = sorted(((N.nvmlGpuInstanceGetInfo(gi).id, gi) for gi in gpu_instances(g.handle, p)), key=_first)
            for gi_id, gi in gis:
                for prof, info in sorted(compute_instances(gi), key=lambda c: c[1].id):
                    placement = f"{info.placement.start}:{info.placement.size}"
                    rows.append((g.index, gi_id, info.id, nvml_text(prof.name), prof.id, placement))
    if not rows:
        out.write("No compute instances found: Not Found\n")
        return 6
    rule = _LCI_HEAD[0]
    out.write("\n".join(_LCI_HEAD) + "\n")
    for gpu, gi_id, ci_id, name, pid, placement in rows:  # in the order of -lgi, then CI ID
        out.write(f"|{gpu:>4}{gi_id:>7}       {name:<16}{pid:>6}{ci_id:>10}{placement:>13}     |\n{rule}\n")
    return 0


# ------------------------------------------------------------------------------------------------ -L
def list_gpus(gpus: list[Gpu], out: IO[str]) -> int:
    """``nvidia-smi -L``."""
    for g in gpus:
        out.write(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n")
        for m in g.migs:
            out.write(f"  {m.name:<16}Device {m.index:>2}: (UUID: {m.uuid})\n")
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
    return "N/A" if used is None or total is None else f"{used // MIB}MiB / {total // MIB}MiB"


def _gpu_rows(g: Gpu) -> list[str]:
    h = g.handle
    persist = "On" if try_nvml(N.nvmlDeviceGetPersistenceMode, h) else "Off"
    bus = try_nvml(lambda x: nvml_text(N.nvmlDeviceGetPciInfo(x).busId), h) or "N/A"
    temp = try_nvml(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU)
    pstate = try_nvml(N.nvmlDeviceGetPerformanceState, h)
    power, cap = try_nvml(N.nvmlDeviceGetPowerUsage, h), try_nvml(N.nvmlDeviceGetPowerManagementLimit, h)
    mem = memory_info(h)
    rates = None if g.mig else try_nvml(N.nvmlDeviceGetUtilizationRates, h)
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


def _mig_rows(g: Gpu, m: Mig) -> list[str]:
    mem = memory_info(m.handle)
    bar1 = try_nvml(N.nvmlDeviceGetBAR1MemoryInfo, m.handle)
    attrs = try_nvml(N.nvmlDeviceGetAttributes, m.handle)
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


def _process_rows(gpus: list[Gpu]) -> list[str]:
    rows = []
    for g in gpus:
        owners: list[tuple[Mig | None, Any]] = [
            (m, try_nvml(N.nvmlDeviceGetComputeRunningProcesses, m.handle) or []) for m in g.migs
        ]
        if not g.mig:
            owners = [(None, try_nvml(N.nvmlDeviceGetComputeRunningProcesses, g.handle) or [])]
        for m, procs in owners:
            for p in procs:
                gi = "N/A" if m is None or m.gi is None else str(m.gi)
                ci = "N/A" if m is None or m.ci is None else str(m.ci)
                name = process_name(p.pid)
                name = name if len(name) <= 38 else "..." + name[-35:]
                mem = "N/A" if p.usedGpuMemory is None else f"{p.usedGpuMemory // MIB}MiB"
                rows.append(f"|{g.index:>5}{gi:>6}{ci:>5}{p.pid:>10}{'C':>7}   {name:<40}{mem:>10} |")
    return rows or ["|  No running processes found                                                           |"]


def summary(gpus: list[Gpu], out: IO[str]) -> int:
    """``nvidia-smi``: the GPUs, then their MIG devices, then the processes (the layout of driver 535)."""
    driver = nvml_text(N.nvmlSystemGetDriverVersion())
    cuda = try_nvml(N.nvmlSystemGetCudaDriverVersion)
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
        gpus = read_gpus(_gpu_ids(opts.get("id")))
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
