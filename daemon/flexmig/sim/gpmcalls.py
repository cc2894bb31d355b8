"""GPM (GPU Performance Monitoring, Hopper) in the simulated ``libnvidia-ml``: device support, sample buffers
and metrics computed from two samples, as the C entry points answer them.

A sample holds a snapshot of the node's cumulative activity counters (:mod:`flexmig.sim.gpm`); metrics between two
samples are what the workload's activity was in between. A100 answers ``NOT_SUPPORTED``. Mixed into
:class:`~flexmig.sim.library.SimLibrary`; every ``nvml*`` method is one C entry point.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.sim.cabi import INVALID as _INVALID
from flexmig.sim.cabi import SUCCESS as _SUCCESS
from flexmig.sim.cabi import entry as _entry
from flexmig.sim.cabi import int_arg as _int
from flexmig.sim.cabi import out as _out
from flexmig.sim.gpm import METRIC_INFO, GpmSnapshot, metric_value
from flexmig.sim.state import NvmlReturn, SimComputeInstance, SimGpu, SimNodeState

__all__ = ["GpmCalls"]


class _MetricInfo(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("shortName", ctypes.c_char_p),
        ("longName", ctypes.c_char_p),
        ("unit", ctypes.c_char_p),
    ]


class _Metric(ctypes.Structure):
    """``c_nvmlGpmMetric_t`` as a plain ctypes struct: the library reads the caller's memory as C would."""

    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", _MetricInfo),
    ]


_METRICS_OFFSET: int = N.c_nvmlGpmMetricsGet_t.metrics.offset
# Names a driver writes into each result; the bytes stay alive with these constant structs.
_INFO = {metric_id: _MetricInfo(*names) for metric_id, names in METRIC_INFO.items()}
assert ctypes.sizeof(_Metric) == ctypes.sizeof(N.c_nvmlGpmMetric_t), "pynvml changed c_nvmlGpmMetric_t"


class GpmCore(Protocol):
    """What the GPM entry points need from the library they are mixed into."""

    _state: SimNodeState
    _samples: dict[int, tuple[Any, GpmSnapshot]]

    def _device(self, handle: Any) -> tuple[SimGpu, SimComputeInstance | None]: ...

    def _gpu(self, handle: Any) -> SimGpu: ...


if TYPE_CHECKING:
    _Base = GpmCore
else:
    _Base = object


class GpmCalls(_Base):
    """GPM entry points of :class:`~flexmig.sim.library.SimLibrary`."""

    # ----------------------------------------------------------------------------------------------- GPM
    @_entry
    def nvmlGpmQueryDeviceSupport(self, handle: Any, ref: Any) -> int:
        gpu, _ = self._device(handle)
        support = _out(ref)
        if support.version != N.NVML_GPM_SUPPORT_VERSION:
            return int(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        support.isSupportedDevice = int(gpu.model.gpm)
        return _SUCCESS

    @_entry
    def nvmlGpmSampleAlloc(self, ref: Any) -> int:
        target = _out(ref)
        struct = N.struct_c_nvmlGpmSample_t()
        self._samples[ctypes.addressof(struct)] = (struct, GpmSnapshot())
        target.contents = struct
        return _SUCCESS

    def gpm_sample_count(self) -> int:
        """GPM samples allocated and not freed."""
        return len(self._samples)

    def _sample(self, sample: Any) -> GpmSnapshot:
        try:
            addr = ctypes.addressof(sample.contents)
        except (AttributeError, ValueError, TypeError):
            raise NvmlReturn(_INVALID) from None
        found = self._samples.get(addr)
        if found is None:
            raise NvmlReturn(_INVALID)
        return found[1]

    @_entry
    def nvmlGpmSampleFree(self, sample: Any) -> int:
        self._sample(sample)
        del self._samples[ctypes.addressof(sample.contents)]
        return _SUCCESS

    @_entry
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        gpu, ci = self._device(handle)
        snap = self._sample(sample)
        if not gpu.model.gpm:
            return int(N.NVML_ERROR_NOT_SUPPORTED)
        now = self._state.clock()
        if ci is None:
            snap.owner = (gpu.index, None, -1)
            snap.t, snap.totals = gpu.counters.snapshot(now)
        else:
            snap.owner = (gpu.index, ci.gi.id, ci.gi.serial)
            snap.t, snap.totals = ci.gi.counters.snapshot(now)
        return _SUCCESS

    @_entry
    def nvmlGpmMigSampleGet(self, handle: Any, gi_id: Any, sample: Any) -> int:
        gpu = self._gpu(handle)
        snap = self._sample(sample)
        if not gpu.model.gpm:
            return int(N.NVML_ERROR_NOT_SUPPORTED)
        self._state.require_mig(gpu)
        gi = gpu.gis.get(_int(gi_id))
        if gi is None:
            return int(N.NVML_ERROR_NOT_FOUND)
        snap.owner = (gpu.index, gi.id, gi.serial)
        snap.t, snap.totals = gi.counters.snapshot(self._state.clock())
        return _SUCCESS

    @_entry
    def nvmlGpmMetricsGet(self, ref: Any) -> int:
        mg = _out(ref)
        if mg.version != N.NVML_GPM_METRICS_GET_VERSION:
            return int(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        n = int(mg.numMetrics)
        if n > N.NVML_GPM_METRIC_MAX:
            return _INVALID
        first, second = self._sample(mg.sample1), self._sample(mg.sample2)
        if first.owner is None or first.owner != second.owner:
            return _INVALID  # never filled, or two different instances (or lifetimes of one GI id)
        view = (_Metric * n).from_address(ctypes.addressof(mg) + _METRICS_OFFSET)
        for metric in view:
            value = metric_value(first, second, metric.metricId)
            if value is None:
                metric.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.value = value
            metric.nvmlReturn = _SUCCESS
            metric.metricInfo = _INFO[metric.metricId]
        return _SUCCESS
