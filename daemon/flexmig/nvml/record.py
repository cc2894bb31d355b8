"""``flexmig nvml record``: how this machine's NVIDIA driver answers, captured read-only into one JSON document.

The recorder calls each query entry point the simulator implements, on every GPU and on every MIG device, straight
through pynvml's function pointers with C-shaped arguments, and writes down the value (numbers, strings, structs
as objects, lists) or the NVML error name. Calls that take inputs are made for each input that matters (clock
types, sensors, NVLink links, ECC counters, profile indices) and keyed ``name(input,...)``. The GPU- and
compute-instance layout is read with flexmig's own inventory. Nothing is changed: no MIG mode, no instance, no
reset, no setting; only ``Get``/``Is``/``Query`` entry points are ever called (a test holds the recorder to it).

The document is what ``--sim-from`` builds a simulated node from, so a run on a real GPU machine turns into a
simulator that answers as that machine did.
"""

from __future__ import annotations

import ctypes
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.nvml.calls import error_name
from flexmig.nvml.client import Nvml
from flexmig.nvml.types import Inventory

__all__ = [
    "BY_MEMORY_CLOCK",
    "BY_PROFILE_ID",
    "DEVICE_PROBES",
    "P2P",
    "SCHEMA",
    "SYSTEM_PROBES",
    "TOPOLOGY",
    "Probe",
    "key",
    "record",
]

SCHEMA = "flexmig-nvml-record/1"
_STR_SIZE = 256
_AFFINITY_WORDS = 2


class ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t``, which nvidia-ml-py no longer defines: what the unversioned process calls fill."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


@dataclass(frozen=True, slots=True)
class Probe:
    """One query entry point: its C name, the inputs to try, and the shape of its outputs.

    ``out`` codes: ``u``/``i``/``q`` an unsigned int, int or unsigned long long; ``s`` a string (buffer and size);
    ``uu``, ``ii``, ``uuuu`` several of those; ``S`` a struct of ``struct`` (``version`` set when given); ``Lu``,
    ``Lq`` a caller-allocated list of numbers (count, then array), ``LS`` of structs, ``PS`` of structs with the
    array before the count; ``A`` an array of ``_AFFINITY_WORDS`` unsigned long longs (its size is the first
    input). Inputs are ints, or ``gpuN`` for another GPU's handle.
    """

    name: str
    out: str
    inputs: tuple[tuple[int | str, ...], ...] = ((),)
    struct: Any = None
    version: int | None = None
    inputs_after: int = 0  # how many inputs come after the outputs (the affinity scope)


def _each(*ranges: Iterable[int | str]) -> tuple[tuple[int | str, ...], ...]:
    out: list[tuple[int | str, ...]] = [()]
    for r in ranges:
        out = [(*prefix, v) for prefix in out for v in r]
    return tuple(out)


_CLOCKS = range(4)  # GRAPHICS, SM, MEM, VIDEO

SYSTEM_PROBES: tuple[Probe, ...] = (
    Probe("nvmlSystemGetDriverVersion", "s"),
    Probe("nvmlSystemGetNVMLVersion", "s"),
    Probe("nvmlSystemGetCudaDriverVersion", "i"),
    Probe("nvmlSystemGetCudaDriverVersion_v2", "i"),
    Probe("nvmlDeviceGetCount_v2", "u"),
)

DEVICE_PROBES: tuple[Probe, ...] = (
    # identity
    Probe("nvmlDeviceGetName", "s"),
    Probe("nvmlDeviceGetUUID", "s"),
    Probe("nvmlDeviceGetIndex", "u"),
    Probe("nvmlDeviceGetSerial", "s"),
    Probe("nvmlDeviceGetBrand", "u"),
    Probe("nvmlDeviceGetMinorNumber", "u"),
    Probe("nvmlDeviceGetBoardId", "u"),
    Probe("nvmlDeviceGetBoardPartNumber", "s"),
    Probe("nvmlDeviceGetMultiGpuBoard", "u"),
    Probe("nvmlDeviceGetVbiosVersion", "s"),
    Probe("nvmlDeviceGetInforomVersion", "s", _each(range(3))),
    Probe("nvmlDeviceGetInforomImageVersion", "s"),
    Probe("nvmlDeviceGetArchitecture", "u"),
    Probe("nvmlDeviceGetCudaComputeCapability", "ii"),
    Probe("nvmlDeviceGetVirtualizationMode", "u"),
    Probe("nvmlDeviceGetPciInfo_v3", "S", struct=N.nvmlPciInfo_t),
    Probe("nvmlDeviceGetPciInfo_v2", "S", struct=N.nvmlPciInfo_t),
    Probe("nvmlDeviceGetAttributes_v2", "S", struct=N.c_nvmlDeviceAttributes),
    # memory
    Probe("nvmlDeviceGetMemoryInfo", "S", struct=N.c_nvmlMemory_t),
    Probe("nvmlDeviceGetMemoryInfo_v2", "S", struct=N.c_nvmlMemory_v2_t, version=N.nvmlMemory_v2),
    Probe("nvmlDeviceGetBAR1MemoryInfo", "S", struct=N.c_nvmlBAR1Memory_t),
    # modes
    Probe("nvmlDeviceGetPersistenceMode", "u"),
    Probe("nvmlDeviceGetComputeMode", "u"),
    Probe("nvmlDeviceGetDisplayMode", "u"),
    Probe("nvmlDeviceGetDisplayActive", "u"),
    Probe("nvmlDeviceGetAccountingMode", "u"),
    Probe("nvmlDeviceGetAccountingBufferSize", "u"),
    Probe("nvmlDeviceGetAccountingPids", "Lu"),
    Probe("nvmlDeviceGetDriverModel_v2", "uu"),
    Probe("nvmlDeviceGetDriverModel", "uu"),
    Probe("nvmlDeviceGetGpuOperationMode", "uu"),
    Probe("nvmlDeviceGetAutoBoostedClocksEnabled", "uu"),
    # utilization, processes
    Probe("nvmlDeviceGetUtilizationRates", "S", struct=N.c_nvmlUtilization_t),
    Probe("nvmlDeviceGetEncoderUtilization", "uu"),
    Probe("nvmlDeviceGetDecoderUtilization", "uu"),
    Probe("nvmlDeviceGetComputeRunningProcesses_v3", "LS", struct=N.c_nvmlProcessInfo_v3_t),
    Probe("nvmlDeviceGetComputeRunningProcesses_v2", "LS", struct=N.c_nvmlProcessInfo_v2_t),
    Probe("nvmlDeviceGetComputeRunningProcesses", "LS", struct=ProcessInfoV1),
    Probe("nvmlDeviceGetGraphicsRunningProcesses_v3", "LS", struct=N.c_nvmlProcessInfo_v3_t),
    Probe("nvmlDeviceGetGraphicsRunningProcesses_v2", "LS", struct=N.c_nvmlProcessInfo_v2_t),
    Probe("nvmlDeviceGetGraphicsRunningProcesses", "LS", struct=ProcessInfoV1),
    Probe("nvmlDeviceGetMPSComputeRunningProcesses_v3", "LS", struct=N.c_nvmlProcessInfo_v3_t),
    Probe("nvmlDeviceGetMPSComputeRunningProcesses_v2", "LS", struct=N.c_nvmlProcessInfo_v2_t),
    # power, heat, clocks
    Probe("nvmlDeviceGetPowerUsage", "u"),
    Probe("nvmlDeviceGetPowerManagementLimit", "u"),
    Probe("nvmlDeviceGetEnforcedPowerLimit", "u"),
    Probe("nvmlDeviceGetPowerManagementDefaultLimit", "u"),
    Probe("nvmlDeviceGetPowerManagementLimitConstraints", "uu"),
    Probe("nvmlDeviceGetPowerManagementMode", "u"),
    Probe("nvmlDeviceGetPowerState", "u"),
    Probe("nvmlDeviceGetPerformanceState", "u"),
    Probe("nvmlDeviceGetTotalEnergyConsumption", "q"),
    Probe("nvmlDeviceGetFanSpeed", "u"),
    Probe("nvmlDeviceGetTemperature", "u", _each([0])),
    Probe("nvmlDeviceGetTemperatureThreshold", "u", _each(range(8))),
    Probe("nvmlDeviceGetClockInfo", "u", _each(_CLOCKS)),
    Probe("nvmlDeviceGetMaxClockInfo", "u", _each(_CLOCKS)),
    Probe("nvmlDeviceGetApplicationsClock", "u", _each(_CLOCKS)),
    Probe("nvmlDeviceGetDefaultApplicationsClock", "u", _each(_CLOCKS)),
    Probe("nvmlDeviceGetMaxCustomerBoostClock", "u", _each(_CLOCKS)),
    Probe("nvmlDeviceGetSupportedMemoryClocks", "Lu"),
    Probe("nvmlDeviceGetCurrentClocksEventReasons", "q"),
    Probe("nvmlDeviceGetCurrentClocksThrottleReasons", "q"),
    Probe("nvmlDeviceGetSupportedClocksEventReasons", "q"),
    Probe("nvmlDeviceGetSupportedClocksThrottleReasons", "q"),
    # PCIe
    Probe("nvmlDeviceGetPcieThroughput", "u", _each(range(2))),
    Probe("nvmlDeviceGetCurrPcieLinkGeneration", "u"),
    Probe("nvmlDeviceGetMaxPcieLinkGeneration", "u"),
    Probe("nvmlDeviceGetGpuMaxPcieLinkGeneration", "u"),
    Probe("nvmlDeviceGetCurrPcieLinkWidth", "u"),
    Probe("nvmlDeviceGetMaxPcieLinkWidth", "u"),
    Probe("nvmlDeviceGetPcieReplayCounter", "u"),
    Probe("nvmlDeviceGetBridgeChipInfo", "S", struct=N.c_nvmlBridgeChipHierarchy_t),
    # ECC and memory health
    Probe("nvmlDeviceGetEccMode", "uu"),
    Probe("nvmlDeviceGetDefaultEccMode", "u"),
    Probe("nvmlDeviceGetTotalEccErrors", "q", _each(range(2), range(2))),
    Probe("nvmlDeviceGetDetailedEccErrors", "S", _each(range(2), range(2)), struct=N.c_nvmlEccErrorCounts_t),
    Probe("nvmlDeviceGetMemoryErrorCounter", "q", _each(range(2), range(2), range(8))),
    Probe("nvmlDeviceGetRemappedRows", "uuuu"),
    Probe("nvmlDeviceGetRetiredPages", "Lq", _each(range(2))),
    Probe("nvmlDeviceGetRetiredPagesPendingStatus", "u"),
    # topology
    Probe("nvmlDeviceGetNvLinkState", "u", _each(range(N.NVML_NVLINK_MAX_LINKS))),
    Probe("nvmlDeviceGetNvLinkVersion", "u", _each(range(N.NVML_NVLINK_MAX_LINKS))),
    Probe("nvmlDeviceGetNvLinkCapability", "u", _each(range(N.NVML_NVLINK_MAX_LINKS), range(N.NVML_NVLINK_CAP_COUNT))),
    Probe("nvmlDeviceGetNvLinkRemoteDeviceType", "u", _each(range(N.NVML_NVLINK_MAX_LINKS))),
    Probe("nvmlDeviceGetNvLinkRemotePciInfo_v2", "S", _each(range(N.NVML_NVLINK_MAX_LINKS)), struct=N.nvmlPciInfo_t),
    Probe("nvmlDeviceGetC2cModeInfoV", "S", struct=N.c_nvmlC2cModeInfo_v1_t),
    Probe("nvmlDeviceGetCpuAffinity", "A", _each([_AFFINITY_WORDS])),
    Probe("nvmlDeviceGetCpuAffinityWithinScope", "A", _each([_AFFINITY_WORDS], range(2)), inputs_after=1),
    Probe("nvmlDeviceGetMemoryAffinity", "A", _each([_AFFINITY_WORDS], range(2)), inputs_after=1),
    # vGPU, confidential computing
    Probe("nvmlDeviceGetGridLicensableFeatures_v4", "S", struct=N.c_nvmlGridLicensableFeatures_v4_t),
    Probe("nvmlDeviceGetConfComputeMemSizeInfo", "S", struct=N.c_nvmlConfComputeMemSizeInfo_t),
    # MIG
    Probe("nvmlDeviceGetMigMode", "uu"),
    Probe("nvmlDeviceGetMaxMigDeviceCount", "u"),
    Probe("nvmlDeviceIsMigDeviceHandle", "u"),
    Probe("nvmlDeviceGetGpuInstanceId", "u"),
    Probe("nvmlDeviceGetComputeInstanceId", "u"),
    Probe(
        "nvmlDeviceGetGpuInstanceProfileInfo",
        "S",
        _each(range(N.NVML_GPU_INSTANCE_PROFILE_COUNT)),
        struct=N.c_nvmlGpuInstanceProfileInfo_t,
    ),
    Probe(
        "nvmlDeviceGetGpuInstanceProfileInfoV",
        "S",
        _each(range(N.NVML_GPU_INSTANCE_PROFILE_COUNT)),
        struct=N.c_nvmlGpuInstanceProfileInfo_v2_t,
        version=N.nvmlGpuInstanceProfileInfo_v2,
    ),
    # GPM
    Probe("nvmlGpmQueryDeviceSupport", "S", struct=N.c_nvmlGpmSupport_t, version=N.NVML_GPM_SUPPORT_VERSION),
)

# Calls whose inputs come from what the GPU answered before (its profile IDs, its memory clocks, its peers).
BY_PROFILE_ID: tuple[Probe, ...] = (
    Probe(
        "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
        "S",
        struct=N.c_nvmlGpuInstanceProfileInfo_v2_t,
        version=N.nvmlGpuInstanceProfileInfo_v2,
    ),
    Probe("nvmlDeviceGetGpuInstanceRemainingCapacity", "u"),
    Probe("nvmlDeviceGetGpuInstancePossiblePlacements_v2", "PS", struct=N.c_nvmlGpuInstancePlacement_t),
)
BY_MEMORY_CLOCK = Probe("nvmlDeviceGetSupportedGraphicsClocks", "Lu")
P2P = Probe("nvmlDeviceGetP2PStatus", "u")
TOPOLOGY = Probe("nvmlDeviceGetTopologyCommonAncestor", "u")


def _jsonable(value: Any) -> Any:
    """A ctypes output as JSON: numbers, strings, structs as objects (pointers and padding left out), arrays as
    lists."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, ctypes.Structure):
        out: dict[str, Any] = {}
        for field in value._fields_:
            name, kind = field[0], field[1]
            if issubclass(kind, ctypes._Pointer) or (name.startswith("reserved") and issubclass(kind, ctypes.Array)):
                continue  # handles, and padding arrays; nvmlMemory_v2_t's ``reserved`` is a figure and stays
            out[name] = _jsonable(getattr(value, name))
        return out
    if isinstance(value, ctypes.Array):
        if value._type_ is ctypes.c_char:
            return _jsonable(value.value)
        return [_jsonable(v) for v in value]
    if isinstance(value, ctypes._SimpleCData):
        return _jsonable(value.value)
    return value


def _scalar(code: str) -> Any:
    return {"u": ctypes.c_uint, "i": ctypes.c_int, "q": ctypes.c_ulonglong}[code]


def key(name: str, inputs: Sequence[int | str]) -> str:
    """How a call with inputs is named in the document: ``nvmlDeviceGetClockInfo(2)``."""
    return name if not inputs else f"{name}({','.join(str(i) for i in inputs)})"


class _Caller:
    """Makes one probe's C call with freshly allocated outputs and returns its JSON answer."""

    def __init__(self, gpu_handles: Sequence[Any]) -> None:
        self.gpu_handles = gpu_handles

    def _input(self, value: int | str) -> Any:
        if isinstance(value, str):
            return self.gpu_handles[int(value.removeprefix("gpu"))]
        return ctypes.c_uint(value)

    def call(self, probe: Probe, target: Any, inputs: tuple[int | str, ...]) -> dict[str, Any]:
        try:
            fn = N._nvmlGetFunctionPointer(probe.name)
        except N.NVMLError as exc:
            return {"error": error_name(int(exc.value))}
        before = [self._input(v) for v in inputs[: len(inputs) - probe.inputs_after]]
        after = [self._input(v) for v in inputs[len(inputs) - probe.inputs_after :]]
        head = [] if target is None else [target]
        code = probe.out
        if code in ("Lu", "Lq", "LS", "PS"):
            return self._list(fn, probe, head + before)
        outs: list[Any]
        args: list[Any]
        if code == "s":
            buf = ctypes.create_string_buffer(_STR_SIZE)
            outs, args = [buf], [buf, ctypes.c_uint(_STR_SIZE)]
        elif code == "S":
            struct = probe.struct()
            if probe.version is not None:
                struct.version = probe.version
            outs, args = [struct], [ctypes.byref(struct)]
        elif code == "A":
            arr = (ctypes.c_ulonglong * _AFFINITY_WORDS)()
            outs, args = [arr], [ctypes.byref(arr)]
        else:
            outs = [_scalar(c)() for c in code]
            args = [ctypes.byref(o) for o in outs]
        ret = fn(*head, *before, *args, *after)
        if ret != N.NVML_SUCCESS:
            return {"error": error_name(int(ret))}
        values = [_jsonable(o) for o in outs]
        return {"value": values[0]} if len(values) == 1 else {"value": values}

    def _list(self, fn: Any, probe: Probe, head: list[Any]) -> dict[str, Any]:
        elem = probe.struct if probe.out in ("LS", "PS") else _scalar(probe.out[1])
        count = ctypes.c_uint(0)
        arr: Any = None
        for _ in range(4):  # the size-probe protocol; the list may grow between the calls
            args = [arr, ctypes.byref(count)] if probe.out == "PS" else [ctypes.byref(count), arr]
            ret = fn(*head, *args)
            if ret == N.NVML_SUCCESS and arr is None and count.value > 0:
                ret = N.NVML_ERROR_INSUFFICIENT_SIZE  # a NULL array answered with the count: allocate and ask again
            elif ret == N.NVML_SUCCESS:
                n = count.value if arr is not None else 0
                return {"value": [_jsonable(arr[i]) for i in range(n)]}
            if ret != N.NVML_ERROR_INSUFFICIENT_SIZE:
                return {"error": error_name(int(ret))}
            arr = (elem * max(1, count.value * 2 + 4))()
            count = ctypes.c_uint(len(arr))
        return {"error": "INSUFFICIENT_SIZE"}


def _probe_device(caller: _Caller, handle: Any, peers: int, self_index: int | None) -> dict[str, Any]:
    calls: dict[str, Any] = {}
    for probe in DEVICE_PROBES:
        for inputs in probe.inputs:
            calls[key(probe.name, inputs)] = caller.call(probe, handle, inputs)
    profile_ids = sorted(
        {
            int(answer["value"]["id"])
            for k, answer in calls.items()
            if k.startswith("nvmlDeviceGetGpuInstanceProfileInfoV(") and "value" in answer
        }
    )
    for probe in BY_PROFILE_ID:
        for pid in profile_ids:
            calls[key(probe.name, (pid,))] = caller.call(probe, handle, (pid,))
    mem_clocks = calls.get("nvmlDeviceGetSupportedMemoryClocks", {}).get("value", [])
    for mhz in mem_clocks:
        calls[key(BY_MEMORY_CLOCK.name, (mhz,))] = caller.call(BY_MEMORY_CLOCK, handle, (mhz,))
    for other in range(peers):
        if other != self_index:
            for index in range(5):
                calls[key(P2P.name, (f"gpu{other}", index))] = caller.call(P2P, handle, (f"gpu{other}", index))
            calls[key(TOPOLOGY.name, (f"gpu{other}",))] = caller.call(TOPOLOGY, handle, (f"gpu{other}",))
    return calls


def _layout(inv: Inventory, index: int) -> dict[str, Any]:
    g = inv.gpus[index]
    return {
        "mig_current": g.mig_current,
        "mig_pending": g.mig_pending,
        "gpu_instances": [
            {
                "id": gi.id,
                "profile_id": gi.profile_id,
                "profile_name": gi.profile_name,
                "start": gi.start,
                "size": gi.size,
                "compute_instances": [
                    {"id": c.id, "profile_id": c.profile_id, "start": c.start, "size": c.size}
                    for c in gi.compute_instances
                ],
            }
            for gi in g.gpu_instances
        ],
    }


def record(
    *, progress: Callable[[str], None] = lambda _: None, clock: Callable[[], dt.datetime] | None = None
) -> dict[str, Any]:
    """Walk the driver read-only and return the recording (see the module docstring). NVML must be loadable."""
    now = (clock or (lambda: dt.datetime.now(dt.UTC)))()
    with Nvml.open() as nvml:
        inv = nvml.inventory()
        handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.gpu_count)]
        caller = _Caller(handles)
        system = {probe.name: caller.call(probe, None, ()) for probe in SYSTEM_PROBES}
        gpus = []
        for i, handle in enumerate(handles):
            progress(f"GPU {i}")
            gpu_info = inv.gpus[i]
            migs = []
            for dev in gpu_info.mig_devices:
                progress(f"GPU {i} MIG {dev.index} ({dev.uuid})")
                mig = N.nvmlDeviceGetMigDeviceHandleByIndex(handle, dev.index)
                migs.append(
                    {
                        "index": dev.index,
                        "uuid": dev.uuid,
                        "gpu_instance_id": dev.gpu_instance_id,
                        "compute_instance_id": dev.compute_instance_id,
                        "calls": _probe_device(caller, mig, 0, None),
                    }
                )
            gpus.append(
                {
                    "index": i,
                    "uuid": gpu_info.uuid,
                    "name": gpu_info.name,
                    "lost": gpu_info.lost,
                    "layout": _layout(inv, i),
                    "calls": _probe_device(caller, handle, len(handles), i),
                    "mig_devices": migs,
                }
            )
    return {"schema": SCHEMA, "recorded_at": now.isoformat(timespec="seconds"), "system": system, "gpus": gpus}
