"""The simulated node's state file: what a driver keeps across a crash of the program that uses it.

A real driver outlives a daemon that crashes mid-reconfiguration: its GPU instances, compute instances, MIG UUIDs
and processes are still there when the daemon starts again. With a state path, the simulator writes its state as
JSON after every mutation (write a temporary file, then ``os.replace``, so a reader never sees half a file), and
``install`` restores it instead of building the node from the spec.

Each MIG device's activity is kept too (``activity``: SM, occupancy, DRAM, tensor fractions), so that processes
following the node through the file (:mod:`flexmig.sim.follow`) measure what the daemon's node shows; GPM counters
are not kept: they are measurements, not configuration, and a reader integrates the activity over its own clock.
Real processes (a pid given by the caller) whose pid no longer exists are dropped at load, as they are whenever
processes are listed.
"""

from __future__ import annotations

import json
import os
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexmig.errors import LayoutError, SimError
from flexmig.hook.boundedjson import JsonBoundsError
from flexmig.hook.boundedjson import loads as bounded_loads
from flexmig.mig import GpuModel, Layout, model_by_key
from flexmig.sim.drivers import DriverRelease, driver_release
from flexmig.sim.gi_ids import GiIdPolicy
from flexmig.sim.model import Activity
from flexmig.sim.state import SimComputeInstance, SimGpu, SimNodeState, SimProcess, pid_alive

__all__ = ["SCHEMA_VERSION", "load_state", "save_state", "state_from_dict", "state_to_dict"]

_MAX_STATE_BYTES = 256 * 1024 * 1024  # eight GPUs with thousands of processes take a few MiB
_MAX_STATE_DEPTH = 16

SCHEMA_VERSION = 1


def _proc(p: SimProcess) -> dict[str, Any]:
    return {"pid": p.pid, "memory_bytes": p.memory_bytes, "real": p.real, "workload": p.workload}


def state_to_dict(state: SimNodeState) -> dict[str, Any]:
    """The JSON-able form of ``state``."""
    gpus = []
    for gpu in state.gpus:
        gis = []
        for gi in sorted(gpu.gis.values(), key=lambda g: g.id):
            cis = [
                {
                    "id": ci.id,
                    "serial": ci.serial,
                    "slices": ci.slices,
                    "profile_id": ci.profile_id,
                    "start": ci.start,
                    "uuid": ci.uuid,
                    "processes": [_proc(p) for p in ci.processes.values()],
                    "activity": list(ci.activity.as_tuple()),
                }
                for ci in sorted(gi.cis.values(), key=lambda c: c.id)
            ]
            gis.append(
                {"id": gi.id, "serial": gi.serial, "profile_id": gi.profile.profile_id, "start": gi.start, "cis": cis}
            )
        gpus.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "mig_current": gpu.mig_current,
                "mig_pending": gpu.mig_pending,
                "lost": gpu.lost,
                "processes": [_proc(p) for p in gpu.processes.values()],
                "gpu_instances": gis,
            }
        )
    return {
        "schema": SCHEMA_VERSION,
        "model": state.model.key,
        "count": len(state.gpus),
        "node_id": str(state.node_id),
        "driver": state.driver.version,
        "serial": state.serial,
        "next_fake_pid": state.next_fake_pid,
        "gpus": gpus,
    }


def save_state(state: SimNodeState, path: Path) -> None:
    """Write ``state`` to ``path`` atomically (temporary file in the same directory, then ``os.replace``)."""
    data = json.dumps(state_to_dict(state), separators=(",", ":"))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(data, encoding="utf-8")
    tmp.replace(path)


def load_state(
    path: Path,
    model: GpuModel,
    count: int,
    clock: Callable[[], float],
    is_alive: Callable[[int], bool] = pid_alive,
    *,
    ids: GiIdPolicy | None = None,
    driver: DriverRelease | None = None,
) -> SimNodeState:
    """Rebuild a node from the state file at ``path``; SimError names the file and what is wrong with it.

    ``model`` and ``count`` come from the spec passed to ``install`` and must match the file's node; ``ids`` hands
    out the IDs of GPU instances created from now on (those in the file keep theirs); ``driver`` is the release
    the spec names, which must be the one the file was written with.
    """
    try:
        raw = bounded_loads(path.read_bytes(), max_bytes=_MAX_STATE_BYTES, max_depth=_MAX_STATE_DEPTH)
    except (OSError, JsonBoundsError) as exc:
        raise SimError(f"cannot read simulator state file {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise SimError(
            f"simulator state file {path} must hold a JSON object (the simulated node), not {type(raw).__name__}; "
            "delete it to start from the spec"
        )
    try:
        return _build(raw, model, count, clock=clock, is_alive=is_alive, path=path, ids=ids, driver=driver)
    except (AttributeError, KeyError, TypeError, ValueError, LayoutError) as exc:
        if isinstance(exc, SimError):
            raise
        raise SimError(f"simulator state file {path} is malformed: {exc!r}") from exc


def state_from_dict(
    raw: object, path: Path, clock: Callable[[], float], is_alive: Callable[[int], bool] = pid_alive
) -> SimNodeState:
    """A node from the parsed state file ``raw`` (read from ``path``, named in errors), whatever model and GPU count
    it holds; SimError says what is wrong with it."""
    if not isinstance(raw, dict):
        raise SimError(f"simulator state file {path} must hold a JSON object (the simulated node)")
    try:
        model = model_by_key(str(raw["model"]))
        count = int(raw["count"])
        if not 1 <= count <= 64:
            raise SimError(f"simulator state file {path} holds {count} GPUs (1-64)")
        release = driver_release(str(raw["driver"]) if "driver" in raw else None)  # the file's own driver
        return _build(raw, model, count, clock=clock, is_alive=is_alive, path=path, ids=None, driver=release)
    except (AttributeError, KeyError, TypeError, ValueError, LayoutError) as exc:
        if isinstance(exc, SimError):
            raise
        raise SimError(f"simulator state file {path} is malformed: {exc!r}") from exc


def _build(
    raw: dict[str, Any],
    model: GpuModel,
    count: int,
    *,
    clock: Callable[[], float],
    is_alive: Callable[[int], bool],
    path: Path,
    ids: GiIdPolicy | None,
    driver: DriverRelease | None,
) -> SimNodeState:
    release = _check_header(raw, model, count, path=path, driver=driver)
    node_id = uuidlib.UUID(str(raw["node_id"]))
    state = SimNodeState(model, count, node_id=node_id, clock=clock, is_alive=is_alive, ids=ids, driver=release)
    state.serial = int(raw["serial"])
    state.next_fake_pid = int(raw["next_fake_pid"])
    for g in raw["gpus"]:
        gpu = state.gpu_at(int(g["index"]))
        del state.by_uuid[gpu.uuid]
        gpu.uuid = str(g["uuid"])
        state.by_uuid[gpu.uuid] = gpu
        gpu.mig_current = bool(g["mig_current"])
        gpu.mig_pending = bool(g["mig_pending"])
        gpu.lost = bool(g["lost"])
        gpu.layout = Layout.empty(model) if gpu.mig_current else None
        for p in g["processes"]:
            _restore_proc(state, gpu.processes, p, (gpu, None), is_alive)
        for gi_raw in g["gpu_instances"]:
            _restore_gi(state, gpu, gi_raw, path=path, is_alive=is_alive)
        state.refresh_rates(gpu)
    return state


def _check_header(
    raw: dict[str, Any], model: GpuModel, count: int, *, path: Path, driver: DriverRelease | None
) -> DriverRelease:
    """The driver release to restore on; SimError when the file holds another schema, node shape or driver."""
    if raw.get("schema") != SCHEMA_VERSION:
        raise SimError(f"simulator state file {path} has schema {raw.get('schema')!r}, expected {SCHEMA_VERSION}")
    file_model = model_by_key(str(raw["model"]))
    if file_model is not model or int(raw["count"]) != count:
        raise SimError(
            f"simulator state file {path} holds a {raw['model']}x{raw['count']} node, not {model.key}x{count}; "
            "use the same spec or delete the file"
        )
    release = driver_release(None) if driver is None else driver
    saved = str(raw.get("driver", release.version))
    if saved != release.version:
        raise SimError(
            f"simulator state file {path} holds a node on driver {saved}, not {release.version}; "
            "use the same spec or delete the file"
        )
    return release


def _restore_gi(
    state: SimNodeState, gpu: SimGpu, gi_raw: dict[str, Any], *, path: Path, is_alive: Callable[[int], bool]
) -> None:
    """One saved GPU instance of ``gpu``, its compute instances and their processes."""
    if not gpu.mig_current:
        raise SimError(f"simulator state file {path}: GPU {gpu.index} has MIG disabled but GPU instances")
    gi = state.restore_gi(
        gpu,
        state.model.profile_by_id(int(gi_raw["profile_id"])),
        int(gi_raw["start"]),
        int(gi_raw["id"]),
        int(gi_raw["serial"]),
    )
    for c in gi_raw["cis"]:
        ci = state.restore_ci(
            gi,
            int(c["id"]),
            profile_id=_ci_profile(c),
            start=int(c["start"]),
            uuid=str(c["uuid"]),
            serial=int(c["serial"]),
        )
        for p in c["processes"]:
            _restore_proc(state, ci.processes, p, (gpu, ci), is_alive)
        if c.get("activity") is not None and ci.processes:  # files written before it was kept have none
            ci.activity = _activity(c["activity"], path)


def _ci_profile(raw: dict[str, Any]) -> int:
    """A saved compute instance's profile ID (files written before it was saved hold only its plain size)."""
    if "profile_id" in raw:
        return int(raw["profile_id"])
    return {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[int(raw["slices"])]


def _restore_proc(
    state: SimNodeState,
    procs: dict[int, SimProcess],
    raw: dict[str, Any],
    where: tuple[SimGpu, SimComputeInstance | None],
    is_alive: Callable[[int], bool],
) -> None:
    proc = SimProcess(
        pid=int(raw["pid"]),
        memory_bytes=int(raw["memory_bytes"]),
        real=bool(raw["real"]),
        workload=bool(raw["workload"]),
    )
    if proc.real and not is_alive(proc.pid):
        return
    if proc.pid in state.pids:
        raise SimError(f"pid {proc.pid} appears twice in the simulator state file")
    procs[proc.pid] = proc
    state.pids[proc.pid] = where


def _activity(raw: object, path: Path) -> Activity:
    if not isinstance(raw, list) or len(raw) != 4:
        raise SimError(f"simulator state file {path}: an activity is four fractions, not {raw!r}")
    values = [float(v) for v in raw]
    if not all(0.0 <= v <= 1.0 for v in values):
        raise SimError(f"simulator state file {path}: activity fractions must be within 0..1, not {raw!r}")
    return Activity(*values)
