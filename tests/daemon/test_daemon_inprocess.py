"""The daemon in this process on a simulated node: instance churn, NVML errors, a lost GPU, clean stop.

Each test runs the real Daemon (NVML worker thread, sampling loop, metrics server on a free loopback port) over
the simulated libnvidia-ml, changes the node through the same NVML layer or the simulator's handle, and reads
what a Prometheus server would read: the HTTP exposition.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from flexmig.config import Config, PrometheusConfig, SamplingConfig
from flexmig.daemon import Daemon
from flexmig.telemetry.snapshot import Snapshot
from support.daemon import LOOPBACK_ANY, Series, instance, nvml_of, scrape, sweeps, until_snapshot, values
from support.daemon import running as harness_running
from support.daemon import sim_node as node_of

pytestmark = pytest.mark.timeout(120)

FAST = Config(  # these tests read families of every detail level
    sampling=SamplingConfig(interval_s=0.05, retention_s=60.0), prometheus=PrometheusConfig(detail="full")
)


def running(
    spec: str, config: Config = FAST, *, workload: bool = False
) -> contextlib.AbstractAsyncContextManager[Daemon]:
    """A started daemon on ``spec`` (sampling every 50 ms unless ``config`` says otherwise)."""
    return harness_running(spec, config, workload=workload)


def exported_instances(series: Series) -> set[str]:
    return {labels["mig_uuid"] for labels, _ in series.get("flexmig_mig_memory_total_bytes", [])}


# ------------------------------------------------------------------------------------------------ churn


@pytest.mark.integration
def test_destroyed_and_created_instances_show_in_the_export_within_two_sweeps() -> None:
    async def scenario() -> None:
        async with running("h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6") as daemon:
            node, nvml = node_of(daemon), nvml_of(daemon)
            before = exported_instances(await scrape(daemon))
            assert before == set(node.mig_uuids())

            gone_gi = node.gpu(0).gpu_instances[1]  # the 2g.35gb at slice 4
            gone_uuid = gone_gi.compute_instances[0].uuid
            await daemon.worker.call(nvml.destroy_instance, 0, gone_gi.id)
            await sweeps(daemon, 2)
            after_destroy = exported_instances(await scrape(daemon))
            assert after_destroy == before - {gone_uuid}

            created = await daemon.worker.call(nvml.create_instance, 0, "1g.18gb", 4)
            await daemon.worker.call(nvml.create_instance, 0, "1g.18gb", 5)
            await sweeps(daemon, 2)
            series = await scrape(daemon)
            assert exported_instances(series) == set(node.mig_uuids())
            assert created.uuid in exported_instances(series)
            assert values(series, "flexmig_mig_memory_total_bytes", mig_uuid=created.uuid) == [
                float(node.gpu(0).mig_device(created.uuid)[0].memory_bytes)
            ]
            # free capacity follows the new layout: 3g@0 + 1g@4 + 1g@5 + 1g@6 leaves memory slice 7 and one
            # compute slice, and no 1g.18gb fits any more (slice 7 is not a valid start)
            assert values(series, "flexmig_gpu_free_compute_slices", gpu="0") == [1.0]
            assert values(series, "flexmig_gpu_free_memory_slices", gpu="0") == [1.0]
            assert values(series, "flexmig_gpu_creatable_instances", gpu="0", profile="1g.18gb") == [0.0]
            assert values(series, "flexmig_source_errors_total", source="sweep") in ([], [0.0])
            assert values(series, "flexmig_inventories_total")[0] >= 3

    asyncio.run(scenario())


@pytest.mark.integration
def test_rapid_churn_between_sweeps_never_breaks_sampling() -> None:
    async def scenario() -> None:
        async with running("h200x1:3g.71gb@0") as daemon:
            node, nvml = node_of(daemon), nvml_of(daemon)
            for _ in range(15):
                info = await daemon.worker.call(nvml.create_instance, 0, "1g.18gb", 6)
                await asyncio.sleep(0.02)
                gi = next(g for g in node.gpu(0).gpu_instances if g.start == 6)
                await daemon.worker.call(nvml.destroy_instance, 0, gi.id)
                assert info.uuid not in node.mig_uuids()
            await sweeps(daemon, 2)
            series = await scrape(daemon)
            assert exported_instances(series) == set(node.mig_uuids())
            assert values(series, "flexmig_source_errors_total", source="sweep") in ([], [0.0])
            assert values(series, "flexmig_source_errors_total", source="nvml") in ([], [0.0])
            # history of instances that came and went is bounded: kept one window at most, then dropped
            assert daemon.sampler is not None and daemon.sampler.store.tracked() <= 1 + 15

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.integration
def test_an_nvml_error_on_one_gpu_leaves_the_others_sampled_and_is_counted() -> None:
    async def scenario() -> None:
        async with running("h200x2:3g.71gb@0+3g.71gb@4") as daemon:
            node = node_of(daemon)
            node.inject_error("nvmlDeviceGetPowerUsage", "UNKNOWN", gpu=1, times=None)
            node.inject_error("nvmlDeviceGetMemoryInfo", "UNKNOWN", gpu=1, times=None)
            await sweeps(daemon, 3)
            series = await scrape(daemon)
            assert values(series, "flexmig_gpu_power_watts", gpu="0") != []
            assert values(series, "flexmig_gpu_power_watts", gpu="1") == []  # absent, not 0
            assert len(values(series, "flexmig_mig_memory_used_bytes", gpu="0")) == 2
            assert values(series, "flexmig_mig_memory_used_bytes", gpu="1") == []
            assert len(values(series, "flexmig_mig_processes", gpu="1")) == 2  # the rest of GPU 1 is still read
            errors = values(series, "flexmig_nvml_errors_total", call="nvmlDeviceGetPowerUsage", error="UNKNOWN")
            assert errors and errors[0] >= 3
            node.clear_errors()
            await sweeps(daemon, 2)
            series = await scrape(daemon)
            assert len(values(series, "flexmig_mig_memory_used_bytes", gpu="1")) == 2

    asyncio.run(scenario())


@pytest.mark.integration
def test_a_lost_gpu_is_marked_and_reported_and_the_rest_keeps_going() -> None:
    async def scenario() -> None:
        async with running("h200x2:3g.71gb@0+3g.71gb@4") as daemon:
            node = node_of(daemon)
            lost_uuid = node.gpu(1).uuid
            node.lose_gpu(1)
            await sweeps(daemon, 2)
            series = await scrape(daemon)
            assert values(series, "flexmig_gpu_lost", gpu="1") == [1.0]
            assert values(series, "flexmig_gpu_lost", gpu="0") == [0.0]
            assert values(series, "flexmig_mig_memory_total_bytes", gpu="1") == []  # no stale series
            assert len(values(series, "flexmig_mig_memory_total_bytes", gpu="0")) == 2
            assert values(series, "flexmig_gpu_free_compute_slices", gpu="1") == []
            snap = daemon.latest()
            assert snap is not None and lost_uuid in snap.stats.lost_gpus
            lost_calls = [
                labels for labels, _ in series["flexmig_nvml_errors_total"] if labels["error"] == "GPU_IS_LOST"
            ]
            assert lost_calls

            node.reset_gpu(1)  # back on the bus: sampled again
            await sweeps(daemon, 3)
            series = await scrape(daemon)
            assert values(series, "flexmig_gpu_lost", gpu="1") == [0.0]
            assert len(values(series, "flexmig_mig_memory_total_bytes", gpu="1")) == 2

    asyncio.run(scenario())


def test_a_bad_node_spec_stops_start_up_with_an_error_naming_it() -> None:
    async def scenario() -> None:
        daemon = Daemon(FAST, sim_spec="h200:bogus@0", metrics_addr=LOOPBACK_ANY)
        with pytest.raises(Exception, match="bogus"):
            await daemon.run(asyncio.Event())

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------------------ figures


@pytest.mark.integration
def test_processes_memory_and_gpm_activity_follow_the_simulator() -> None:
    async def scenario() -> None:
        async with running("h200x1:3g.71gb@0+3g.71gb@4") as daemon:
            node = node_of(daemon)
            busy, quiet = node.mig_uuids()
            node.start_process(busy, memory_bytes=5 << 30)
            node.set_activity(busy, sm=0.6, dram=0.3, tensor=0.4, occupancy=0.25)

            # GPM's figure covers the time between two of its samples (more than 100 ms apart): wait for a pair
            # taken wholly after the change, before reading the export.
            def settled(s: Snapshot) -> bool:
                a = instance(s, busy).activity
                return a is not None and a.sm_active is not None and abs(a.sm_active - 0.6) < 1e-6

            await until_snapshot(daemon, settled, "a GPM figure covering only the new activity")
            series = await scrape(daemon)
            idle = node.gpu(0).gpu_instances[0].idle_used_bytes  # an idle MIG device shows a few MiB used
            assert values(series, "flexmig_mig_memory_used_bytes", mig_uuid=busy) == [float((5 << 30) + idle)]
            assert values(series, "flexmig_mig_processes", mig_uuid=busy) == [1.0]
            assert values(series, "flexmig_mig_processes", mig_uuid=quiet) == [0.0]
            assert values(series, "flexmig_mig_sm_active_ratio", mig_uuid=busy) == [pytest.approx(0.6, abs=1e-6)]
            assert values(series, "flexmig_mig_tensor_active_ratio", mig_uuid=busy) == [pytest.approx(0.4, abs=1e-6)]
            assert values(series, "flexmig_mig_dram_active_ratio", mig_uuid=busy) == [pytest.approx(0.3, abs=1e-6)]
            assert values(series, "flexmig_mig_activity_source_info", mig_uuid=busy, source="gpm") == [1.0]
            assert values(series, "flexmig_mig_idle_seconds", mig_uuid=busy) == [0.0]
            assert values(series, "flexmig_mig_idle_seconds", mig_uuid=quiet)[0] > 0.0

    asyncio.run(scenario())


@pytest.mark.integration
def test_an_instance_recreated_with_the_same_gi_id_starts_a_fresh_history(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXMIG_SIM_IDS", "driver")  # a driver gives the same slices the same GI ID again

    async def scenario() -> None:
        async with running("h200x1:3g.71gb@0+3g.71gb@4") as daemon:
            node, nvml = node_of(daemon), nvml_of(daemon)
            old_uuid = node.gpu(0).mig_uuid_at(4)
            old_gi = node.gpu(0).mig_device(old_uuid)[0].id
            node.set_activity(old_uuid, sm=0.9)

            def three_samples(s: Snapshot) -> bool:
                window = instance(s, old_uuid).sm_active_window
                return window is not None and window.count >= 3

            snap = await until_snapshot(daemon, three_samples, "three SM-activity samples of the busy instance")
            old = instance(snap, old_uuid)
            assert old.sm_active_window is not None and old.sm_active_window.count >= 3

            await daemon.worker.call(nvml.destroy_instance, 0, old_gi)
            new = await daemon.worker.call(nvml.create_instance, 0, "3g.71gb", 4)
            assert new.gpu_instance_id == old_gi and new.uuid != old_uuid  # NVML reuses the GI ID
            await sweeps(daemon, 1)
            latest = daemon.latest()
            assert latest is not None
            snap = latest
            fresh = next(i for i in snap.instances() if i.mig_uuid == new.uuid)
            assert fresh.first_seen > old.first_seen
            # the new instance is idle: none of the old one's 0.9 may leak into its window or its GPM figure
            assert fresh.sm_active_window is None or fresh.sm_active_window.max < 0.5
            assert fresh.activity is None or (fresh.activity.sm_active or 0.0) < 0.5
            assert old_uuid not in {i.mig_uuid for i in snap.instances()}

    asyncio.run(scenario())
