"""A simulated node built from a ``flexmig nvml record`` document, answering as the recorded driver did.

The recording's layout (GPU and MIG UUIDs, GPU-instance IDs and placements, compute instances) becomes the node's
state, so handles, enumeration and every GPU/compute-instance call come from the model exactly as for a spec'd
node. Every other recorded call (``calls`` of a GPU, of a MIG device, of the system) is answered from the
recording: the same value written into the caller's outputs, or the same error code. A call or an input the
recording lacks falls through to the model.

Once a GPU's instances, MIG mode or processes change, its recorded answers (and its MIG devices') are dropped: the
recording described another state, so the model answers from then on.

Spec form: ``recording:PATH`` wherever a node spec is taken (``flexmigd --sim``, ``flexmig inventory --sim``).
"""

from __future__ import annotations

import ctypes
import json
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import LayoutError, SimError
from flexmig.mig import GpuModel, Layout, NodeSpec, model_by_name
from flexmig.sim.cabi import SUCCESS, int_arg
from flexmig.sim.drivers import DriverRelease, driver_release
from flexmig.sim.faults import error_code
from flexmig.sim.gi_ids import GiIdPolicy, infer_fused_slot
from flexmig.sim.state import SimComputeInstance, SimGpu, SimNodeState

__all__ = ["PREFIX", "RecordedAnswers", "load_recording", "state_from_recording"]

PREFIX = "recording:"
SCHEMA = "flexmig-nvml-record/1"
_MAX_BYTES = 64 << 20
_CARG = type(ctypes.byref(ctypes.c_int()))
_SYSTEM = frozenset({"nvmlDeviceGetCount_v2"})


def load_recording(path: Path) -> dict[str, Any]:
    """Read and check a recording; SimError names the file and what is wrong with it."""
    try:
        size = path.stat().st_size
        if size > _MAX_BYTES:
            raise SimError(f"recording {path} is {size} bytes; more than {_MAX_BYTES} is not a recording")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SimError(f"cannot read recording {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise SimError(f"{path} is not a flexmig nvml recording (schema {got!r}, expected {SCHEMA!r})")
    if not isinstance(doc.get("gpus"), list) or not doc["gpus"]:
        raise SimError(f"recording {path} holds no GPU")
    return doc


def _model(doc: dict[str, Any], path: Path) -> GpuModel:
    names = {str(g.get("name")) for g in doc["gpus"]}
    if len(names) != 1:
        raise SimError(f"recording {path} mixes GPU models {sorted(names)}; a simulated node has one model")
    name = names.pop()
    model = model_by_name(name)
    if model is None:
        raise SimError(f"recording {path}: the simulator has no MIG table for {name!r}")
    return model


def state_from_recording(
    doc: dict[str, Any], path: Path, clock: Callable[[], float], *, ids: GiIdPolicy | None = None
) -> tuple[SimNodeState, NodeSpec, RecordedAnswers]:
    """The node state a recording describes, its node spec (model and count) and its recorded answers.

    Each GPU's fused-off compute slot is the one that explains its recorded GPU-instance IDs
    (:func:`flexmig.sim.gi_ids.infer_fused_slot`), so instances created later get the IDs that GPU would give.
    """
    model = _model(doc, path)
    gpus = doc["gpus"]
    node_id = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"flexmig-recording/{gpus[0].get('uuid')}")
    release = _driver(doc, path)
    state = SimNodeState(model, len(gpus), node_id=node_id, clock=clock, ids=ids, driver=release)
    try:
        for raw in gpus:
            _restore_gpu(state, raw)
    except (KeyError, TypeError, ValueError, LayoutError) as exc:
        if isinstance(exc, SimError):
            raise SimError(f"recording {path}: {exc}") from exc
        raise SimError(f"recording {path} is malformed: {exc!r}") from exc
    for gpu in state.gpus:
        state.refresh_rates(gpu)
    spec = NodeSpec(model=model, count=len(gpus), layout=Layout.empty(model), driver=release.version)
    return state, spec, RecordedAnswers(doc, state)


def _driver(doc: dict[str, Any], path: Path) -> DriverRelease:
    """The driver release the recording was taken on (its ``nvmlSystemGetDriverVersion``): the model answers as
    that release for whatever the recording lacks, entry points it does not have included."""
    answer = (doc.get("system") or {}).get("nvmlSystemGetDriverVersion") or {}
    version = answer.get("value") if isinstance(answer, dict) else None
    if not isinstance(version, str):
        return driver_release(None)
    try:
        return driver_release(version)
    except SimError as exc:
        raise SimError(f"recording {path}: {exc}") from exc


def _restore_gpu(state: SimNodeState, raw: dict[str, Any]) -> None:
    gpu = state.gpu_at(int(raw["index"]))
    del state.by_uuid[gpu.uuid]
    gpu.uuid = str(raw["uuid"])
    state.by_uuid[gpu.uuid] = gpu
    layout = raw["layout"]
    gpu.mig_current = bool(layout["mig_current"])
    gpu.mig_pending = bool(layout["mig_pending"]) if layout["mig_pending"] is not None else gpu.mig_current
    gpu.lost = bool(raw.get("lost", False))
    gpu.layout = Layout.empty(gpu.model) if gpu.mig_current else None
    uuids = {(int(d["gpu_instance_id"]), int(d["compute_instance_id"])): str(d["uuid"]) for d in raw["mig_devices"]}
    for gi_raw in layout["gpu_instances"]:
        profile = gpu.model.profile_by_id(int(gi_raw["profile_id"]))
        gi = state.restore_gi(gpu, profile, int(gi_raw["start"]), int(gi_raw["id"]), state.next_serial())
        for ci_raw in gi_raw["compute_instances"]:
            serial = state.next_serial()
            ci_uuid = uuids.get((gi.id, int(ci_raw["id"])), f"MIG-{uuidlib.uuid5(state.node_id, f'mig/{serial}')}")
            start = int(ci_raw["start"])
            profile_id = int(ci_raw["profile_id"])
            state.restore_ci(gi, int(ci_raw["id"]), profile_id=profile_id, start=start, uuid=ci_uuid, serial=serial)
    gpu.fused = infer_fused_slot(((gi.start, gi.size, gi.id) for gi in gpu.gis.values()), gpu.fused)


def _signature(gpu: SimGpu) -> tuple[Any, ...]:
    """What a recording's answers about ``gpu`` depend on: its instances, MIG mode and processes."""
    return (
        gpu.mig_current,
        gpu.mig_pending,
        tuple(sorted((gi.id, gi.start, tuple(sorted(gi.cis))) for gi in gpu.gis.values())),
        tuple(sorted(p.pid for p, _ in gpu.all_processes())),
    )


class RecordedAnswers:
    """The recorded answers of one node, consulted by the simulated library before its model."""

    def __init__(self, doc: dict[str, Any], state: SimNodeState) -> None:
        self._system: dict[str, Any] = dict(doc.get("system") or {})
        self._gpus: dict[int, dict[str, Any]] = {}
        self._migs: dict[str, tuple[int, dict[str, Any]]] = {}
        for raw in doc["gpus"]:
            index = int(raw["index"])
            self._gpus[index] = dict(raw.get("calls") or {})
            for dev in raw.get("mig_devices") or ():
                self._migs[str(dev["uuid"])] = (index, dict(dev.get("calls") or {}))
        self._signatures = {gpu.index: _signature(gpu) for gpu in state.gpus}
        names = {k.split("(", 1)[0] for table in [self._system, *self._gpus.values()] for k in table}
        names |= {k.split("(", 1)[0] for _, table in self._migs.values() for k in table}
        self._names = frozenset(names)

    def covers(self, name: str) -> bool:
        """Whether the recording holds answers for entry point ``name`` at all (cheap pre-check)."""
        return name in self._names

    def _table(self, gpu: SimGpu, ci: SimComputeInstance | None) -> dict[str, Any] | None:
        if self._signatures.get(gpu.index) != _signature(gpu):
            self._gpus.pop(gpu.index, None)  # the GPU changed since the recording: the model answers now
            self._signatures.pop(gpu.index, None)
            for u in [u for u, (i, _) in self._migs.items() if i == gpu.index]:
                del self._migs[u]
            return None
        if ci is None:
            return self._gpus.get(gpu.index)
        found = self._migs.get(ci.uuid)
        return None if found is None else found[1]

    def answer(self, lib: Any, name: str, args: tuple[Any, ...]) -> int | None:
        """The recorded return code for this call, its outputs written; None when the recording cannot say."""
        if name.startswith("nvmlSystem") or name in _SYSTEM:
            table: dict[str, Any] | None = self._system
            rest = args
        else:
            gpu, ci = lib._device(args[0])
            table = self._table(gpu, ci)
            rest = args[1:]
        if table is None:
            return None
        inputs, outputs = _split(lib, rest)
        key = name if not inputs else f"{name}({','.join(str(i) for i in inputs)})"
        rec = table.get(key)
        if rec is None:
            return None
        if "error" in rec:
            return error_code(str(rec["error"]))
        values = rec["value"] if len(outputs) > 1 else [rec["value"]]
        code = SUCCESS
        for (kind, first, second), value in zip(outputs, values, strict=False):
            code = max(code, _write_output(kind, first, second, value))
        return code


def _split(lib: Any, rest: tuple[Any, ...]) -> tuple[list[int | str], list[tuple[str, Any, Any]]]:
    """The call's inputs (ints, ``gpuN`` for a GPU handle) and outputs, told apart by their ctypes kind."""
    inputs: list[int | str] = []
    outputs: list[tuple[str, Any, Any]] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        nxt = rest[i + 1] if i + 1 < len(rest) else ...
        if isinstance(a, ctypes.Array) and a._type_ is ctypes.c_char:
            outputs.append(("str", a, nxt))
            i += 2
        elif isinstance(a, _CARG) and (nxt is None or isinstance(nxt, ctypes.Array)):
            outputs.append(("list", a, nxt))
            i += 2
        elif isinstance(a, _CARG):
            outputs.append(("ref", a, None))
            i += 1
        elif (a is None or isinstance(a, ctypes.Array)) and isinstance(nxt, _CARG):
            outputs.append(("array-first list", nxt, a))  # placements: NULL asks for the count
            i += 2
        elif isinstance(a, ctypes._Pointer):
            gpu, _ = lib._device(a)
            inputs.append(f"gpu{gpu.index}")
            i += 1
        else:
            inputs.append(int_arg(a))
            i += 1
    return inputs, outputs


def _write_output(kind: str, first: Any, second: Any, value: Any) -> int:
    if kind == "str":
        data = str(value).encode()
        if len(data) + 1 > int_arg(second):
            return int(N.NVML_ERROR_INSUFFICIENT_SIZE)
        first.value = data
        return SUCCESS
    if kind in ("list", "array-first list"):
        count = first._obj
        items = list(value)
        if second is None and kind == "array-first list":
            count.value = len(items)  # nvml.h: placements "Can be NULL to discover number of allowed placements"
            return SUCCESS
        if second is None or count.value < len(items):
            count.value = len(items)
            return int(N.NVML_ERROR_INSUFFICIENT_SIZE) if items else SUCCESS
        for i, item in enumerate(items):
            if isinstance(item, dict):
                _fill(second[i], item)
            else:
                second[i] = item
        count.value = len(items)
        return SUCCESS
    _fill(first._obj, value)
    return SUCCESS


def _fill(target: Any, value: Any) -> None:
    """Write a recorded JSON value into a ctypes object: a struct field by field, an array item by item."""
    if isinstance(target, ctypes.Structure):
        kinds = {f[0]: f[1] for f in target._fields_}
        for name, v in value.items():
            kind = kinds.get(name)
            if kind is None:
                continue
            if issubclass(kind, ctypes.Structure | ctypes.Array) and not _is_chars(kind):
                _fill(getattr(target, name), v)
            else:
                setattr(target, name, v.encode() if isinstance(v, str) else v)
    elif isinstance(target, ctypes.Array):
        for i, v in enumerate(value):
            if isinstance(v, dict | list):
                _fill(target[i], v)
            else:
                target[i] = v
    else:
        target.value = value


def _is_chars(kind: Any) -> bool:
    return issubclass(kind, ctypes.Array) and kind._type_ is ctypes.c_char
