"""GPU instances and compute instances of the simulated ``libnvidia-ml``: their profiles, possible placements,
remaining capacity, creation and destruction, lookup and information, as the C entry points answer them.

The driver's rules, as nvml.h states them and drivers behave: MIG changes need a privileged caller
(``NO_PERMISSION`` otherwise) and MIG mode on; a placement must be one the profile allows (``INVALID_ARGUMENT``)
and free (``INSUFFICIENT_RESOURCES``); a GPU instance with compute instances, or a compute instance with
processes, is ``IN_USE`` for destruction; GPU-instance IDs and placements chosen without a request are the ID
policy's (:mod:`flexmig.sim.gi_ids`: as real drivers hand them out, or adversarially), and the profiles offered are
the driver release's (:mod:`flexmig.sim.drivers`). Mixed into :class:`~flexmig.sim.library.SimLibrary`; every
``nvml*`` method is one C entry point.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Protocol

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.sim.cabi import INVALID as _INVALID
from flexmig.sim.cabi import SUCCESS as _SUCCESS
from flexmig.sim.cabi import entry as _entry
from flexmig.sim.cabi import int_arg as _int
from flexmig.sim.cabi import out as _out
from flexmig.sim.model import CI_PROFILE_COUNT, GI_PROFILE_COUNT, ci_name
from flexmig.sim.state import NvmlReturn, SimComputeInstance, SimGpu, SimGpuInstance, SimNodeState

__all__ = ["InstanceCalls"]


class InstanceCore(Protocol):
    """What the instance entry points need from the library they are mixed into (state, handles, lookups)."""

    _state: SimNodeState

    def _gpu(self, handle: Any) -> SimGpu: ...

    def _device(self, handle: Any) -> tuple[SimGpu, SimComputeInstance | None]: ...

    def _give(self, ref: Any, kind: str, key: int) -> int: ...

    def _struct(self, kind: str, key: int) -> Any: ...

    def _fill_handles(self, arr: Any, count: Any, kind: str, keys: list[int]) -> int: ...

    def _gi(self, handle: Any) -> SimGpuInstance: ...

    def _ci(self, handle: Any) -> SimComputeInstance: ...


if TYPE_CHECKING:
    _Base = InstanceCore
else:
    _Base = object


class InstanceCalls(_Base):
    """GPU-instance and compute-instance entry points of :class:`~flexmig.sim.library.SimLibrary`."""

    # ------------------------------------------------------------------------------------- GPU instances
    def _privileged(self) -> None:
        if not self._state.privileged:
            raise NvmlReturn(N.NVML_ERROR_NO_PERMISSION)

    def _profile_by_index(self, gpu: SimGpu, index: int) -> Any:
        self._state.require_mig(gpu)
        if not 0 <= index < GI_PROFILE_COUNT:
            raise NvmlReturn(_INVALID)
        try:
            profile = gpu.model.profile_by_index(index)
        except KeyError:
            raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED) from None
        if not self._state.driver.offers(gpu.model, profile):
            raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)  # this driver release has no such profile yet
        return profile

    def _profile_by_id(self, gpu: SimGpu, profile_id: int) -> Any:
        try:
            profile = gpu.model.profile_by_id(profile_id)
        except KeyError:
            raise NvmlReturn(_INVALID) from None
        if not self._state.driver.offers(gpu.model, profile):
            raise NvmlReturn(_INVALID)  # an ID this driver release does not know
        return profile

    def _fill_gi_profile(self, gpu: SimGpu, info: Any, profile: Any) -> None:
        info.id = profile.profile_id
        info.isP2pSupported = 0  # `nvidia-smi mig -lgip` prints P2P "No" for every profile on A100, H100 and H200
        info.sliceCount = profile.compute_slices
        info.instanceCount = profile.max_instances
        info.multiprocessorCount = profile.sm_count
        info.copyEngineCount = profile.copy_engines
        info.decoderCount = profile.decoders
        info.encoderCount = profile.encoders
        info.jpegCount = profile.jpegs
        info.ofaCount = profile.ofas
        info.memorySizeMB = profile.memory_mib

    @_entry
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, index: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        self._fill_gi_profile(gpu, _out(ref), self._profile_by_index(gpu, _int(index)))
        return _SUCCESS

    def _fill_gi_profile_v2(self, gpu: SimGpu, ref: Any, profile: Any) -> int:
        info = _out(ref)
        if info.version != N.nvmlGpuInstanceProfileInfo_v2:
            return int(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fill_gi_profile(gpu, info, profile)
        info.name = profile.nvml_name
        return _SUCCESS

    @_entry
    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, index: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        return self._fill_gi_profile_v2(gpu, ref, self._profile_by_index(gpu, _int(index)))

    @_entry
    def nvmlDeviceGetGpuInstanceProfileInfoByIdV(self, handle: Any, profile_id: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        self._state.require_mig(gpu)
        return self._fill_gi_profile_v2(gpu, ref, self._profile_by_id(gpu, _int(profile_id)))

    @_entry
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        self._privileged()  # nvml.h: "Requires privileged user."
        self._state.require_mig(gpu)
        profile = self._profile_by_id(gpu, _int(profile_id))
        assert gpu.layout is not None
        _out(ref).value = gpu.layout.creatable(profile)
        return _SUCCESS

    @_entry
    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(
        self, handle: Any, profile_id: Any, placements: Any, count_ref: Any
    ) -> int:
        gpu = self._gpu(handle)
        self._privileged()  # nvml.h: "Requires privileged user."
        profile = self._profile_by_id(gpu, _int(profile_id))
        count = _out(count_ref)
        return _fill_placements(placements, count, profile.starts, profile.memory_slices)

    @_entry
    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        _out(ref)
        self._state.require_mig(gpu)
        gi = self._state.create_gi(gpu, self._profile_by_id(gpu, _int(profile_id)), None)
        return self._give(ref, "gi", gi.serial)

    @_entry
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: Any, placement: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        _out(ref)
        if isinstance(placement, ctypes.Structure):
            return _INVALID  # passed by value: the C function takes a pointer (pynvml sets no argtypes: byref)
        place = _out(placement)
        self._state.require_mig(gpu)
        profile = self._profile_by_id(gpu, _int(profile_id))
        gi = self._state.create_gi(gpu, profile, int(place.start), int(place.size))
        return self._give(ref, "gi", gi.serial)

    @_entry
    def nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        self._state.destroy_gi(self._gi(handle))
        return _SUCCESS

    @_entry
    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: Any, gis: Any, count_ref: Any) -> int:
        gpu = self._gpu(handle)
        count = _out(count_ref)
        self._privileged()  # nvml.h: "Requires privileged user."
        self._state.require_mig(gpu)
        pid = _int(profile_id)
        self._profile_by_id(gpu, pid)
        if gis is None:
            return _INVALID
        found = sorted((g for g in gpu.gis.values() if g.profile.profile_id == pid), key=lambda g: g.id)
        return self._fill_handles(gis, count, "gi", [g.serial for g in found])

    @_entry
    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, ref: Any) -> int:
        gpu = self._gpu(handle)
        _out(ref)
        self._privileged()  # nvml.h: "Requires privileged user."
        self._state.require_mig(gpu)
        gi = gpu.gis.get(_int(gi_id))
        if gi is None:
            return int(N.NVML_ERROR_NOT_FOUND)
        return self._give(ref, "gi", gi.serial)

    @_entry
    def nvmlGpuInstanceGetInfo(self, handle: Any, ref: Any) -> int:
        gi = self._gi(handle)
        info = _out(ref)
        info.device = N.c_nvmlDevice_t(self._struct("gpu", gi.gpu.index))
        info.id = gi.id
        info.profileId = gi.profile.profile_id
        info.placement.start = gi.start
        info.placement.size = gi.profile.memory_slices
        return _SUCCESS

    # --------------------------------------------------------------------------------- compute instances
    def _fill_ci_profile(self, gi: SimGpuInstance, index: Any, eng: Any, ref: Any) -> tuple[Any, int]:
        e = _int(eng)
        if e != N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NvmlReturn(
                _INVALID if e >= N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT else N.NVML_ERROR_NOT_SUPPORTED
            )
        i = _int(index)
        if not 0 <= i < CI_PROFILE_COUNT:
            raise NvmlReturn(_INVALID)
        shape = self._state.ci_shape(gi, i)
        slices = shape.slices
        info = _out(ref)
        p = gi.profile
        info.id = shape.index
        info.sliceCount = slices
        info.instanceCount = shape.instance_count
        info.multiprocessorCount = shape.sm_count
        info.sharedCopyEngineCount = p.copy_engines
        info.sharedDecoderCount = p.decoders
        info.sharedEncoderCount = p.encoders
        info.sharedJpegCount = p.jpegs
        info.sharedOfaCount = p.ofas
        return info, slices

    @_entry
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, handle: Any, index: Any, eng: Any, ref: Any) -> int:
        self._fill_ci_profile(self._gi(handle), index, eng, ref)
        return _SUCCESS

    @_entry
    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, handle: Any, index: Any, eng: Any, ref: Any) -> int:
        gi = self._gi(handle)
        if _out(ref).version != N.nvmlComputeInstanceProfileInfo_v2:
            return int(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info, slices = self._fill_ci_profile(gi, index, eng, ref)
        info.name = ci_name(gi.profile, slices)
        return _SUCCESS

    @_entry
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, handle: Any, profile_id: Any, ref: Any) -> int:
        gi = self._gi(handle)
        shape = self._state.ci_shape(gi, _int(profile_id))
        used = {s for ci in gi.cis.values() for s in range(ci.start, ci.start + ci.span)}
        n = 0
        for start in self._state.ci_free_starts(gi, shape):
            span = set(range(start, start + shape.span))
            if not span & used:
                used |= span
                n += 1
        same = sum(1 for ci in gi.cis.values() if ci.profile_id == shape.index)
        n = min(n, shape.instance_count - same)
        _out(ref).value = max(0, n)
        return _SUCCESS

    @_entry
    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        self, handle: Any, profile_id: Any, placements: Any, count_ref: Any
    ) -> int:
        gi = self._gi(handle)
        shape = self._state.ci_shape(gi, _int(profile_id))
        count = _out(count_ref)
        return _fill_placements(placements, count, shape.starts, shape.span)

    @_entry
    def nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile_id: Any, ref: Any) -> int:
        gi = self._gi(handle)
        _out(ref)
        ci = self._state.create_ci(gi, _int(profile_id), None)
        return self._give(ref, "ci", ci.serial)

    @_entry
    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, handle: Any, profile_id: Any, placement: Any, ref: Any
    ) -> int:
        gi = self._gi(handle)
        _out(ref)
        if isinstance(placement, ctypes.Structure):
            return _INVALID
        place = _out(placement)
        shape = self._state.ci_shape(gi, _int(profile_id))
        if int(place.size) != shape.span:
            return _INVALID
        ci = self._state.create_ci(gi, _int(profile_id), int(place.start))
        return self._give(ref, "ci", ci.serial)

    @_entry
    def nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        self._state.destroy_ci(self._ci(handle))
        return _SUCCESS

    @_entry
    def nvmlGpuInstanceGetComputeInstances(self, handle: Any, profile_id: Any, cis: Any, count_ref: Any) -> int:
        gi = self._gi(handle)
        count = _out(count_ref)
        pid = _int(profile_id)
        self._state.ci_shape(gi, pid)
        if cis is None:
            return _INVALID
        found = sorted((c for c in gi.cis.values() if c.profile_id == pid), key=lambda c: c.id)
        return self._fill_handles(cis, count, "ci", [c.serial for c in found])

    @_entry
    def nvmlGpuInstanceGetComputeInstanceById(self, handle: Any, ci_id: Any, ref: Any) -> int:
        gi = self._gi(handle)
        _out(ref)
        ci = gi.cis.get(_int(ci_id))
        if ci is None:
            return int(N.NVML_ERROR_NOT_FOUND)
        return self._give(ref, "ci", ci.serial)

    def _ci_info(self, handle: Any, ref: Any) -> int:
        ci = self._ci(handle)
        info = _out(ref)
        info.device = N.c_nvmlDevice_t(self._struct("gpu", ci.gi.gpu.index))
        info.gpuInstance = N.c_nvmlGpuInstance_t(self._struct("gi", ci.gi.serial))
        info.id = ci.id
        info.profileId = ci.profile_id
        info.placement.start = ci.start
        info.placement.size = ci.span
        return _SUCCESS

    @_entry
    def nvmlComputeInstanceGetInfo_v2(self, handle: Any, ref: Any) -> int:
        return self._ci_info(handle, ref)

    @_entry
    def nvmlComputeInstanceGetInfo(self, handle: Any, ref: Any) -> int:
        return self._ci_info(handle, ref)


def _fill_placements(placements: Any, count: Any, starts: tuple[int, ...], size: int) -> int:
    """Answer a possible-placements call: with no array, or one shorter than ``count`` says, only the number needed
    (``INSUFFICIENT_SIZE`` for the short one); otherwise each start with ``size`` slices, and their number."""
    if placements is None:
        count.value = len(starts)
        return _SUCCESS
    if count.value < len(starts):
        count.value = len(starts)
        return int(N.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, s in enumerate(starts):
        placements[i].start = s
        placements[i].size = size
    count.value = len(starts)
    return _SUCCESS
