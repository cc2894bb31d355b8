"""``SimNode``: the handle through which tests, the demo and the actuator's tests change the simulated node.

Everything here takes the node's lock, so a test thread can start processes while the daemon's NVML worker
thread sweeps. Mistakes (an unknown UUID, a pid already in use) raise :class:`~flexmig.errors.SimError`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from flexmig.mig import NodeSpec
from flexmig.sim.faults import Fault, FaultTable
from flexmig.sim.library import SimLibrary
from flexmig.sim.memory import idle_used_bytes
from flexmig.sim.model import Activity
from flexmig.sim.persist import save_state
from flexmig.sim.state import SimComputeInstance, SimGpu, SimNodeState, SimProcess
from flexmig.sim.truth import ComputeInstanceTruth, GpuInstanceTruth, GpuTruth, ProcessTruth
from flexmig.sim.workload import SyntheticWorkload

__all__ = ["SimNode"]


def _proc(p: SimProcess) -> ProcessTruth:
    return ProcessTruth(pid=p.pid, memory_bytes=p.memory_bytes, real=p.real)


class SimNode:
    """A simulated MIG node installed under pynvml (see :func:`flexmig.sim.install`)."""

    def __init__(
        self,
        spec: NodeSpec,
        state: SimNodeState,
        faults: FaultTable,
        library: SimLibrary,
        *,
        state_path: Path | None,
        seed: int,
    ) -> None:
        self.spec = spec
        self.state_path = state_path
        self.seed = seed
        self._state = state
        self._faults = faults
        self._library = library
        self._workload = SyntheticWorkload(seed)
        self._quiet = False
        state.on_change = self._persist

    # ------------------------------------------------------------------------------------- persistence
    def _persist(self) -> None:
        if self.state_path is not None and not self._quiet:
            save_state(self._state, self.state_path)

    def save(self) -> None:
        """Write the state file now (every mutation already does; no-op without a state path)."""
        with self._state.lock:
            self._persist()

    # ------------------------------------------------------------------------------------------ facts
    @property
    def clock(self) -> Callable[[], float]:
        """The clock the simulated GPM counters run on."""
        return self._state.clock

    @property
    def gpu_count(self) -> int:
        """Number of GPUs."""
        return len(self._state.gpus)

    def gpus(self) -> tuple[GpuTruth, ...]:
        """Ground truth of every GPU (dead real pids are pruned first, as a process listing would)."""
        with self._state.lock:
            return tuple(self._truth(g) for g in self._state.gpus)

    def gpu(self, index: int) -> GpuTruth:
        """Ground truth of GPU ``index``."""
        with self._state.lock:
            return self._truth(self._state.gpu_at(index))

    def gpm_samples_allocated(self) -> int:
        """GPM sample buffers allocated and not yet freed (a leak shows here)."""
        with self._state.lock:
            return self._library.gpm_sample_count()

    def mig_uuids(self, gpu_index: int | None = None) -> tuple[str, ...]:
        """MIG device UUIDs of one GPU, or of all GPUs in GPU then MIG-index order."""
        with self._state.lock:
            gpus = self._state.gpus if gpu_index is None else [self._state.gpu_at(gpu_index)]
            return tuple(ci.uuid for g in gpus for ci in g.mig_order)

    def _truth(self, gpu: SimGpu) -> GpuTruth:
        procs = tuple(_proc(p) for p, _, _ in self._state.live_processes(gpu, None))
        gis = tuple(
            GpuInstanceTruth(
                id=gi.id,
                profile=gi.profile,
                start=gi.start,
                compute_instances=tuple(
                    ComputeInstanceTruth(
                        id=ci.id,
                        profile_id=ci.profile_id,
                        slices=ci.slices,
                        start=ci.start,
                        uuid=ci.uuid,
                        processes=tuple(_proc(p) for p in ci.processes.values()),
                        activity=ci.activity,
                    )
                    for ci in sorted(gi.cis.values(), key=lambda c: c.id)
                ),
                idle_used_bytes=idle_used_bytes(gi),
            )
            for gi in sorted(gpu.gis.values(), key=lambda g: g.id)
        )
        return GpuTruth(
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            mig_current=gpu.mig_current,
            mig_pending=gpu.mig_pending,
            lost=gpu.lost,
            layout=gpu.layout,
            gpu_instances=gis,
            mig_uuids=tuple(ci.uuid for ci in gpu.mig_order),
            processes=procs,
            fused_slot=gpu.fused,
        )

    # --------------------------------------------------------------------------------------- workload
    def start_process(
        self, uuid: str, *, pid: int | None = None, memory_bytes: int = 0, real: bool | None = None
    ) -> int:
        """Start a compute process on MIG device ``uuid`` (or on a GPU with MIG disabled); returns its pid.

        Without ``pid`` a fake pid (above any real pid_max) is assigned. A given ``pid`` is taken as a real
        process (``real`` defaults to True) and disappears from the node once that pid no longer exists.
        """
        with self._state.lock:
            return self._state.start_process(uuid, pid, memory_bytes, real)

    def stop_process(self, pid: int) -> None:
        """Stop process ``pid``; its device's activity drops to 0 when it was the last one."""
        with self._state.lock:
            self._state.stop_process(pid)

    def set_process_memory(self, pid: int, memory_bytes: int) -> None:
        """Change the GPU memory process ``pid`` holds."""
        with self._state.lock:
            self._state.set_process_memory(pid, memory_bytes)

    def set_activity(
        self, uuid: str, *, sm: float, dram: float = 0.0, tensor: float = 0.0, occupancy: float | None = None
    ) -> None:
        """Set the activity (fractions 0..1) of MIG device ``uuid`` from now on; GPM metrics follow it.

        ``occupancy`` defaults to half the SM activity.
        """
        act = Activity(sm=sm, occupancy=sm / 2 if occupancy is None else occupancy, dram=dram, tensor=tensor)
        with self._state.lock:
            self._state.set_activity(uuid, act)

    def step_workload(self, now: float, *, exclude: Collection[tuple[int, int]] = ()) -> None:
        """Advance the synthetic workload to time ``now``: start, resize or stop its processes, set activity.

        Instances at ``exclude`` (GPU index, first memory slice) get no synthetic process: one they have is
        stopped. The daemon excludes the instances its actuator uses, where jobs run their own processes.
        """
        state = self._state
        with state.lock:
            self._quiet = True
            try:
                for gpu in state.gpus:
                    if gpu.lost or not gpu.mig_current:
                        continue
                    for ci in list(gpu.mig_order):
                        if (gpu.index, ci.gi.start) in exclude:
                            for p in [p for p in ci.processes.values() if p.workload]:
                                state.stop_process(p.pid)
                            continue
                        self._step_device(gpu, ci, now)
            finally:
                self._quiet = False
            self._persist()

    def _step_device(self, gpu: SimGpu, ci: SimComputeInstance, now: float) -> None:
        state = self._state
        role = self._workload.role(gpu.index, ci.gi.start, ci.gi.profile.name)
        mine = [p for p in ci.processes.values() if p.workload]
        if role.kind == "idle":
            for p in mine:
                state.stop_process(p.pid)
            return
        if not ci.processes:
            state.start_process(ci.uuid, None, 0, False, workload=True)
            mine = [p for p in ci.processes.values() if p.workload]
        if mine:
            total = ci.gi.memory_total_bytes
            others = ci.gi.memory_used_bytes() - sum(p.memory_bytes for p in mine)
            target = max(0, min(int(role.memory_fraction(now) * total), total - others))
            state.set_process_memory(mine[0].pid, target)
        state.set_activity(ci.uuid, role.activity(now))

    # ------------------------------------------------------------------------------------------ faults
    def inject_error(self, call: str, code: int | str, *, gpu: int | None = None, times: int | None = 1) -> Fault:
        """Make NVML call ``call`` (C name, version suffix optional) return ``code`` (int or name like ``IN_USE``).

        Only for calls about GPU ``gpu`` when given; ``times`` calls (None: until :meth:`clear_errors`).
        """
        with self._state.lock:
            return self._faults.add(call, code, gpu=gpu, times=times)

    def garble(self, call: str, value: int, *, gpu: int | None = None) -> None:
        """Make reading ``call`` answer SUCCESS with the garbage ``value`` (a driver's sentinel such as
        ``0xFFFFFFFF``), on GPU ``gpu`` or all, until :meth:`clear_errors`."""
        with self._state.lock:
            self._faults.garble(call, value, gpu=gpu)

    def alias_uuid(self, uuid: str, reported: str) -> None:
        """Make the device ``uuid`` report ``reported`` as its UUID (two devices sharing one), until
        :meth:`clear_errors`."""
        with self._state.lock:
            self._faults.alias(uuid, reported)

    def clear_errors(self) -> None:
        """Remove every injected error, garbled reading and UUID alias."""
        with self._state.lock:
            self._faults.clear()

    def lose_gpu(self, index: int) -> None:
        """GPU ``index`` falls off the bus: every call about it returns GPU_IS_LOST until :meth:`reset_gpu`."""
        with self._state.lock:
            self._state.gpu_at(index).lost = True
            self._state.changed()

    def reset_gpu(self, index: int) -> None:
        """Reset GPU ``index``: recovers it if lost and applies a pending MIG mode (no process may run)."""
        with self._state.lock:
            self._state.reset_gpu(index)

    def set_privileged(self, privileged: bool) -> None:
        """As a non-root caller (False), MIG changes and aggregate MIG queries return NO_PERMISSION."""
        with self._state.lock:
            self._state.privileged = privileged
