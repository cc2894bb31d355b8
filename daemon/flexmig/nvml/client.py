"""``Nvml``: flexmig's one door to NVML (the real driver, or the simulator installed under pynvml).

Reads (:meth:`Nvml.inventory`, :meth:`Nvml.sample`) never raise for a field NVML will not give: the field is None and
the failure is recorded as an :class:`~flexmig.nvml.types.NvmlIssue`; a lost GPU is marked lost and the walk goes on.
Actions (:meth:`Nvml.create_instance`, :meth:`Nvml.destroy_instance`) raise
:class:`~flexmig.errors.NvmlCallError` subclasses. Every call blocks; the daemon runs them all on one worker thread.
The object is not meant to be used from two threads at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from ctypes import byref, c_uint
from types import TracebackType
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import (
    LayoutError,
    NvmlCallError,
    NvmlGpuLostError,
    NvmlNotFoundError,
    NvmlUnavailableError,
)
from flexmig.mig import Offer
from flexmig.nvml.cache import (
    GiProfile,
    GpuCache,
    MigHandle,
    Missing,
    compute_instances,
    gpu_instances,
)
from flexmig.nvml.calls import INVALID_ARGUMENT, GpuLost, Walk, call_error, error_name, nvml_call
from flexmig.nvml.gpm import GpmWindows
from flexmig.nvml.reads import SweepReads
from flexmig.nvml.types import (
    ComputeInstanceInfo,
    GpuInfo,
    GpuInstanceInfo,
    GpuSample,
    Inventory,
    MigDeviceInfo,
    MigDeviceSample,
    NvmlIssue,
)

__all__ = ["Nvml"]

# Bounds no real reading passes: beyond them NVML answered a sentinel (0xFFFFFFFF and the like), not a value.
_MAX_POWER_MW = 10_000_000  # 10 kW: five times the largest board's limit
_TEMP_C = (-40, 200)  # a GPU below -40 °C or above 200 °C is a broken sensor (they shut down near 90-110 °C)
_MAX_MHZ = 20_000


def _reading(walk: Walk, target: str, fn: Any, args: tuple[Any, ...], *bounds: float) -> Any:
    """``fn(*args)`` through ``walk``, None when NVML cannot say or answers out of ``[lo, hi]`` (recorded as an
    ``OUT_OF_RANGE`` issue of that call: counted, and logged once while it persists)."""
    lo, hi = bounds
    return walk.bounded(target, fn.__name__, walk.get(target, fn, *args), lo, hi)

_UNAVAILABLE = {
    N.NVML_ERROR_LIBRARY_NOT_FOUND: "no NVIDIA driver found: libnvidia-ml.so.1 could not be loaded",
    N.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    N.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the NVIDIA driver was upgraded without reloading its kernel module",
    N.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
}


class Nvml:
    """An initialised NVML session. Open with :meth:`open`, close with :meth:`close` (or use ``with``)."""

    def __init__(self, gpu_count: int) -> None:
        """Use :meth:`open`; this only sets up the caches for ``gpu_count`` GPUs."""
        self._missing = Missing()  # versioned entry points this driver lacks (one driver for every GPU)
        self._reads = SweepReads(self._missing)
        self._gpus = [GpuCache(i, self._missing) for i in range(gpu_count)]
        self._driver: str | None = None
        self._nvml_version: str | None = None
        self._open = True

    # ------------------------------------------------------------------------------------------ session
    @classmethod
    def open(cls) -> Nvml:
        """``nvmlInit`` and count the GPUs. NvmlUnavailableError says why NVML cannot be used on this machine."""
        try:
            N.nvmlInit()
        except N.NVMLError as exc:
            why = _UNAVAILABLE.get(int(exc.value))
            if why is not None:
                raise NvmlUnavailableError(f"{why} (NVML {error_name(int(exc.value))})") from exc
            raise call_error("nvmlInit", exc, "node") from exc
        try:
            count = nvml_call("node", N.nvmlDeviceGetCount)
        except NvmlCallError:
            N.nvmlShutdown()
            raise
        return cls(count)

    def close(self) -> None:
        """``nvmlShutdown`` (once; later calls do nothing). Close GpmWindows first."""
        if self._open:
            self._open = False
            # The library may have gone away first (simulator uninstalled): then there is nothing to shut down.
            with suppress(N.NVMLError):
                N.nvmlShutdown()

    def __enter__(self) -> Nvml:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def gpu_count(self) -> int:
        """Number of GPUs NVML reported at open (``nvidia-smi --query-gpu=count``)."""
        return len(self._gpus)

    def _cache(self, gpu_index: int) -> GpuCache:
        if not 0 <= gpu_index < len(self._gpus):
            raise LayoutError(f"no GPU {gpu_index}: this node has GPUs 0..{len(self._gpus) - 1}")
        return self._gpus[gpu_index]

    # ---------------------------------------------------------------------------------------- inventory
    def inventory(self) -> Inventory:
        """The whole node now: ``nvidia-smi -q`` plus ``nvidia-smi mig -lgi`` / ``-lci`` and ``nvidia-smi -L``.

        Driver version, each GPU (index, UUID, PCI bus ID, name, memory, enforced power limit, MIG mode
        current/pending), its GPU instances with their compute instances, and its MIG devices with memory and
        processes. Works read-only without MIG.
        """
        walk = Walk()
        if self._driver is None:
            self._driver = walk.get("node", N.nvmlSystemGetDriverVersion)
        if self._nvml_version is None:
            self._nvml_version = walk.get("node", N.nvmlSystemGetNVMLVersion)
        node_issues = walk.take()
        taken: set[str] = set()
        gpus = tuple(self._gpu_info(g, walk, taken) for g in self._gpus)
        return Inventory(self._driver, self._nvml_version, gpus, node_issues)

    def _gpu_info(self, g: GpuCache, walk: Walk, taken: set[str]) -> GpuInfo:
        mig: list[int] | None = None
        limit: int | None = None
        gis: tuple[GpuInstanceInfo, ...] = ()
        devices: tuple[MigDeviceInfo, ...] = ()
        offers: tuple[Offer, ...] | None = None
        try:
            if g.get_handle(walk) is None:
                return _without_handle(g, walk)
            g.identity(walk)
            limit = walk.get(g.target, N.nvmlDeviceGetEnforcedPowerLimit, g.handle)
            mig = walk.get(g.target, N.nvmlDeviceGetMigMode, g.handle)
            if mig is not None and mig[0] == N.NVML_DEVICE_MIG_ENABLE:
                offered = g.profiles(walk)
                if offered:
                    offers = tuple(Offer(p.id, p.memory_mib, p.instance_count) for p in offered.values())
                gis = self._gpu_instances(g, walk)
                devices = tuple(self._mig_info(g, m, walk) for m in g.mig_handles(walk, taken))
        except GpuLost:
            g.handle = None
            return _without_handle(g, walk, lost=True)
        return GpuInfo(
            index=g.index,
            uuid=g.uuid or "",
            name=g.name,
            memory_total_bytes=g.memory_total,
            mig_current=None if mig is None else bool(mig[0]),
            mig_pending=None if mig is None else bool(mig[1]),
            gpu_instances=gis,
            mig_devices=devices,
            errors=walk.take(),
            pci_bus_id=g.pci_bus_id,
            power_limit_w=None if limit is None else limit / 1000.0,
            offers=offers,
        )

    def _gpu_instances(self, g: GpuCache, walk: Walk) -> tuple[GpuInstanceInfo, ...]:
        """``nvidia-smi mig -lgi`` and ``-lci``: every GI by profile, with its compute instances."""
        out: list[GpuInstanceInfo] = []
        for prof in g.profiles(walk).values():
            found = gpu_instances(walk, g.handle, prof)
            if found is None:
                break  # not privileged: MIG devices are still listed, from their own handles
            for gi in found:
                info = walk.get(g.target, N.nvmlGpuInstanceGetInfo, gi)
                if info is None:
                    continue
                target = f"{g.target} GI {int(info.id)}"
                cis: list[ComputeInstanceInfo] = []
                for ci_prof in g.compute_profiles(walk, gi, prof.id):
                    for ci in compute_instances(walk, gi, ci_prof, target):
                        ci_info = walk.get(target, N.nvmlComputeInstanceGetInfo, ci)
                        if ci_info is not None:
                            cis.append(
                                ComputeInstanceInfo(
                                    int(ci_info.id),
                                    int(ci_info.profileId),
                                    int(ci_info.placement.start),
                                    int(ci_info.placement.size),
                                )
                            )
                out.append(
                    GpuInstanceInfo(
                        id=int(info.id),
                        profile_id=int(info.profileId),
                        profile_name=prof.name,
                        start=int(info.placement.start),
                        size=int(info.placement.size),
                        compute_instances=tuple(sorted(cis, key=lambda c: c.id)),
                    )
                )
        return tuple(sorted(out, key=lambda i: i.id))

    def _mig_info(self, g: GpuCache, m: MigHandle, walk: Walk) -> MigDeviceInfo:
        reads = self._reads
        mem = reads.memory(walk, m.uuid, m.handle)
        procs = reads.processes(walk, m.uuid, m.handle)
        now = _uuid_now(walk, m, reads)
        if now != m.uuid:
            if now is not None:
                walk.issues.append(NvmlIssue("nvmlDeviceGetUUID", INVALID_ARGUMENT, "HANDLE_REUSED", m.uuid))
            mem = procs = None
        return MigDeviceInfo(
            index=m.index,
            uuid=m.uuid,
            gpu_instance_id=m.static.gi_id,
            compute_instance_id=m.static.ci_id,
            memory_total_bytes=None if mem is None else mem[0],
            memory_used_bytes=None if mem is None else mem[1],
            processes=procs,
        )

    # ------------------------------------------------------------------------------------------ sampling
    def sample(self, gpm: GpmWindows | None = None) -> tuple[GpuSample, ...]:
        """One telemetry sweep of every GPU and MIG device.

        Per GPU: ``nvidia-smi --query-gpu=power.draw,temperature.gpu,clocks.sm,clocks.mem,mig.mode.current``.
        Per MIG device: memory used/total, compute processes (``nvidia-smi --query-compute-apps``), and with
        ``gpm`` GPM activity (``dcgmi dmon -e 1002,1003,1005,1004`` is the DCGM equivalent; nvidia-smi has none).
        """
        if gpm is not None:
            gpm.begin_sweep()
        taken: set[str] = set()
        out = tuple(self._gpu_sample(g, gpm, taken) for g in self._gpus)
        if gpm is not None:
            gpm.end_sweep()
        return out

    def _gpu_sample(self, g: GpuCache, gpm: GpmWindows | None, taken: set[str]) -> GpuSample:
        walk = Walk()
        target = g.target
        try:
            h = g.get_handle(walk)
            if h is None:
                self._keep_windows(g, gpm)
                return GpuSample(g.index, g.uuid or "", None, None, None, None, None, errors=walk.take())
            if g.uuid is None:
                g.identity(walk)
            # Readings out of any physical range are driver sentinels (0xFFFFFFFF), not values: unavailable.
            power = _reading(walk, target, N.nvmlDeviceGetPowerUsage, (h,), 0, _MAX_POWER_MW)
            temp = _reading(walk, target, N.nvmlDeviceGetTemperature, (h, N.NVML_TEMPERATURE_GPU), *_TEMP_C)
            sm = _reading(walk, target, N.nvmlDeviceGetClockInfo, (h, N.NVML_CLOCK_SM), 0, _MAX_MHZ)
            memclk = _reading(walk, target, N.nvmlDeviceGetClockInfo, (h, N.NVML_CLOCK_MEM), 0, _MAX_MHZ)
            mig = walk.get(target, N.nvmlDeviceGetMigMode, h)
            mig_on = mig is not None and mig[0] == N.NVML_DEVICE_MIG_ENABLE
            devices: tuple[MigDeviceSample, ...] = ()
            if mig_on:
                use_gpm = gpm is not None and g.gpm_supported(walk)
                handles = g.mig_handles(walk, taken, recall=True)
                sampled = (self._mig_sample(g, m, gpm if use_gpm else None, walk, taken) for m in handles)
                devices = tuple(d for d in sampled if d is not None)
        except GpuLost:
            g.handle = None
            self._keep_windows(g, gpm)
            return GpuSample(g.index, g.uuid or "", None, None, None, None, None, lost=True, errors=walk.take())
        return GpuSample(
            index=g.index,
            uuid=g.uuid or "",
            power_w=None if power is None else power / 1000.0,
            temperature_c=None if temp is None else float(temp),
            sm_clock_mhz=sm,
            mem_clock_mhz=memclk,
            mig_current=None if mig is None else bool(mig[0]),
            mig_devices=devices,
            errors=walk.take(),
        )

    def _keep_windows(self, g: GpuCache, gpm: GpmWindows | None) -> None:
        """A GPU that could not be read keeps its GPM windows (they reseed if it comes back much later)."""
        if gpm is not None:
            for uuid in g.mig_static:
                gpm.keep(uuid)

    def _mig_sample(
        self, g: GpuCache, m: MigHandle, gpm: GpmWindows | None, walk: Walk, taken: set[str]
    ) -> MigDeviceSample | None:
        reads = self._reads
        mem = reads.memory(walk, m.uuid, m.handle)
        procs = reads.processes(walk, m.uuid, m.handle)
        now = _uuid_now(walk, m, reads)
        if now != m.uuid:
            if not m.confirmed and now is None:
                return None  # as an enumeration that reads no UUID skips the device (destroyed since)
            if not m.confirmed and now is not None:
                # The handle names another device than at the last sweep: identify it as an enumeration would
                # have, and read it again.
                g.answered[m.index] = (g.answered.get(m.index, (None, ""))[0], now)
                fresh = g.identify(walk, (m.index, m.handle, now), set(), taken)
                return None if fresh is None else self._mig_sample(g, fresh, gpm, walk, taken)
            if now is not None:
                walk.issues.append(NvmlIssue("nvmlDeviceGetUUID", INVALID_ARGUMENT, "HANDLE_REUSED", m.uuid))
            mem, procs = None, None
        activity = None if gpm is None else gpm.activity(walk, g.handle, m.static.gi_id, m.uuid)
        return MigDeviceSample(
            uuid=m.uuid,
            gpu_index=g.index,
            gpu_instance_id=m.static.gi_id,
            compute_instance_id=m.static.ci_id,
            memory_total_bytes=None if mem is None else mem[0],
            memory_used_bytes=None if mem is None else mem[1],
            processes=procs,
            activity=activity,
        )

    # ------------------------------------------------------------------------------------------- actions
    def _ready(self, gpu_index: int) -> GpuCache:
        """The GPU's cache with a handle, or the NvmlCallError that stops us getting one."""
        g = self._cache(gpu_index)
        if g.handle is None:
            g.handle = nvml_call(g.target, N.nvmlDeviceGetHandleByIndex, gpu_index)
        return g

    def _profile(self, g: GpuCache, profile_name: str) -> GiProfile:
        walk = Walk()
        with _lost_raises(g.target):
            profiles = g.profiles(walk)
        if not profiles and walk.issues:
            issue = walk.issues[0]
            raise call_error(issue.call, _Code(issue.code), g.target)
        wanted = profile_name.removeprefix("MIG ").strip()
        prof = profiles.get(wanted)
        if prof is None:
            if not profiles:
                raise LayoutError(f"{g.target} offers no MIG profiles (is MIG mode enabled?)")
            raise LayoutError(f"{g.target} has no MIG profile {wanted!r}; profiles: {', '.join(profiles)}")
        return prof

    def possible_placements(self, gpu_index: int, profile_name: str) -> tuple[tuple[int, int], ...]:
        """Every (start, size) in memory slices the profile may take on this GPU (``nvidia-smi mig -lgipp``).

        Static: it ignores the instances that exist. Needs privileges (NvmlNoPermissionError otherwise).
        """
        g = self._ready(gpu_index)
        prof = self._profile(g, profile_name)
        count = c_uint(0)
        nvml_call(g.target, N.nvmlDeviceGetGpuInstancePossiblePlacements, g.handle, prof.id, None, byref(count))
        arr = (N.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
        nvml_call(g.target, N.nvmlDeviceGetGpuInstancePossiblePlacements, g.handle, prof.id, arr, byref(count))
        return tuple((int(arr[i].start), int(arr[i].size)) for i in range(count.value))

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> bool:
        """``nvidia-smi -i N -mig 1|0``. True if it took effect now; False if it is pending (GPU busy or a reset is
        needed: NVML's activation status)."""
        g = self._ready(gpu_index)
        mode = N.NVML_DEVICE_MIG_ENABLE if enabled else N.NVML_DEVICE_MIG_DISABLE
        status = nvml_call(g.target, N.nvmlDeviceSetMigMode, g.handle, mode)
        g.forget_mig()
        g.gi_profiles = None
        g.max_mig = 0
        return bool(int(status) == N.NVML_SUCCESS)

    def create_instance(self, gpu_index: int, profile_name: str, start: int) -> MigDeviceInfo:
        """Create a GPU instance of ``profile_name`` at memory slice ``start`` and one compute instance spanning it.

        ``nvidia-smi mig -i N -cgi PROFILE:START -C``. The placement size comes from the possible placements
        (3g has size 4, not 3) and is passed by reference, as the C function wants. If the compute instance
        cannot be created the GPU instance is destroyed again. Returns the new MIG device (with its ``MIG-``
        UUID and the GI ID the driver chose). LayoutError for an unknown profile or a start it never allows;
        NvmlInsufficientResourcesError when it overlaps or the GPU is full.
        """
        g = self._ready(gpu_index)
        prof = self._profile(g, profile_name)
        sizes = dict(self.possible_placements(gpu_index, prof.name))
        if start not in sizes:
            allowed = ",".join(str(s) for s in sorted(sizes))
            raise LayoutError(f"{prof.name} may start only at memory slice {{{allowed}}} on {g.target}, not {start}")
        placement = N.c_nvmlGpuInstancePlacement_t(start, sizes[start])
        target = f"{g.target} {prof.name}@{start}"
        gi = nvml_call(target, N.nvmlDeviceCreateGpuInstanceWithPlacement, g.handle, prof.id, byref(placement))
        try:
            walk = Walk()
            with _lost_raises(target):
                # Every SM of the GPU instance: of the profiles that span it, the one with the most SMs (Hopper's
                # 1g with two memory slices offers 1_SLICE with 16 SMs and 1_SLICE_REV1 with 26; go-nvlib #85).
                full = sorted(
                    (c for c in g.compute_profiles(walk, gi, prof.id) if c.slices == prof.compute_slices),
                    key=lambda c: -c.sm_count,
                )
            if not full and walk.issues:
                raise call_error(walk.issues[0].call, _Code(walk.issues[0].code), target)
            if not full:
                raise NvmlNotFoundError(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo", N.NVML_ERROR_NOT_FOUND, "NOT_FOUND", target
                )
            ci = nvml_call(target, N.nvmlGpuInstanceCreateComputeInstance, gi, full[0].id)
            gi_id = int(nvml_call(target, N.nvmlGpuInstanceGetInfo, gi).id)
            ci_id = int(nvml_call(target, N.nvmlComputeInstanceGetInfo, ci).id)
        except NvmlCallError:
            # The original error is the one to report; a GI left behind shows up in the next inventory.
            with suppress(N.NVMLError):
                N.nvmlGpuInstanceDestroy(gi)
            raise
        finally:
            g.forget_mig()
        walk = Walk()
        with _lost_raises(target):
            for m in g.mig_handles(walk):
                if m.static.gi_id == gi_id and m.static.ci_id == ci_id:
                    return self._mig_info(g, m, walk)
        raise NvmlNotFoundError("nvmlDeviceGetMigDeviceHandleByIndex", N.NVML_ERROR_NOT_FOUND, "NOT_FOUND", target)

    def destroy_instance(self, gpu_index: int, gpu_instance_id: int) -> None:
        """Destroy a GPU instance and its compute instances (``nvidia-smi mig -i N -gi ID -dci`` then ``-dgi``).

        NvmlNotFoundError if there is no such GI; NvmlInUseError (nothing destroyed past that point) while a
        process runs on it.
        """
        g = self._ready(gpu_index)
        target = f"{g.target} GI {gpu_instance_id}"
        gi = nvml_call(target, N.nvmlDeviceGetGpuInstanceById, g.handle, gpu_instance_id)
        try:
            info = nvml_call(target, N.nvmlGpuInstanceGetInfo, gi)
            walk = Walk()
            with _lost_raises(target):
                cis = [
                    ci
                    for ci_prof in g.compute_profiles(walk, gi, int(info.profileId))
                    for ci in compute_instances(walk, gi, ci_prof, target)
                ]
            for ci in cis:
                nvml_call(target, N.nvmlComputeInstanceDestroy, ci)
            if walk.issues:
                issue = walk.issues[0]
                raise call_error(issue.call, _Code(issue.code), target)
            nvml_call(target, N.nvmlGpuInstanceDestroy, gi)
        finally:
            g.forget_mig()


def _uuid_now(walk: Walk, m: MigHandle, reads: SweepReads) -> str | None:
    """The UUID ``m``'s handle answers now (None, recorded, when it answers none), to check the reads made through it.

    nvml.h: a destroyed instance's handle "would remain invalid [...] Handles may be reused and their properties
    can change in the process". A repartition by anyone between the enumeration and the reads can hand the
    handle to a new device, so the reads are kept only if the handle still answers with the UUID it was enumerated
    as; else they are dropped and the issue recorded (the next sweep enumerates again). UUIDs are new for every
    instance's life, so the same UUID before and after means the reads are that device's.
    """
    try:
        return reads.uuid(m.handle)
    except N.NVMLError as exc:
        walk.note(m.uuid, "nvmlDeviceGetUUID", exc)
        return None


@contextmanager
def _lost_raises(target: str) -> Iterator[None]:
    """Inside an action, a GPU lost during a read-style helper is an error for the caller."""
    try:
        yield
    except GpuLost as exc:
        code = N.NVML_ERROR_GPU_IS_LOST
        raise NvmlGpuLostError("nvml", code, error_name(code), target) from exc


class _Code:
    """Stands in for a pynvml exception when re-raising a recorded issue (only ``.value`` is read)."""

    def __init__(self, value: int) -> None:
        self.value = value


def _without_handle(g: GpuCache, walk: Walk, *, lost: bool = False) -> GpuInfo:
    """A GPU that gives no handle (or was lost during the walk): what the cache knows of it, nothing of MIG."""
    return GpuInfo(
        g.index,
        g.uuid or "",
        g.name,
        g.memory_total,
        None,
        None,
        lost=lost,
        errors=walk.take(),
        pci_bus_id=g.pci_bus_id,
    )
