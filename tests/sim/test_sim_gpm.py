"""GPM in the simulated library: counters whose difference over elapsed time is the activity, in percent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.sim import SimNode, install, uninstall
from support.simnode import HandClock

Clock = HandClock


@pytest.fixture
def clock() -> Clock:
    return Clock(100.0)


@pytest.fixture
def h200(clock: Clock) -> Iterator[SimNode]:
    node = install("h200:3g.71gb@0+2g.35gb@4+1g.18gb@6", clock=clock)
    N.nvmlInit()
    yield node


def metrics(first: Any, second: Any, ids: list[int]) -> dict[int, tuple[int, Any]]:
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = N.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(ids)
    for i, m in enumerate(ids):
        mg.metrics[i].metricId = m
    mg.sample1, mg.sample2 = first, second
    N.nvmlGpmMetricsGet(mg)
    return {mg.metrics[i].metricId: (mg.metrics[i].nvmlReturn, mg.metrics[i].value) for i in range(len(ids))}


def test_hopper_supports_gpm_and_ampere_does_not() -> None:
    install("h200x1")
    try:
        N.nvmlInit()
        assert N.nvmlGpmQueryDeviceSupport(N.nvmlDeviceGetHandleByIndex(0)).isSupportedDevice == 1
    finally:
        uninstall()
    node = install("a100-80:3g.40gb@0")
    try:
        N.nvmlInit()
        dev = N.nvmlDeviceGetHandleByIndex(0)
        assert N.nvmlGpmQueryDeviceSupport(dev).isSupportedDevice == 0
        sample = N.nvmlGpmSampleAlloc()
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlGpmMigSampleGet(dev, node.gpu(0).gi_id_at(0), sample)
        N.nvmlGpmSampleFree(sample)
    finally:
        uninstall()


def test_a_metric_is_the_counter_delta_over_the_elapsed_time_in_percent(h200: SimNode, clock: Clock) -> None:
    uuid = h200.gpu(0).mig_uuid_at(0)
    gi_3g = h200.gpu(0).gi_id_at(0)
    h200.start_process(uuid)
    h200.set_activity(uuid, sm=0.6, dram=0.3, tensor=0.45, occupancy=0.2)
    dev = N.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmMigSampleGet(dev, gi_3g, s1)
    clock.t += 5.0
    h200.set_activity(uuid, sm=0.2, dram=0.1, tensor=0.05, occupancy=0.1)  # half the window busy, half quieter
    clock.t += 5.0
    N.nvmlGpmMigSampleGet(dev, gi_3g, s2)
    got = metrics(s1, s2, [2, 3, 5, 10])
    assert got[2] == (0, pytest.approx(40.0))
    assert got[3] == (0, pytest.approx(15.0))
    assert got[5] == (0, pytest.approx(25.0))
    assert got[10] == (0, pytest.approx(20.0))


def test_an_idle_instance_measures_zero_and_an_unknown_metric_is_not_supported(h200: SimNode, clock: Clock) -> None:
    dev = N.nvmlDeviceGetHandleByIndex(0)
    gi_2g = h200.gpu(0).gi_id_at(4)
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmMigSampleGet(dev, gi_2g, s1)
    clock.t += 1.0
    N.nvmlGpmMigSampleGet(dev, gi_2g, s2)
    got = metrics(s1, s2, [2, 20])
    assert got[2] == (0, 0.0)
    assert got[20][0] == N.NVML_ERROR_NOT_SUPPORTED


def test_the_gpu_sample_weighs_instances_by_their_compute_slices(h200: SimNode, clock: Clock) -> None:
    uuid = h200.gpu(0).mig_uuid_at(0)  # the 3g instance: 3 of 7 compute slices
    h200.set_activity(uuid, sm=0.7)
    dev = N.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(dev, s1)
    clock.t += 2.0
    N.nvmlGpmSampleGet(dev, s2)
    assert metrics(s1, s2, [2])[2] == (0, pytest.approx(30.0))


def test_samples_of_two_different_instances_cannot_be_compared(h200: SimNode, clock: Clock) -> None:
    dev = N.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmMigSampleGet(dev, h200.gpu(0).gi_id_at(0), s1)
    clock.t += 1.0
    N.nvmlGpmMigSampleGet(dev, h200.gpu(0).gi_id_at(4), s2)
    with pytest.raises(N.NVMLError_InvalidArgument):
        metrics(s1, s2, [2])


def test_a_gpu_instance_that_does_not_exist_is_not_found(h200: SimNode) -> None:
    sample = N.nvmlGpmSampleAlloc()
    absent = next(i for i in range(15) if i not in h200.gpu(0).gi_ids)
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlGpmMigSampleGet(N.nvmlDeviceGetHandleByIndex(0), absent, sample)


def test_freed_samples_are_gone_and_a_wrong_struct_version_is_refused(h200: SimNode) -> None:
    sample = N.nvmlGpmSampleAlloc()
    assert h200.gpm_samples_allocated() == 1
    N.nvmlGpmSampleFree(sample)
    assert h200.gpm_samples_allocated() == 0
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpmSampleFree(sample)
    mg = N.c_nvmlGpmMetricsGet_t()
    mg.version = 7
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        N.nvmlGpmMetricsGet(mg)
