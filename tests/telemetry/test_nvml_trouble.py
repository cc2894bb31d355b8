"""What NVML answers wrongly with SUCCESS, and what it keeps failing, as the daemon exports and logs it.

The real daemon in this process (sampling loop, metrics server) over the simulated libnvidia-ml, which a test tells
to answer a sentinel (a temperature of 0xFFFFFFFF), to give one MIG device another one's UUID, to fail a call every
time, or to lose a GPU and get it back. Read through the HTTP exposition, as Prometheus would, and the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from flexmig.config import Config, SamplingConfig
from support.daemon import running, scrape, sim_node, sweeps, values

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = Config(sampling=SamplingConfig(interval_s=0.05, retention_s=60.0))
SENTINEL = 0xFFFFFFFF


def test_a_sensor_sentinel_is_exported_as_an_absent_series_never_as_a_value() -> None:
    async def scenario() -> None:
        async with running("h200x2:1g.18gb@0", FAST) as daemon:
            node = sim_node(daemon)
            node.garble("nvmlDeviceGetTemperature", SENTINEL, gpu=0)
            node.garble("nvmlDeviceGetPowerUsage", SENTINEL, gpu=0)
            await sweeps(daemon, 2)
            series = await scrape(daemon)
            assert values(series, "flexmig_gpu_temperature_celsius", gpu="0") == [], "4.29e9 degrees C exported"
            assert values(series, "flexmig_gpu_power_watts", gpu="0") == []
            (t1,) = values(series, "flexmig_gpu_temperature_celsius", gpu="1")
            assert 0 < t1 < 100, "the other GPU's honest reading stays"
            out_of_range = [v for labels, v in series["flexmig_nvml_errors_total"] if labels["error"] == "OUT_OF_RANGE"]
            assert out_of_range and min(out_of_range) >= 2

    asyncio.run(scenario())


def test_two_mig_devices_reporting_one_uuid_are_never_merged_into_one_series(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running("h200x1:1g.18gb@0+1g.18gb@1+1g.18gb@2", FAST) as daemon:
            node = sim_node(daemon)
            first, second, _third = node.mig_uuids()
            node.alias_uuid(second, first)
            await sweeps(daemon, 4)
            series = await scrape(daemon)
            per_series = Counter(
                tuple(sorted(labels.items())) for labels, _ in series.get("flexmig_mig_memory_total_bytes", [])
            )
            assert all(n == 1 for n in per_series.values()), "duplicate series in the exposition"
            exported = {labels["mig_uuid"] for labels, _ in series["flexmig_mig_memory_total_bytes"]}
            assert first in exported and second not in exported, exported
            dup = [v for labels, v in series["flexmig_nvml_errors_total"] if labels["error"] == "DUPLICATE_UUID"]
            assert dup and dup[0] >= 3
            lines = [r.getMessage() for r in caplog.records if "DUPLICATE_UUID" in r.getMessage()]
            assert len(lines) == 1, f"logged once while it lasts, not per sweep: {lines}"

    with caplog.at_level(logging.INFO, logger="flexmig.telemetry.sampler"):
        asyncio.run(scenario())


def test_a_persistent_nvml_error_is_logged_once_when_it_lasts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with running("h200x1:1g.18gb@0", FAST) as daemon:
            node = sim_node(daemon)
            node.inject_error("nvmlDeviceGetClockInfo", "UNKNOWN", gpu=0, times=None)
            await sweeps(daemon, 8)
            node.clear_errors()
            await sweeps(daemon, 3)

    with caplog.at_level(logging.INFO, logger="flexmig.telemetry.sampler"):
        asyncio.run(scenario())
    failing = [r.getMessage() for r in caplog.records if "nvmlDeviceGetClockInfo" in r.getMessage()]
    assert len(failing) == 2, failing
    assert "sweeps in a row" in failing[0] and "no more" in failing[1]


def test_a_lost_gpu_that_answers_again_is_logged_and_no_longer_reported_lost(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running("h200x2:1g.18gb@0", FAST) as daemon:
            node = sim_node(daemon)
            node.lose_gpu(1)
            await sweeps(daemon, 3)
            assert values(await scrape(daemon), "flexmig_gpu_lost", gpu="1") == [1.0]
            node.reset_gpu(1)
            await sweeps(daemon, 3)
            assert values(await scrape(daemon), "flexmig_gpu_lost", gpu="1") == [0.0]

    with caplog.at_level(logging.INFO, logger="flexmig.telemetry.sampler"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if "GPU 1 " in r.getMessage()]
    assert len(lines) == 2 and "is lost" in lines[0] and "answers again" in lines[1], lines
