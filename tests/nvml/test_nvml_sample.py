"""Sampling sweeps through flexmig.nvml: per-GPU power/temperature/clocks, per-MIG-device memory, processes and
GPM activity with the windowing rules of flexmig.nvml.gpm."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from flexmig.nvml import GpmWindows, Nvml
from flexmig.nvml.types import GpuSample, MigDeviceSample
from flexmig.sim import SimNode, install, uninstall
from support.simnode import HandClock

Clock = HandClock  # one hand-moved clock shared by the simulator's GPM counters and the windows


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
def node(clock: Clock, request: pytest.FixtureRequest) -> SimNode:
    """The node; ``parametrize("node", ["driver"], indirect=True)`` pins how GI IDs are handed out."""
    return install("h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6", clock=clock, ids=getattr(request, "param", None))


@pytest.fixture
def nvml(node: SimNode) -> Iterator[Nvml]:
    with Nvml.open() as session:
        yield session


@pytest.fixture
def windows(clock: Clock, nvml: Nvml) -> Iterator[GpmWindows]:
    gpm = GpmWindows(clock=clock)
    yield gpm
    gpm.close()


def device(samples: Sequence[GpuSample], uuid: str) -> MigDeviceSample:
    return next(d for g in samples for d in g.mig_devices if d.uuid == uuid)


def test_a_sweep_reads_power_temperature_clocks_and_every_mig_device(node: SimNode, nvml: Nvml) -> None:
    uuid = node.gpu(1).mig_uuid_at(6)
    pid = node.start_process(uuid, memory_bytes=2 << 30)
    samples = nvml.sample()
    assert [g.index for g in samples] == [0, 1]
    g0 = samples[0]
    assert g0.uuid == node.gpu(0).uuid and g0.mig_current is True
    assert g0.power_w is not None and g0.temperature_c is not None
    assert 0 < g0.power_w <= 700 and g0.temperature_c > 0
    assert (g0.sm_clock_mhz, g0.mem_clock_mhz) == (345, 3201)
    dev = device(samples, uuid)
    assert (dev.gpu_index, dev.gpu_instance_id, dev.compute_instance_id) == (1, node.gpu(1).gi_id_at(6), 0)
    idle = node.gpu(1).gi_at(6).idle_used_bytes  # an idle MIG device shows a few MiB used
    assert (dev.memory_total_bytes, dev.memory_used_bytes) == (16384 << 20, (2 << 30) + idle)
    assert dev.processes is not None
    assert [(p.pid, p.used_memory_bytes) for p in dev.processes] == [(pid, 2 << 30)]
    assert dev.activity is None  # no GpmWindows given


def test_the_first_sweep_gives_no_activity_and_the_second_the_window_average(
    node: SimNode, nvml: Nvml, windows: GpmWindows, clock: Clock
) -> None:
    uuid = node.mig_uuids(0)[0]
    node.set_activity(uuid, sm=0.8, dram=0.4, tensor=0.6, occupancy=0.3)
    assert device(nvml.sample(windows), uuid).activity is None
    clock.t += 2.0
    act = device(nvml.sample(windows), uuid).activity
    assert act is not None
    assert act.window_s == pytest.approx(2.0)
    assert (act.sm_active, act.sm_occupancy, act.dram_bw, act.tensor_active) == pytest.approx((0.8, 0.3, 0.4, 0.6))


def test_sweeps_closer_than_100ms_serve_the_previous_value(
    node: SimNode, nvml: Nvml, windows: GpmWindows, clock: Clock
) -> None:
    uuid = node.mig_uuids(0)[0]
    node.set_activity(uuid, sm=0.5)
    nvml.sample(windows)
    clock.t += 1.0
    first = device(nvml.sample(windows), uuid).activity
    node.set_activity(uuid, sm=1.0)
    clock.t += 0.05
    again = device(nvml.sample(windows), uuid).activity
    assert again == first  # not a 50 ms window
    clock.t += 0.95
    later = device(nvml.sample(windows), uuid).activity
    assert later is not None
    assert later.window_s == pytest.approx(1.0)  # measured from the last real sample, not the skipped one
    assert later.sm_active == pytest.approx(1.0)


def test_a_window_grown_too_long_is_reseeded_instead_of_averaged(node: SimNode, nvml: Nvml, clock: Clock) -> None:
    gpm = GpmWindows(clock=clock, max_window_s=30.0)
    uuid = node.mig_uuids(0)[0]
    nvml.sample(gpm)
    clock.t += 31.0
    assert device(nvml.sample(gpm), uuid).activity is None
    clock.t += 1.0
    activity = device(nvml.sample(gpm), uuid).activity
    assert activity is not None and activity.window_s == pytest.approx(1.0)
    gpm.close()


@pytest.mark.parametrize("node", ["driver"], indirect=True)  # a driver gives the same slices the same ID again
def test_a_gi_recreated_with_the_same_id_starts_a_new_window(
    node: SimNode, nvml: Nvml, windows: GpmWindows, clock: Clock
) -> None:
    old = node.gpu(0).mig_uuid_at(6)
    old_id = node.gpu(0).gi_id_at(6)
    nvml.sample(windows)
    nvml.destroy_instance(0, old_id)
    new = nvml.create_instance(0, "1g.18gb", 6)
    assert new.gpu_instance_id == old_id and new.uuid != old
    clock.t += 1.0
    assert device(nvml.sample(windows), new.uuid).activity is None
    clock.t += 1.0
    assert device(nvml.sample(windows), new.uuid).activity is not None


def test_samples_of_vanished_devices_are_freed_and_close_frees_the_rest(
    node: SimNode, nvml: Nvml, windows: GpmWindows, clock: Clock
) -> None:
    nvml.sample(windows)
    clock.t += 1.0
    nvml.sample(windows)
    assert len(windows) == 6
    assert node.gpm_samples_allocated() == 12  # two buffers per device, swapped, never re-allocated
    nvml.destroy_instance(1, node.gpu(1).gi_id_at(4))
    clock.t += 1.0
    nvml.sample(windows)
    assert len(windows) == 5 and node.gpm_samples_allocated() == 10
    windows.close()
    assert node.gpm_samples_allocated() == 0


def test_ampere_has_no_gpm_so_activity_stays_none(clock: Clock) -> None:
    install("a100-80:7g.80gb@0", clock=clock)
    try:
        with Nvml.open() as nvml:
            gpm = GpmWindows(clock=clock)
            nvml.sample(gpm)
            clock.t += 1.0
            (gpu,) = nvml.sample(gpm)
            assert gpu.mig_devices[0].activity is None and gpu.errors == ()
            assert len(gpm) == 0
    finally:
        uninstall()


def test_a_gpm_failure_is_an_issue_and_the_window_reseeds(
    node: SimNode, nvml: Nvml, windows: GpmWindows, clock: Clock
) -> None:
    uuid = node.mig_uuids(0)[0]
    nvml.sample(windows)
    clock.t += 1.0
    node.inject_error("nvmlGpmMetricsGet", "UNKNOWN")
    g0 = nvml.sample(windows)[0]
    assert device([g0], uuid).activity is None
    assert [(i.call, i.name) for i in g0.errors] == [("nvmlGpmMetricsGet", "UNKNOWN")]
    clock.t += 1.0
    assert device(nvml.sample(windows), uuid).activity is None  # reseeded
    clock.t += 1.0
    assert device(nvml.sample(windows), uuid).activity is not None


def test_a_lost_gpu_samples_as_lost_and_keeps_its_windows(
    node: SimNode, nvml: Nvml, windows: GpmWindows, clock: Clock
) -> None:
    nvml.sample(windows)
    node.lose_gpu(0)
    clock.t += 1.0
    lost, ok = nvml.sample(windows)
    assert lost.lost and lost.mig_devices == () and lost.power_w is None
    assert not ok.lost and len(ok.mig_devices) == 3
    assert len(windows) == 6


def test_windows_refuse_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="min_interval_s"):
        GpmWindows(min_interval_s=5.0, max_window_s=1.0)
