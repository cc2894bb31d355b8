"""What ``flexmig.nvml`` remembers between calls so a sweep makes only the calls whose answers can change.

Static per GPU: its handle, UUID, name, total memory, GPM support, the GPU- and compute-instance profile tables.
Static per MIG device lifetime (keyed by its ``MIG-`` UUID, new for every GI/CI lifetime): its GI and CI IDs.
MIG device *handles* are not trusted across sweeps: NVML may reuse them after a reconfiguration, so every sweep
enumerates them by index and identifies each by UUID.

Static per driver (:class:`Missing`): the versioned entry points it lacks. pynvml calls the newest version of a
symbol by default (``..._v3``, ``...V``); an older driver answers FunctionNotFound (pynvml's unversioned process
call even raises ``NVMLLibraryMismatchError``), so each such read falls back to the older version once, and stays
there: branch 470 has no ``nvmlDeviceGetComputeRunningProcesses_v3``, ``nvmlDeviceGetMemoryInfo_v2`` or
``nvmlDeviceGetGpuInstanceProfileInfoV`` (they came with 510), nor GPM (520).
"""

from __future__ import annotations

from ctypes import byref, c_uint, c_void_p
from dataclasses import dataclass, field
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.mig import model_by_name
from flexmig.mig.fastinit import fast_init
from flexmig.nvml.calls import (
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    OUT_OF_RANGE,
    GpuLost,
    Walk,
)
from flexmig.nvml.types import NvmlIssue

__all__ = ["CiProfile", "GiProfile", "GpuCache", "MigHandle", "MigStatic", "Missing", "memory_info", "processes"]

FUNCTION_NOT_FOUND = N.NVML_ERROR_FUNCTION_NOT_FOUND


@dataclass(slots=True)
class Missing:
    """Versioned entry points this driver lacks, learned from a FunctionNotFound (one per session, all GPUs)."""

    names: set[str] = field(default_factory=set)

    def newest(self, name: str, new: Any, old: Any) -> Any:
        """``new()``, or ``old()`` once ``name`` (what ``new`` calls) turned out missing; NVMLError otherwise."""
        if name not in self.names:
            try:
                return new()
            except N.NVMLError as exc:
                if exc.value != FUNCTION_NOT_FOUND:
                    raise
                self.names.add(name)
        return old()


@dataclass(frozen=True, slots=True)
class GiProfile:
    """A GPU-instance profile as this GPU's driver describes it (``nvidia-smi mig -lgip``)."""

    index: int
    id: int
    name: str  # without the "MIG " prefix
    instance_count: int
    compute_slices: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class CiProfile:
    """A compute-instance profile inside one GPU-instance profile (``nvidia-smi mig -lcip``)."""

    index: int
    id: int
    slices: int
    instance_count: int
    sm_count: int


@dataclass(frozen=True, slots=True)
class MigStatic:
    """What never changes during one MIG device's life."""

    gi_id: int
    ci_id: int


@fast_init
@dataclass(frozen=True, slots=True)
class MigHandle:
    """A MIG device found by this sweep's enumeration. ``confirmed``: its UUID was read through this handle in this
    enumeration; False when it is the UUID this handle answered at this index in the last one (still to be checked
    after the reads, which every sweep does: ``flexmig.nvml.client``)."""

    index: int
    handle: Any
    uuid: str
    static: MigStatic
    confirmed: bool = True


@dataclass(slots=True)
class GpuCache:
    """Per-GPU cache; ``index`` is NVML's GPU index."""

    index: int
    missing: Missing = field(default_factory=Missing)  # shared by every GPU of one session
    handle: Any = None
    uuid: str | None = None
    name: str | None = None
    memory_total: int | None = None
    pci_bus_id: str | None = None
    gpm: bool | None = None
    gi_profiles: dict[str, GiProfile] | None = None
    ci_profiles: dict[int, tuple[CiProfile, ...]] = field(default_factory=dict)
    mig_static: dict[str, MigStatic] = field(default_factory=dict)
    max_mig: int = 0  # nvmlDeviceGetMaxMigDeviceCount once MIG is on (0: not asked yet)
    answered: dict[int, tuple[int | None, str]] = field(default_factory=dict)
    """MIG index -> (handle address, UUID) as the last enumeration read them."""

    @property
    def target(self) -> str:
        """How issues and errors name this GPU."""
        return f"GPU {self.index}"

    def get_handle(self, walk: Walk) -> Any:
        """The GPU's handle (``nvmlDeviceGetHandleByIndex``), cached; GpuLost if NVML says the GPU is lost."""
        if self.handle is None:
            self.handle = walk.get(self.target, N.nvmlDeviceGetHandleByIndex, self.index)
        return self.handle

    def identity(self, walk: Walk) -> None:
        """Fill UUID, name, total memory and PCI bus ID once (``nvidia-smi --query-gpu=uuid,name,memory.total,
        pci.bus_id``)."""
        h = self.handle
        if self.uuid is None:
            self.uuid = walk.get(self.target, N.nvmlDeviceGetUUID, h)
        if self.name is None:
            self.name = walk.get(self.target, N.nvmlDeviceGetName, h)
        if self.memory_total is None:
            mem = memory_info(walk, self.target, h, self.missing)
            self.memory_total = int(mem.total) if mem is not None else None
        if self.pci_bus_id is None:
            pci = walk.get(self.target, N.nvmlDeviceGetPciInfo, h)
            self.pci_bus_id = _bus_id(pci.busId) if pci is not None else None

    def gpm_supported(self, walk: Walk) -> bool:
        """Whether the GPU has GPM (Hopper and newer), asked once (``nvmlGpmQueryDeviceSupport``)."""
        if self.gpm is None:
            try:
                support = N.nvmlGpmQueryDeviceSupport(self.handle)
            except N.NVMLError as exc:
                if exc.value == FUNCTION_NOT_FOUND:
                    self.gpm = False  # a driver older than GPM (branch 520): no GPU of it has any
                    return False
                walk.note(self.target, "nvmlGpmQueryDeviceSupport", exc)
                return False
            self.gpm = bool(support.isSupportedDevice)
        return self.gpm

    def profiles(self, walk: Walk) -> dict[str, GiProfile]:
        """GPU-instance profiles by name (``nvidia-smi mig -lgip``); empty while MIG is off (not cached then).

        Indices the driver does not offer answer NOT_SUPPORTED or INVALID_ARGUMENT and are skipped, as
        mig-parted does; the profile name is resolved per device because indices differ between GPUs. A driver
        without the v2 struct (before branch 510) gives no name: the catalogue names the profile by its ID.
        """
        if self.gi_profiles is not None:
            return self.gi_profiles
        found: dict[str, GiProfile] = {}
        for idx in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self.missing.newest(
                    "nvmlDeviceGetGpuInstanceProfileInfoV",
                    lambda i=idx: N.nvmlDeviceGetGpuInstanceProfileInfo(self.handle, i),
                    lambda i=idx: N.nvmlDeviceGetGpuInstanceProfileInfo(self.handle, i, version=1),
                )
            except N.NVMLError as exc:
                if exc.value in (NOT_SUPPORTED, INVALID_ARGUMENT):
                    continue
                walk.note(self.target, "nvmlDeviceGetGpuInstanceProfileInfo", exc)
                continue
            name = self._profile_name(walk, info)
            found[name] = GiProfile(
                idx, int(info.id), name, int(info.instanceCount), int(info.sliceCount), int(info.memorySizeMB)
            )
        if found:
            self.gi_profiles = found
        return found

    def _profile_name(self, walk: Walk, info: Any) -> str:
        """The v2 struct's name; for a v1 struct, the catalogue's name of the profile ID on this GPU's model."""
        raw = getattr(info, "name", None)
        if raw:
            return str(raw).removeprefix("MIG ")
        if self.name is None:
            self.name = walk.get(self.target, N.nvmlDeviceGetName, self.handle)
        model = model_by_name(self.name) if self.name else None
        named = model.profile_name(int(info.id)) if model is not None else None
        return named or f"{int(info.sliceCount)}g.{round(int(info.memorySizeMB) / 1024)}gb"

    def profile_by_id(self, walk: Walk, profile_id: int) -> GiProfile | None:
        """The GPU-instance profile with NVML profile ID ``profile_id``."""
        for p in self.profiles(walk).values():
            if p.id == profile_id:
                return p
        return None

    def compute_profiles(self, walk: Walk, gi: Any, gi_profile_id: int) -> tuple[CiProfile, ...]:
        """Compute-instance profiles of a GI of profile ``gi_profile_id`` (``nvidia-smi mig -lcip``), cached."""
        cached = self.ci_profiles.get(gi_profile_id)
        if cached is not None:
            return cached
        found: dict[int, CiProfile] = {}
        shared = N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        for idx in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self.missing.newest(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
                    lambda i=idx: N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, i, shared),
                    lambda i=idx: N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, i, shared, version=1),
                )
            except N.NVMLError as exc:
                if exc.value in (NOT_SUPPORTED, INVALID_ARGUMENT):
                    continue
                walk.note(self.target, "nvmlGpuInstanceGetComputeInstanceProfileInfo", exc)
                return tuple(found.values())
            # Two indices may share an ID (1_SLICE vs 1_SLICE_REV1): keep the one with more SMs (go-nvlib #85).
            prof = CiProfile(
                idx, int(info.id), int(info.sliceCount), int(info.instanceCount), int(info.multiprocessorCount)
            )
            if prof.id not in found or prof.sm_count > found[prof.id].sm_count:
                found[prof.id] = prof
        result = tuple(found.values())
        self.ci_profiles[gi_profile_id] = result
        return result

    def mig_handles(self, walk: Walk, taken: set[str] | None = None, *, recall: bool = False) -> list[MigHandle]:
        """This GPU's MIG devices now (``nvidia-smi -L``), by MIG index, skipping gaps instead of stopping.

        Costs two calls per device (handle by index, UUID); GI and CI IDs come from the UUID-keyed cache. With
        ``recall``, a device whose handle is the one the last enumeration found at its index is given the UUID read
        then, unconfirmed (one call): the caller checks it after its reads, as a sweep does anyway.

        A UUID is one device's name everywhere downstream (series labels, GPM windows, ``CUDA_VISIBLE_DEVICES``):
        a device that reports a UUID already seen in this sweep (on this GPU, or in ``taken``, the UUIDs of the GPUs
        read before it; filled in here) is left out, recorded as a ``DUPLICATE_UUID`` issue, rather than merged
        with the first one into a series that mixes two instances.
        """
        out: list[MigHandle] = []
        h = self.handle
        target = self.target
        seen: set[str] = set()
        answered = self.answered
        if not self.max_mig:
            self.max_mig = int(walk.get(target, N.nvmlDeviceGetMaxMigDeviceCount, h) or 0)
        for idx in range(self.max_mig):
            try:
                mh = _mig_handle(h, idx)
            except N.NVMLError as exc:
                answered.pop(idx, None)
                if exc.value == NOT_FOUND:
                    continue
                if exc.value == INVALID_ARGUMENT:
                    break  # past the GPU's maximum MIG device count (MIG was just turned off)
                walk.note(f"{target} MIG {idx}", "nvmlDeviceGetMigDeviceHandleByIndex", exc)
                continue
            address = _address(mh)
            last = answered.get(idx)
            recalled = recall and last is not None and last[0] == address
            if recalled and last is not None:
                uuid = last[1]
            else:
                read = walk.get(f"{target} MIG {idx}", N.nvmlDeviceGetUUID, mh)  # fails if destroyed meanwhile
                if read is None:
                    answered.pop(idx, None)
                    continue
                uuid = read
                answered[idx] = (address, read)
            found = self.identify(walk, (idx, mh, uuid), seen, taken, confirmed=not recalled)
            if found is not None:
                out.append(found)
        if len(self.mig_static) > len(seen):
            for gone in [u for u in self.mig_static if u not in seen]:
                del self.mig_static[gone]
        return out

    def identify(
        self,
        walk: Walk,
        device: tuple[int, Any, str],
        seen: set[str],
        taken: set[str] | None,
        *,
        confirmed: bool = True,
    ) -> MigHandle | None:
        """The MIG device ``(index, handle, UUID)``: None (recorded) when another device of the sweep has that UUID
        (``seen`` on this GPU, ``taken`` on the GPUs before; both filled in), or its GI and CI IDs cannot be read."""
        idx, mh, uuid = device
        if uuid in seen or (taken is not None and uuid in taken):
            where = f"{self.target} MIG {idx}"
            walk.issues.append(NvmlIssue("nvmlDeviceGetUUID", OUT_OF_RANGE, "DUPLICATE_UUID", where))
            return None
        seen.add(uuid)
        if taken is not None:
            taken.add(uuid)
        static = self.mig_static.get(uuid)
        if static is None:
            gi_id = walk.get(uuid, N.nvmlDeviceGetGpuInstanceId, mh)
            ci_id = walk.get(uuid, N.nvmlDeviceGetComputeInstanceId, mh)
            if gi_id is None or ci_id is None:
                return None
            static = self.mig_static[uuid] = MigStatic(int(gi_id), int(ci_id))
        return MigHandle(idx, mh, uuid, static, confirmed)

    def forget_mig(self) -> None:
        """Drop MIG-device facts after this process changed the GPU's instances."""
        self.mig_static.clear()
        self.answered.clear()


def memory_info(walk: Walk, target: str, handle: Any, missing: Missing) -> Any:
    """Framebuffer total and used (``nvidia-smi --query-gpu=memory.total,memory.used``), None if NVML cannot say.

    The v2 struct, whose ``used`` is what is allocated: on a whole GPU v1's ``used`` also counts the memory the
    driver reserves, hundreds of MiB (a MIG device reserves none: both say the same few MiB when it is idle).
    ``used == 0`` never means idle; the process list does. A driver without v2 (before branch 510) gets v1.
    """
    try:
        return missing.newest(
            "nvmlDeviceGetMemoryInfo_v2",
            lambda: N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2),
            lambda: N.nvmlDeviceGetMemoryInfo(handle),
        )
    except N.NVMLError as exc:
        walk.note(target, "nvmlDeviceGetMemoryInfo", exc)
        return None


def processes(walk: Walk, target: str, handle: Any, missing: Missing) -> tuple[Any, ...] | None:
    """Compute processes on a device (``nvidia-smi --query-compute-apps=pid,used_memory``); None if unknown.

    ``..._v3`` where the driver has it (510 and later), ``..._v2`` before: pynvml's unversioned call would raise
    ``NVMLLibraryMismatchError`` on an older driver instead of answering.
    """
    try:
        procs = missing.newest(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            lambda: N.nvmlDeviceGetComputeRunningProcesses_v3(handle),
            lambda: N.nvmlDeviceGetComputeRunningProcesses_v2(handle),
        )
    except N.NVMLError as exc:
        walk.note(target, "nvmlDeviceGetComputeRunningProcesses", exc)
        return None
    return tuple(procs)


def gpu_instances(walk: Walk, handle: Any, profile: GiProfile) -> list[Any] | None:
    """Handles of the GPU instances of one profile (``nvmlDeviceGetGpuInstances``, caller-allocated array).

    None when the caller may not list GPU instances at all (NO_PERMISSION: nvml.h says the call "Requires
    privileged user"), so the walk asks no other profile; a failure for this one profile gives ``[]``.
    """
    arr = (N.c_nvmlGpuInstance_t * max(1, profile.instance_count))()
    count = c_uint(0)
    try:
        N.nvmlDeviceGetGpuInstances(handle, profile.id, arr, byref(count))
    except N.NVMLError as exc:
        if exc.value == GPU_IS_LOST:
            raise GpuLost(str(profile.id)) from exc
        walk.note(f"profile {profile.name}", "nvmlDeviceGetGpuInstances", exc)
        return None if exc.value == NO_PERMISSION else []
    return [arr[i] for i in range(count.value)]


def compute_instances(walk: Walk, gi: Any, profile: CiProfile, target: str) -> list[Any]:
    """Handles of the compute instances of one profile in a GI (``nvmlGpuInstanceGetComputeInstances``)."""
    arr = (N.c_nvmlComputeInstance_t * max(1, profile.instance_count))()
    count = c_uint(0)
    try:
        N.nvmlGpuInstanceGetComputeInstances(gi, profile.id, arr, byref(count))
    except N.NVMLError as exc:
        walk.note(target, "nvmlGpuInstanceGetComputeInstances", exc)
        return []
    return [arr[i] for i in range(count.value)]


def _bus_id(raw: object) -> str | None:
    """NVML's ``busId`` field (``00000000:18:00.0``; pynvml gives str, a bare ctypes struct bytes); None if empty."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return text.strip("\x00 ") or None


def _mig_handle(parent: Any, index: int) -> Any:
    """``nvmlDeviceGetMigDeviceHandleByIndex`` through the C entry point pynvml resolved, as pynvml's wrapper calls
    it (a new handle object each time; NVMLError on failure), without the wrapper's own Python: a sweep asks once per
    MIG device."""
    handle = N.c_nvmlDevice_t()
    ret = N._nvmlGetFunctionPointer("nvmlDeviceGetMigDeviceHandleByIndex")(parent, c_uint(index), byref(handle))
    if ret != N.NVML_SUCCESS:
        raise N.NVMLError(ret)
    return handle


_pointer_value = c_void_p.from_buffer


def _address(handle: Any) -> int | None:
    """The address a handle holds (what ``ctypes.cast(handle, c_void_p).value`` gives, for a quarter of its cost)."""
    return _pointer_value(handle).value
