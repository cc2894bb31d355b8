"""The simulated nvidia-smi's reads: every GPU and MIG device through pynvml, as the real tool reads the driver.

:mod:`flexmig.sim.smi` prints them as the real tool's tables and :mod:`flexmig.sim.smi_query` as its
``--query-*`` CSV; both read nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from ctypes import byref, c_uint
from dataclasses import dataclass, field
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import ConfigError

__all__ = [
    "MIB",
    "NA",
    "Gpu",
    "Mig",
    "compute_instances",
    "gi_profiles",
    "gpu_instances",
    "memory_info",
    "nvml_text",
    "read_gpus",
    "try_nvml",
]

MIB = 1 << 20
NA = "[N/A]"


def nvml_text(raw: object) -> str:
    """An NVML string as text (older pynvml answers bytes)."""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def try_nvml(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None where NVML answers with an error (the real tool prints [N/A] there)."""
    try:
        return fn(*args)
    except N.NVMLError:
        return None


@dataclass(slots=True)
class Mig:
    """One MIG device as nvidia-smi lists it: its index on the GPU, handle, UUID, profile name, GI and CI IDs."""

    index: int
    handle: Any
    uuid: str
    name: str
    gi: int | None
    ci: int | None


@dataclass(slots=True)
class Gpu:
    """One GPU as nvidia-smi lists it, with its MIG devices when MIG mode is on."""

    index: int
    handle: Any
    name: str
    uuid: str
    mig: bool
    migs: list[Mig] = field(default_factory=list)


def read_gpus(wanted: set[int] | None) -> list[Gpu]:
    """Every GPU (those of ``wanted`` only, when given: ``-i``), skipping gaps in the MIG indices as nvidia-smi does;
    ConfigError with the tool's words for an index that is not there."""
    out = []
    for i in range(N.nvmlDeviceGetCount()):
        if wanted is not None and i not in wanted:
            continue
        h = N.nvmlDeviceGetHandleByIndex(i)
        mode = try_nvml(N.nvmlDeviceGetMigMode, h)
        gpu = Gpu(i, h, nvml_text(N.nvmlDeviceGetName(h)), nvml_text(N.nvmlDeviceGetUUID(h)), bool(mode and mode[0]))
        if gpu.mig:
            for m in range(try_nvml(N.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
                mh = try_nvml(N.nvmlDeviceGetMigDeviceHandleByIndex, h, m)
                if mh is None:
                    continue  # a gap in the MIG indices: skip it, as nvidia-smi does
                name = nvml_text(N.nvmlDeviceGetName(mh)).removeprefix(gpu.name).strip()
                gi, ci = try_nvml(N.nvmlDeviceGetGpuInstanceId, mh), try_nvml(N.nvmlDeviceGetComputeInstanceId, mh)
                gpu.migs.append(Mig(len(gpu.migs), mh, nvml_text(N.nvmlDeviceGetUUID(mh)), name, gi, ci))
        out.append(gpu)
    if wanted is not None and len(out) != len(wanted):
        raise ConfigError(f"No devices were found with index {sorted(wanted - {g.index for g in out})}")
    return out


def gi_profiles(h: Any) -> list[Any]:
    """The GPU's GPU-instance profiles in the order nvidia-smi lists them: by memory, then slices, then ID."""
    profiles = []
    for index in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = try_nvml(N.nvmlDeviceGetGpuInstanceProfileInfo, h, index)
        if info is not None and info.instanceCount > 0:
            profiles.append(info)
    return sorted(profiles, key=lambda p: (p.memorySizeMB, p.sliceCount, p.id))


def gpu_instances(h: Any, profile: Any) -> list[Any]:
    """The GPU instances of ``profile`` on the GPU (none where NVML refuses)."""
    arr = (N.c_nvmlGpuInstance_t * max(1, profile.instanceCount))()
    count = c_uint(0)
    try:
        N.nvmlDeviceGetGpuInstances(h, profile.id, arr, byref(count))
    except N.NVMLError:
        return []
    return [arr[i] for i in range(count.value)]


def compute_instances(gi: Any) -> list[tuple[Any, Any]]:
    """(CI profile info, CI info) of every compute instance of ``gi``."""
    out = []
    for index in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        prof = try_nvml(N.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, index, 0)
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


def memory_info(h: Any) -> Any:
    """The device's memory info (used, total), or None where NVML answers with an error."""
    return try_nvml(N.nvmlDeviceGetMemoryInfo, h)
