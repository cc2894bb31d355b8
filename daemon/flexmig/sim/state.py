"""The simulated node's mutable state and the rules a driver enforces on it.

One :class:`SimNodeState` holds every GPU, GPU instance (GI), compute instance (CI, = one MIG device) and process.
Driver-side operations (the ones NVML calls reach) raise :class:`NvmlReturn` with the NVML code a real driver
returns; test-side operations (start a process, set activity) raise :class:`~flexmig.errors.SimError`.
Callers hold :attr:`SimNodeState.lock` around every operation: the library and the test handle share it.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import SimError
from flexmig.mig import GpuModel, Layout, Profile
from flexmig.sim.ciprofiles import CiShape, ci_shape
from flexmig.sim.drivers import DriverRelease, driver_release
from flexmig.sim.gi_ids import DriverIds, GiIdPolicy, default_fused_slot
from flexmig.sim.gpm import Counters
from flexmig.sim.model import CI_PROFILE_COUNT, FAKE_PID_BASE, MIB, Activity

__all__ = [
    "NvmlReturn",
    "SimComputeInstance",
    "SimGpu",
    "SimGpuInstance",
    "SimNodeState",
    "SimProcess",
    "gpu_uuid",
    "pid_alive",
]


class NvmlReturn(Exception):
    """Carries an NVML return code out of the model to the C-function surface, which returns it as an int."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def pid_alive(pid: int, *, proc: Path = Path("/proc")) -> bool:
    """True when a process with ``pid`` exists and is not a zombie.

    Signal 0 probes without sending anything, but it also succeeds on a zombie: a process that has exited and
    that no parent has reaped yet (an orphan under an init that does not reap, or a child whose parent has not
    called wait). A zombie holds no GPU memory on a real driver, so it must not hold any here either; its state
    (``Z``, or ``X`` while being reaped) is read from ``proc``/PID/stat. Where that file cannot be read (no /proc),
    the signal probe decides.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return False
    return _proc_state(proc, pid) not in ("Z", "X")


def _proc_state(proc: Path, pid: int) -> str | None:
    """The state letter of ``proc``/PID/stat (the field after the parenthesised command name), None if unreadable."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    _, paren, rest = raw.rpartition(b")")  # the command name may itself hold ")" and spaces
    fields = rest.split()
    if not paren or not fields:
        return None
    return fields[0].decode("ascii", "replace")


def gpu_uuid(node_id: uuidlib.UUID, index: int) -> str:
    """A GPU UUID as drivers print them: 32 hex digits in the 8-4-4-4-12 form, but no RFC 4122 version or
    variant (real ones are not name- or random-based UUIDs: ``GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16``), fixed
    by the node and the index. MIG UUIDs, unlike these, are version 5 on real drivers too."""
    raw = bytearray(hashlib.sha256(f"{node_id}/gpu/{index}".encode()).digest()[:16])
    if raw[6] >> 4 == 5 and raw[8] >> 6 == 2:
        raw[6] ^= 0x70  # would read as an RFC 4122 version-5 UUID: not what a GPU shows
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(slots=True)
class SimProcess:
    """A compute process holding GPU memory. ``real`` processes are dropped once their pid is gone."""

    pid: int
    memory_bytes: int
    real: bool
    workload: bool = False  # started by the synthetic workload, which may stop it again


@dataclass(slots=True, eq=False)
class SimComputeInstance:
    """A compute instance; with MIG enabled each one is a MIG device with its own ``MIG-`` UUID and handle."""

    serial: int  # unique over the node's lifetime: identifies handles, never reused
    id: int
    shape: CiShape  # its compute-instance profile (flexmig.sim.ciprofiles)
    start: int
    uuid: str
    gi: SimGpuInstance
    processes: dict[int, SimProcess] = field(default_factory=dict)
    activity: Activity = field(default_factory=Activity)

    @property
    def profile_id(self) -> int:
        """NVML compute-instance profile ID (equal to its index)."""
        return self.shape.index

    @property
    def slices(self) -> int:
        """Compute slices, as its profile's name says (``1c``)."""
        return self.shape.slices

    @property
    def span(self) -> int:
        """Compute slots it takes inside its GPU instance."""
        return self.shape.span


@dataclass(slots=True, eq=False)
class SimGpuInstance:
    """A GPU instance: a profile at a placement, with a driver-chosen ID, holding compute instances."""

    serial: int
    id: int
    profile: Profile
    start: int
    gpu: SimGpu
    counters: Counters
    cis: dict[int, SimComputeInstance] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Placement size in memory slices."""
        return self.profile.memory_slices

    @property
    def memory_total_bytes(self) -> int:
        """The instance's memory, as MIG device memory info reports it."""
        return self.profile.memory_mib * MIB

    def memory_used_bytes(self) -> int:
        """Memory held by the processes of all its compute instances (they share the GI's memory)."""
        return sum(p.memory_bytes for ci in self.cis.values() for p in ci.processes.values())


@dataclass(slots=True, eq=False)
class SimGpu:
    """One physical GPU."""

    index: int
    uuid: str
    model: GpuModel
    counters: Counters
    fused: int = 7  # the compute slot fused off on this chip, shown as virtual memory slice 7 (flexmig.sim.gi_ids)
    memory_mib: int = 0  # the whole GPU's memory as its driver reports it (0: the catalogue's)
    mig_current: bool = True
    mig_pending: bool = True
    lost: bool = False
    layout: Layout | None = None
    gis: dict[int, SimGpuInstance] = field(default_factory=dict)
    processes: dict[int, SimProcess] = field(default_factory=dict)  # only with MIG disabled
    activity: Activity = field(default_factory=Activity)  # only with MIG disabled
    mig_order: list[SimComputeInstance] = field(default_factory=list)  # MIG devices by index

    @property
    def memory_total_bytes(self) -> int:
        """The whole GPU's memory, as its driver reports it."""
        return (self.memory_mib or self.model.memory_mib) * MIB

    def memory_used_bytes(self) -> int:
        """Memory held by all processes on the GPU (MIG instances included)."""
        own = sum(p.memory_bytes for p in self.processes.values())
        return own + sum(gi.memory_used_bytes() for gi in self.gis.values())

    def all_processes(self) -> Iterator[tuple[SimProcess, SimComputeInstance | None]]:
        """Every process on the GPU with its compute instance (None with MIG disabled)."""
        for p in self.processes.values():
            yield p, None
        for ci in self.mig_order:
            for p in ci.processes.values():
                yield p, ci


class SimNodeState:
    """All GPUs of one simulated node plus the bookkeeping a driver keeps (IDs, UUIDs, the process table)."""

    def __init__(
        self,
        model: GpuModel,
        count: int,
        *,
        node_id: uuidlib.UUID,
        clock: Callable[[], float],
        is_alive: Callable[[int], bool] = pid_alive,
        ids: GiIdPolicy | None = None,
        driver: DriverRelease | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self.ids: GiIdPolicy = DriverIds() if ids is None else ids
        self.driver = driver_release(None) if driver is None else driver
        self.ci_rev1 = self.driver.ci_rev1  # Hopper's 1_SLICE_REV1 compute-instance profile (branch 525 and on)
        self.model = model
        self.node_id = node_id
        self.clock = clock
        self.is_alive = is_alive
        self.privileged = True
        self.init_count = 0
        self.serial = 0
        self.next_fake_pid = FAKE_PID_BASE
        self.gis_by_serial: dict[int, SimGpuInstance] = {}
        self.cis_by_serial: dict[int, SimComputeInstance] = {}
        self.by_uuid: dict[str, SimGpu | SimComputeInstance] = {}
        self.pids: dict[int, tuple[SimGpu, SimComputeInstance | None]] = {}
        self.on_change: Callable[[], None] = lambda: None
        now = clock()
        self.gpus: list[SimGpu] = []
        for i in range(count):
            gpu = SimGpu(
                index=i,
                uuid=gpu_uuid(node_id, i),
                model=model,
                counters=Counters(now),
                fused=default_fused_slot(str(node_id), i),
                memory_mib=self.driver.memory_total_mib(model),
            )
            gpu.layout = Layout.empty(model)
            self.gpus.append(gpu)
            self.by_uuid[gpu.uuid] = gpu

    # ------------------------------------------------------------------------------------------- helpers
    def next_serial(self) -> int:
        """A fresh lifetime serial for a GI or CI."""
        self.serial += 1
        return self.serial

    def changed(self) -> None:
        """Call after every mutation: refreshes derived data and persists the state if a path is set."""
        self.on_change()

    def _require_privilege(self) -> None:
        if not self.privileged:
            raise NvmlReturn(N.NVML_ERROR_NO_PERMISSION)

    def _reorder(self, gpu: SimGpu) -> None:
        gpu.mig_order = sorted((ci for gi in gpu.gis.values() for ci in gi.cis.values()), key=lambda c: (c.gi.id, c.id))

    def refresh_rates(self, gpu: SimGpu) -> None:
        """Recompute GPM counter rates of ``gpu`` and its GIs after activity or instances changed."""
        now = self.clock()
        total = [0.0, 0.0, 0.0, 0.0]
        if not gpu.mig_current:
            total = list(gpu.activity.as_tuple())
        for gi in gpu.gis.values():
            g = gi.profile.compute_slices
            rates = [0.0, 0.0, 0.0, 0.0]
            for ci in gi.cis.values():
                for k, v in enumerate(ci.activity.as_tuple()):
                    rates[k] += v * ci.span / g
            gi.counters.set_rates(now, (rates[0], rates[1], rates[2], rates[3]))
            for k in range(4):
                total[k] += rates[k] * g / gpu.model.compute_slices
        gpu.counters.set_rates(now, (total[0], total[1], total[2], total[3]))

    def gpu_load(self, gpu: SimGpu) -> float:
        """One 0..1 figure for power, temperature and clocks."""
        r = gpu.counters.rates
        return min(1.0, 0.8 * r[0] + 0.2 * r[2])

    # ------------------------------------------------------------------------------ process liveness
    def prune(self, procs: dict[int, SimProcess]) -> bool:
        """Drop real processes whose pid no longer exists; True if any were dropped."""
        dead = [pid for pid, p in procs.items() if p.real and not self.is_alive(pid)]
        for pid in dead:
            gpu, ci = self.pids.pop(pid)
            del procs[pid]
            if ci is not None and not ci.processes:
                ci.activity = Activity()
            elif ci is None and not gpu.processes:
                gpu.activity = Activity()
            self.refresh_rates(gpu)
        if dead:
            self.changed()
        return bool(dead)

    def live_processes(self, gpu: SimGpu, ci: SimComputeInstance | None) -> list[tuple[SimProcess, int, int]]:
        """(process, GI id, CI id) on a MIG device, or on the whole GPU when ``ci`` is None; dead pids pruned."""
        out: list[tuple[SimProcess, int, int]] = []
        none = 0xFFFFFFFF
        if ci is not None:
            if ci.processes:
                self.prune(ci.processes)
            return [(p, ci.gi.id, ci.id) for p in ci.processes.values()]
        if gpu.processes:
            self.prune(gpu.processes)
        out.extend((p, none, none) for p in gpu.processes.values())
        for c in list(gpu.mig_order):
            if c.processes:
                self.prune(c.processes)
            out.extend((p, c.gi.id, c.id) for p in c.processes.values())
        return out

    def has_processes(self, gpu: SimGpu) -> bool:
        """True if any live process runs on ``gpu``."""
        return bool(self.live_processes(gpu, None))

    # ------------------------------------------------------------------------------ driver operations
    def set_mig_mode(self, gpu: SimGpu, mode: int) -> int:
        """nvmlDeviceSetMigMode: returns the activation status (IN_USE while processes run: only pending flips)."""
        self._require_privilege()
        if mode not in (N.NVML_DEVICE_MIG_DISABLE, N.NVML_DEVICE_MIG_ENABLE):
            raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
        want = mode == N.NVML_DEVICE_MIG_ENABLE
        gpu.mig_pending = want
        if self.has_processes(gpu):
            self.changed()
            return int(N.NVML_ERROR_IN_USE)
        self._apply_mig_mode(gpu)
        self.changed()
        return int(N.NVML_SUCCESS)

    def _apply_mig_mode(self, gpu: SimGpu) -> None:
        if gpu.mig_current == gpu.mig_pending:
            return
        for gi in list(gpu.gis.values()):
            for ci in list(gi.cis.values()):
                self._drop_ci(ci)
            self._drop_gi(gi)
        gpu.mig_current = gpu.mig_pending
        gpu.layout = Layout.empty(gpu.model) if gpu.mig_current else None
        gpu.activity = Activity()
        self._reorder(gpu)
        self.refresh_rates(gpu)

    def require_mig(self, gpu: SimGpu) -> None:
        """NOT_SUPPORTED unless MIG mode is currently enabled (what MIG calls on a non-MIG GPU return)."""
        if not gpu.mig_current:
            raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)

    def create_gi(self, gpu: SimGpu, profile: Profile, start: int | None, size: int | None = None) -> SimGpuInstance:
        """Create a GPU instance, at ``start`` or where the driver chooses; its ID is the driver's choice too.

        Both choices are the ID policy's (:mod:`flexmig.sim.gi_ids`): what drivers do, or an adversary.
        """
        self._require_privilege()
        self.require_mig(gpu)
        layout = gpu.layout
        assert layout is not None
        if start is None:
            fits = [s for s in profile.starts if layout.can_place(profile, s)]
            if not fits:
                raise NvmlReturn(N.NVML_ERROR_INSUFFICIENT_RESOURCES)
            start = self.ids.choose_start(gpu.index, gpu.fused, profile.memory_slices, fits, list(gpu.gis.values()))
        else:
            # nvml.h: INVALID_ARGUMENT "If [...] placement [is] invalid" (a start or size the profile never has);
            # INSUFFICIENT_RESOURCES is for a valid placement that is taken.
            if start not in profile.starts or (size is not None and size != profile.memory_slices):
                raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
            if layout.why_not(profile, start):
                raise NvmlReturn(N.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = self.ids.assign(gpu.index, gpu.fused, profile.memory_slices, start, list(gpu.gis.values()))
        gpu.layout = layout.place(profile, start)
        gi = SimGpuInstance(
            serial=self.next_serial(),
            id=gi_id,
            profile=profile,
            start=start,
            gpu=gpu,
            counters=Counters(self.clock()),
        )
        assert gi.id not in gpu.gis, "the ID policy gave a duplicate GI id"
        gpu.gis[gi.id] = gi
        self.gis_by_serial[gi.serial] = gi
        self.changed()
        return gi

    def _drop_gi(self, gi: SimGpuInstance) -> None:
        gpu = gi.gpu
        del gpu.gis[gi.id]
        del self.gis_by_serial[gi.serial]
        assert gpu.layout is not None
        gpu.layout = gpu.layout.remove(gi.start)
        self.ids.released(gpu.index, gi.id)

    def destroy_gi(self, gi: SimGpuInstance) -> None:
        """nvmlGpuInstanceDestroy: IN_USE while the GI still has compute instances (and so processes)."""
        self._require_privilege()
        if gi.cis:
            raise NvmlReturn(N.NVML_ERROR_IN_USE)
        self._drop_gi(gi)
        self.refresh_rates(gi.gpu)
        self.changed()

    def ci_free_starts(self, gi: SimGpuInstance, shape: CiShape) -> list[int]:
        """Starts inside ``gi`` where a compute instance of ``shape`` could be created now."""
        used = {s for ci in gi.cis.values() for s in range(ci.start, ci.start + ci.span)}
        if sum(1 for ci in gi.cis.values() if ci.profile_id == shape.index) >= shape.instance_count:
            return []
        return [s for s in shape.starts if not any(x in used for x in range(s, s + shape.span))]

    def ci_shape(self, gi: SimGpuInstance, profile_id: int) -> CiShape:
        """CI profile ``profile_id`` of ``gi``; INVALID_ARGUMENT past the index range, NOT_SUPPORTED if not offered."""
        if not 0 <= profile_id < CI_PROFILE_COUNT:
            raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
        shape = ci_shape(gi.gpu.model, gi.profile, profile_id, rev1=self.ci_rev1)
        if shape is None:
            raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
        return shape

    def create_ci(self, gi: SimGpuInstance, profile_id: int, start: int | None) -> SimComputeInstance:
        """Create a compute instance in ``gi`` (lowest free start when ``start`` is None)."""
        self._require_privilege()
        shape = self.ci_shape(gi, profile_id)
        free = self.ci_free_starts(gi, shape)
        if start is None:
            if not free:
                raise NvmlReturn(N.NVML_ERROR_INSUFFICIENT_RESOURCES)
            start = free[0]
        elif start not in free:
            raise NvmlReturn(N.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(8) if i not in gi.cis)
        serial = self.next_serial()
        ci = SimComputeInstance(
            serial=serial,
            id=ci_id,
            shape=shape,
            start=start,
            uuid=f"MIG-{uuidlib.uuid5(self.node_id, f'mig/{serial}')}",
            gi=gi,
        )
        self._add_ci(ci)
        self.changed()
        return ci

    def _add_ci(self, ci: SimComputeInstance) -> None:
        ci.gi.cis[ci.id] = ci
        self.cis_by_serial[ci.serial] = ci
        self.by_uuid[ci.uuid] = ci
        self._reorder(ci.gi.gpu)

    def _drop_ci(self, ci: SimComputeInstance) -> None:
        for pid in ci.processes:
            self.pids.pop(pid, None)
        del ci.gi.cis[ci.id]
        del self.cis_by_serial[ci.serial]
        del self.by_uuid[ci.uuid]
        self._reorder(ci.gi.gpu)

    def destroy_ci(self, ci: SimComputeInstance) -> None:
        """nvmlComputeInstanceDestroy: IN_USE while processes run on it."""
        self._require_privilege()
        if ci.processes:
            self.prune(ci.processes)
        if ci.processes:
            raise NvmlReturn(N.NVML_ERROR_IN_USE)
        self._drop_ci(ci)
        self.refresh_rates(ci.gi.gpu)
        self.changed()

    # ------------------------------------------------------------------------------ test-side operations
    def _target(self, uuid: str) -> tuple[SimGpu, SimComputeInstance | None]:
        found = self.by_uuid.get(uuid)
        if found is None:
            raise SimError(f"no GPU or MIG device with UUID {uuid!r} on the simulated node")
        if isinstance(found, SimComputeInstance):
            return found.gi.gpu, found
        if found.mig_current:
            raise SimError(f"MIG is enabled on GPU {found.index} ({uuid}): start processes on one of its MIG devices")
        return found, None

    def start_process(
        self, uuid: str, pid: int | None, memory_bytes: int, real: bool | None, *, workload: bool = False
    ) -> int:
        """Put a process on the MIG device (or MIG-disabled GPU) ``uuid``; returns its pid."""
        gpu, ci = self._target(uuid)
        if gpu.lost:
            raise SimError(f"GPU {gpu.index} is lost; nothing can start on it")
        if memory_bytes < 0:
            raise SimError(f"process memory must be >= 0 bytes, not {memory_bytes}")
        if pid is None:
            pid = self.next_fake_pid
            self.next_fake_pid += 1
            is_real = False if real is None else real
        else:
            if pid < 1:
                raise SimError(f"pid must be a positive integer, not {pid}")
            is_real = True if real is None else real
        if pid in self.pids:
            raise SimError(f"pid {pid} already runs on the simulated node")
        self._check_room(gpu, ci, memory_bytes)
        procs = ci.processes if ci is not None else gpu.processes
        procs[pid] = SimProcess(pid=pid, memory_bytes=memory_bytes, real=is_real, workload=workload)
        self.pids[pid] = (gpu, ci)
        self.changed()
        return pid

    def _check_room(self, gpu: SimGpu, ci: SimComputeInstance | None, extra: int) -> None:
        if ci is not None:
            total, used, what = ci.gi.memory_total_bytes, ci.gi.memory_used_bytes(), ci.uuid
        else:
            total, used, what = gpu.memory_total_bytes, gpu.memory_used_bytes(), gpu.uuid
        if used + extra > total:
            raise SimError(f"{extra} bytes do not fit on {what}: {used} of {total} bytes are already used")

    def stop_process(self, pid: int) -> None:
        """Remove process ``pid``; the device goes idle (activity 0) when its last process leaves."""
        where = self.pids.pop(pid, None)
        if where is None:
            raise SimError(f"no process {pid} on the simulated node")
        gpu, ci = where
        if ci is not None:
            del ci.processes[pid]
            if not ci.processes:
                ci.activity = Activity()
        else:
            del gpu.processes[pid]
            if not gpu.processes:
                gpu.activity = Activity()
        self.refresh_rates(gpu)
        self.changed()

    def set_process_memory(self, pid: int, memory_bytes: int) -> None:
        """Change how much memory process ``pid`` holds."""
        where = self.pids.get(pid)
        if where is None:
            raise SimError(f"no process {pid} on the simulated node")
        gpu, ci = where
        procs = ci.processes if ci is not None else gpu.processes
        proc = procs[pid]
        if memory_bytes < 0:
            raise SimError(f"process memory must be >= 0 bytes, not {memory_bytes}")
        self._check_room(gpu, ci, memory_bytes - proc.memory_bytes)
        proc.memory_bytes = memory_bytes
        self.changed()

    def set_activity(self, uuid: str, activity: Activity) -> None:
        """Set how busy the MIG device (or MIG-disabled GPU) ``uuid`` is from now on."""
        for v in activity.as_tuple():
            if not 0.0 <= v <= 1.0:
                raise SimError(f"activity fractions must be within 0..1, got {activity}")
        gpu, ci = self._target(uuid)
        if ci is not None:
            ci.activity = activity
        else:
            gpu.activity = activity
        self.refresh_rates(gpu)

    def gpu_at(self, index: int) -> SimGpu:
        """GPU ``index``; SimError names the valid range."""
        if not 0 <= index < len(self.gpus):
            raise SimError(f"no GPU {index} on the simulated node (it has {len(self.gpus)})")
        return self.gpus[index]

    def reset_gpu(self, index: int) -> None:
        """A simulated GPU reset: brings a lost GPU back and applies a pending MIG mode (needs no processes)."""
        gpu = self.gpu_at(index)
        if self.has_processes(gpu):
            raise SimError(f"GPU {index} still runs processes; stop them before a reset")
        gpu.lost = False
        self._apply_mig_mode(gpu)
        self.changed()

    # ------------------------------------------------------------------------------ restore (persistence)
    def restore_gi(self, gpu: SimGpu, profile: Profile, start: int, gi_id: int, serial: int) -> SimGpuInstance:
        """Recreate a GI read back from a state file (validated against the placement rules)."""
        assert gpu.layout is not None
        gpu.layout = gpu.layout.place(profile, start)
        gi = SimGpuInstance(
            serial=serial, id=gi_id, profile=profile, start=start, gpu=gpu, counters=Counters(self.clock())
        )
        if gi_id in gpu.gis:
            raise SimError(f"GPU {gpu.index}: GI id {gi_id} appears twice")
        gpu.gis[gi_id] = gi
        self.gis_by_serial[serial] = gi
        return gi

    def restore_ci(
        self, gi: SimGpuInstance, ci_id: int, *, profile_id: int, start: int, uuid: str, serial: int
    ) -> SimComputeInstance:
        """Recreate a CI read back from a state file or a recording."""
        shape = ci_shape(gi.gpu.model, gi.profile, profile_id, rev1=True)
        if shape is None or start not in self.ci_free_starts(gi, shape):
            raise SimError(f"GPU {gi.gpu.index} GI {gi.id}: CI {ci_id} of profile {profile_id} at {start} does not fit")
        if ci_id in gi.cis or uuid in self.by_uuid:
            raise SimError(f"GPU {gi.gpu.index} GI {gi.id}: CI {ci_id} / {uuid} appears twice")
        ci = SimComputeInstance(serial=serial, id=ci_id, shape=shape, start=start, uuid=uuid, gi=gi)
        self._add_ci(ci)
        return ci
