"""A simulated node's workload stepped by the sampler: on the NVML thread, in the sweep's own trip there, right before
the reads (what it changes shows in that very sweep), and a failing step costs no sweep."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flexmig import sim
from flexmig.errors import FlexmigError
from flexmig.nvml import GpmWindows, Nvml, NvmlWorker
from flexmig.telemetry.reader import NvmlReader
from flexmig.telemetry.sampler import SamplingLoop
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import Snapshot


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _CountingWorker(NvmlWorker):
    """The NVML thread, counting the trips made to it."""

    def __init__(self) -> None:
        super().__init__()
        self.trips = 0

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.trips += 1
        return await super().call(fn, *args, **kwargs)

    async def call_timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.trips += 1
        return await super().call_timed(fn, *args, **kwargs)


@pytest.fixture
def rig() -> Iterator[tuple[sim.SimNode, SamplingLoop, _CountingWorker, _Clock]]:
    clock = _Clock()
    node = sim.install("h200:1g.18gb@0+1g.18gb@1", clock=clock)
    nvml = Nvml.open()
    gpm = GpmWindows(clock=clock)
    worker = _CountingWorker()
    loop = SamplingLoop(
        NvmlReader(nvml, gpm), worker, TelemetrySettings(), lambda s: s, hostname="test", clock=clock,
        wall=lambda: clock.t + 1.8e9,
    )  # fmt: skip
    try:
        yield node, loop, worker, clock
    finally:
        worker.shutdown()
        gpm.close()
        nvml.close()
        sim.uninstall()


def _processes(snap: Snapshot | None) -> dict[str, int]:
    assert snap is not None
    return {i.mig_uuid: len(i.processes or ()) for g in snap.gpus for i in g.instances}


def test_the_step_runs_on_the_nvml_thread_in_the_sweep_s_own_trip_and_its_change_shows_in_that_sweep(
    rig: tuple[sim.SimNode, SamplingLoop, _CountingWorker, _Clock],
) -> None:
    node, loop, worker, clock = rig
    first, second = node.mig_uuids(0)
    calls: list[tuple[float, str]] = []

    def step(now: float) -> None:
        calls.append((now, threading.current_thread().name))
        if len(calls) == 1:
            node.start_process(first, memory_bytes=2**30)

    async def scenario() -> tuple[Snapshot | None, Snapshot | None, int]:
        await loop.start()
        loop.step = step
        trips = worker.trips
        clock.t += 1.0
        one = await loop.sweep()
        clock.t += 1.0
        two = await loop.sweep()
        return one, two, worker.trips - trips

    one, two, trips = asyncio.run(scenario())
    assert _processes(one) == {first: 1, second: 0}  # started by the step of the very sweep that reads it
    assert _processes(two) == {first: 1, second: 0}
    assert trips == 2  # one trip to the NVML thread a sweep, the step's included
    assert [now for now, _ in calls] == [1001.0, 1002.0]  # with the sweep's time
    assert all(name.startswith("flexmig-nvml") for _, name in calls)


def test_a_failing_step_costs_no_sweep_is_logged_once_and_is_tried_again(
    rig: tuple[sim.SimNode, SamplingLoop, _CountingWorker, _Clock], caplog: pytest.LogCaptureFixture
) -> None:
    node, loop, _worker, clock = rig
    first = node.mig_uuids(0)[0]
    tries: list[float] = []

    def step(now: float) -> None:
        tries.append(now)
        if len(tries) <= 3:
            raise FlexmigError("the simulated state file is gone")
        node.start_process(first)

    async def scenario() -> list[Snapshot | None]:
        await loop.start()
        loop.step = step
        out = []
        for _ in range(4):
            clock.t += 1.0
            out.append(await loop.sweep())
        return out

    with caplog.at_level(logging.WARNING, logger="flexmig.telemetry.sampler"):
        snaps = asyncio.run(scenario())
    assert all(s is not None for s in snaps)  # every sweep published
    assert len(tries) == 4  # the step is tried at every sweep
    assert _processes(snaps[2])[first] == 0 and _processes(snaps[3])[first] == 1  # and works again
    failures = [r for r in caplog.records if "workload step failed" in r.getMessage()]
    assert len(failures) == 1  # three failures alike, one line
    assert "the simulated state file is gone" in failures[0].getMessage()


def test_without_a_step_a_sweep_is_one_trip_too(rig: tuple[sim.SimNode, SamplingLoop, _CountingWorker, _Clock]) -> None:
    _node, loop, worker, clock = rig

    async def scenario() -> int:
        await loop.start()
        trips = worker.trips
        clock.t += 1.0
        await loop.sweep()
        return worker.trips - trips

    assert asyncio.run(scenario()) == 1
