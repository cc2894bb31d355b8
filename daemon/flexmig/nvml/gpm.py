"""GPM windows: per-MIG-device activity from pairs of GPM samples taken on successive sweeps.

The rules (after utkuozdemir/nvidia_gpu_exporter PR #466):

* a metric needs two samples more than 100 ms apart: when sweeps come faster, the previous value is served again
  and no new sample is taken;
* the previous sample is kept per MIG device, keyed by its ``MIG-`` UUID, which is new for every GI/CI lifetime,
  so a GI re-created with the same numeric ID is reseeded instead of being compared with its predecessor;
* a window grown too long (the daemon was paused) is reseeded rather than averaged over;
* the first sweep of a device, and a reseed, give None;
* samples of devices that disappeared are freed, and :meth:`GpmWindows.close` frees the rest.

Each device keeps two sample buffers that swap roles, so a steady sweep allocates nothing.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, ClassVar

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.nvml.calls import Walk
from flexmig.nvml.types import GpmActivity

__all__ = ["GpmWindows"]

_METRICS = (  # in the order of GpmActivity's fields
    N.NVML_GPM_METRIC_SM_UTIL,
    N.NVML_GPM_METRIC_SM_OCCUPANCY,
    N.NVML_GPM_METRIC_DRAM_BW_UTIL,
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
)


class _Metric(ctypes.Structure):
    """Layout of ``c_nvmlGpmMetric_t`` (metricId, nvmlReturn, value, metricInfo) as a plain ctypes struct."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", ctypes.c_char_p * 3),
    ]


class _Head(ctypes.Structure):
    """The head of ``c_nvmlGpmMetricsGet_t`` (version, count, the two samples) as a plain ctypes struct: pynvml's
    structs run a Python ``__setattr__`` for every field written, and a sweep writes two per MIG device."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", N.c_nvmlGpmSample_t),
        ("sample2", N.c_nvmlGpmSample_t),
    ]


_METRICS_OFFSET: int = N.c_nvmlGpmMetricsGet_t.metrics.offset
_SUCCESS = N.NVML_SUCCESS
assert ctypes.sizeof(_Metric) == ctypes.sizeof(N.c_nvmlGpmMetric_t), "pynvml changed c_nvmlGpmMetric_t"
assert (_Head.sample1.offset, _Head.sample2.offset) == (
    N.c_nvmlGpmMetricsGet_t.sample1.offset,
    N.c_nvmlGpmMetricsGet_t.sample2.offset,
), "pynvml changed c_nvmlGpmMetricsGet_t"


def _mig_sample_get(parent: Any, gi_id: int, sample: Any) -> None:
    """``nvmlGpmMigSampleGet`` through the C entry point pynvml resolved, as pynvml's wrapper calls it (NVMLError on
    failure), without the wrapper's own Python."""
    ret = N._nvmlGetFunctionPointer("nvmlGpmMigSampleGet")(parent, gi_id, sample)
    if ret != _SUCCESS:
        raise N.NVMLError(ret)


@dataclass(slots=True)
class _Slot:
    gi_id: int
    prev: Any  # c_nvmlGpmSample_t holding the window's first sample
    spare: Any | None
    t_prev: float
    last: GpmActivity | None


class GpmWindows:
    """Sampling windows for GPM activity, carried from one :meth:`Nvml.sample` sweep to the next.

    One instance per sampler; not thread-safe (the daemon samples on one worker thread). ``clock`` should be the
    clock the sweeps run on (the simulator's clock in tests).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        min_interval_s: float = 0.1,
        max_window_s: float = 60.0,
    ) -> None:
        if not 0 < min_interval_s < max_window_s:
            raise ValueError(f"need 0 < min_interval_s < max_window_s, got {min_interval_s}, {max_window_s}")
        self.clock = clock
        self.min_interval_s = min_interval_s
        self.max_window_s = max_window_s
        self._slots: dict[str, _Slot] = {}
        self._seen: set[str] = set()
        self._mg: Any = None
        self._head: Any = None
        self._ref: Any = None
        self._view: Any = None

    def __len__(self) -> int:
        """Number of devices with an open window (each holds one or two GPM samples)."""
        return len(self._slots)

    def begin_sweep(self) -> None:
        """Start a sweep: devices not visited before :meth:`end_sweep` are dropped then."""
        self._seen.clear()

    def end_sweep(self) -> None:
        """Free the samples of devices this sweep did not visit (destroyed, or their GPU was lost)."""
        for uuid in [u for u in self._slots if u not in self._seen]:
            self._drop(uuid)

    def keep(self, uuid: str) -> None:
        """Mark ``uuid`` as still present without sampling it (its GPU could not be read this sweep)."""
        self._seen.add(uuid)

    def activity(self, walk: Walk, parent: Any, gi_id: int, uuid: str) -> GpmActivity | None:
        """Activity of the GPU instance behind MIG device ``uuid`` over the window that ends now.

        ``parent`` is the physical GPU's handle (``nvmlGpmMigSampleGet`` takes it with the GI id). Failures are
        recorded in ``walk`` and reseed the window; GPU_IS_LOST propagates.
        """
        self._seen.add(uuid)
        now = self.clock()
        slot = self._slots.get(uuid)
        call = "nvmlGpmMigSampleGet"
        try:
            if slot is None or slot.gi_id != gi_id:
                if slot is not None:
                    self._drop(uuid)
                call = "nvmlGpmSampleAlloc"
                prev = N.nvmlGpmSampleAlloc()
                self._slots[uuid] = _Slot(gi_id, prev, None, now, None)
                call = "nvmlGpmMigSampleGet"
                N.nvmlGpmMigSampleGet(parent, gi_id, prev)
                return None
            elapsed = now - slot.t_prev
            if elapsed < self.min_interval_s:
                return slot.last
            if elapsed > self.max_window_s:
                N.nvmlGpmMigSampleGet(parent, gi_id, slot.prev)
                slot.t_prev, slot.last = now, None
                return None
            if slot.spare is None:
                call = "nvmlGpmSampleAlloc"
                slot.spare = N.nvmlGpmSampleAlloc()
            cur = slot.spare
            call = "nvmlGpmMigSampleGet"
            _mig_sample_get(parent, gi_id, cur)
            call = "nvmlGpmMetricsGet"
            sm_active, sm_occupancy, dram_bw, tensor_active = self._metrics(slot.prev, cur)
        except N.NVMLError as exc:
            self._drop(uuid)
            walk.note(f"{uuid} (GI {gi_id})", call, exc)
            return None
        slot.spare, slot.prev, slot.t_prev = slot.prev, cur, now
        slot.last = GpmActivity(elapsed, sm_active, sm_occupancy, dram_bw, tensor_active)
        return slot.last

    def _metrics(self, first: Any, second: Any) -> list[float | None]:
        """Ratios 0..1 of :data:`_METRICS`, in that order, between two samples (``nvmlGpmMetricsGet``); None for a
        metric NVML could not compute.

        One request struct is reused: its metric IDs are written once (NVML only writes results), the samples are
        written and the results read through plain ctypes views of the same memory, which skip pynvml's per-field
        hooks, and the C entry point is called as pynvml's wrapper calls it.
        """
        mg = self._mg
        if mg is None:
            mg = self._mg = N.c_nvmlGpmMetricsGet_t()
            mg.version = N.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(_METRICS)
            for i, metric_id in enumerate(_METRICS):
                mg.metrics[i].metricId = metric_id
            self._head = _Head.from_address(ctypes.addressof(mg))
            self._ref = ctypes.byref(mg)
            self._view = (_Metric * len(_METRICS)).from_address(ctypes.addressof(mg) + _METRICS_OFFSET)
        head = self._head
        head.sample1 = first
        head.sample2 = second
        ret = N._nvmlGetFunctionPointer("nvmlGpmMetricsGet")(self._ref)
        if ret != _SUCCESS:
            raise N.NVMLError(ret)
        # Each metric's percentage as a ratio clamped to 0..1, inline: four metrics of every MIG device every sweep.
        return [min(1.0, max(0.0, float(m.value) / 100.0)) if m.nvmlReturn == 0 else None for m in self._view]

    def _drop(self, uuid: str) -> None:
        slot = self._slots.pop(uuid, None)
        if slot is None:
            return
        for sample in (slot.prev, slot.spare):
            if sample is not None:
                with suppress(N.NVMLError):  # the library is gone (shutdown): nothing left to free
                    N.nvmlGpmSampleFree(sample)

    def close(self) -> None:
        """Free every sample; call before :meth:`Nvml.close`."""
        for uuid in list(self._slots):
            self._drop(uuid)
