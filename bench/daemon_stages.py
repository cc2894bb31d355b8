"""Where flexmig's own CPU goes in one sweep: the daemon's sweep path run in this process, each area timed.

``bench/daemon.py`` measures real daemons from /proc, which says how much but not where; a sampling profiler (its
``--profile``) says where, but on a shared machine it also samples threads that wait for a core or for the GIL. This
runs what one sweep of ``flexmigd --sim`` runs, with the same classes wired the same way: the sampling loop
(``SamplingLoop.sweep``: the NVML thread's sweep, host facts, the snapshot), the snapshot hub with detection as its
enricher (``Detector.enrich``), the demo workload stepped in the sweep's trip to the NVML thread, the garbage
collector set up as ``SamplerComponent.start`` sets it, and one ``/metrics`` render (``Exposition``, gzip, as
Prometheus asks) every 15 sweeps; on the simulator's clock, one second a sweep. Each area's CPU is taken with
``time.thread_time`` around its call (a wrapper set on the instance here, nothing in the product), the simulated
library's inside NVML calls taken off as ``sim_cost`` does, and *the rest* is the process's CPU less the areas and
the simulation: the sampler's bookkeeping, the thread hop, asyncio.

Garbage collection runs inside whichever area allocates when a generation fills, so it is shown apart, as a share
of the same total, and is not added to the areas.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

import flexmig.service.detection as detection_wiring
from flexmig import sim
from flexmig.config import Config
from flexmig.daemon import GC_THRESHOLD
from flexmig.metrics.findings import FindingsMetrics
from flexmig.metrics.scrape import Exposition
from flexmig.nvml import GpmWindows, Nvml, NvmlWorker
from flexmig.service.detection import Detector, detect_settings
from flexmig.telemetry.host import HostSource
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.reader import NvmlReader
from flexmig.telemetry.sampler import SamplingLoop
from flexmig.telemetry.settings import TelemetrySettings

__all__ = ["AREAS", "stages"]

AREAS = (
    "NVML reads (flexmig's and pynvml's Python)",
    "snapshot build (telemetry/store)",
    "detection: observation (telemetry/observation)",
    "detection: judging (detect/)",
    "host facts of GPU processes (psutil)",
    "/metrics render, one scrape every 15 sweeps",
    "the rest: sampler bookkeeping, thread hop, asyncio",
)
GC = "of which garbage collection (inside the areas)"
SCRAPE_EVERY = 15


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _timed(fn: Callable[..., Any], acc: dict[str, float], key: str) -> Callable[..., Any]:
    tt = time.thread_time

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = tt()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] += tt() - t0

    return timed


def _counted(fn: Callable[..., Any], acc: dict[str, float], tt: Callable[[], float]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        acc["library calls"] += 1
        t0 = tt()
        try:
            return fn(*args)
        finally:
            acc["library"] += tt() - t0

    return call


def _wrapper_costs(n: int = 20000) -> tuple[float, float]:
    """(what a counted call records of an empty function, what it adds to the caller's CPU in all), in seconds."""
    acc = {"library": 0.0, "library calls": 0.0}
    empty = lambda *a: 0  # noqa: E731
    wrapped = _counted(empty, acc, time.thread_time)
    best = [float("inf"), float("inf")]
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(n):
            empty()
        t1 = time.thread_time()
        for _ in range(n):
            wrapped()
        t2 = time.thread_time()
        best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
    return acc["library"] / (5 * n), max(0.0, best[1] - best[0]) / n


async def _run(spec: str, workload: bool, sweeps: int) -> dict[str, float]:
    clock = _Clock()
    node = sim.install(spec, clock=clock)
    nvml = Nvml.open()
    gpm = GpmWindows(clock=clock)
    worker = NvmlWorker()
    try:
        reader = NvmlReader(nvml, gpm)
        hub = SnapshotHub()
        detector = Detector(detect_settings(Config().detect))
        hub.add_enricher(detector.enrich)
        exposition = Exposition(hub.latest, (FindingsMetrics(detector.stats),))
        host = HostSource(clock=clock)
        loop = SamplingLoop(
            reader, worker, TelemetrySettings(), hub.publish, hostname="bench", host=host, clock=clock,
            wall=lambda: clock.t + 1.8e9,
        )  # fmt: skip
        jobs = sim.JobLoad(node)

        def step(now: float) -> None:
            if workload:
                node.step_workload(now)
            jobs(now)

        await loop.start()
        gc.freeze()  # as flexmig.daemon.settle_gc does once every component started
        threshold = gc.get_threshold()
        gc.set_threshold(GC_THRESHOLD, *threshold[1:])
        loop.step = step  # as the daemon's workload loop has it: stepped in the sweep's own trip to the NVML thread
        for _ in range(20):  # windows filled a little, every entry point resolved
            clock.t += 1.0
            await loop.sweep()
        acc = dict.fromkeys((*AREAS, GC, "library", "library calls", "workload", "total"), 0.0)
        cache = N._nvmlGetFunctionPointer_cache
        saved = dict(cache)
        for name, fn in saved.items():
            cache[name] = _counted(fn, acc, time.thread_time)
        reader.sample = _timed(reader.sample, acc, AREAS[0])  # type: ignore[method-assign]
        reader.inventory = _timed(reader.inventory, acc, AREAS[0])  # type: ignore[method-assign]
        loop.store.build = _timed(loop.store.build, acc, AREAS[1])  # type: ignore[method-assign]
        host.read = _timed(host.read, acc, AREAS[4])  # type: ignore[method-assign]
        observation_of, observe = detection_wiring.observation_of, detection_wiring.observe
        detection_wiring.observation_of = _timed(observation_of, acc, AREAS[2])
        detection_wiring.observe = _timed(observe, acc, AREAS[3])
        loop.step = _timed(step, acc, "workload")
        gc_start = [0.0]

        def on_gc(phase: str, _info: dict[str, Any]) -> None:
            if phase == "start":
                gc_start[0] = time.thread_time()
            else:
                acc[GC] += time.thread_time() - gc_start[0]

        gc.callbacks.append(on_gc)
        try:
            cpu0 = time.process_time()
            for i in range(sweeps):
                clock.t += 1.0
                await loop.sweep()
                if i % SCRAPE_EVERY == 0:
                    t0 = time.thread_time()
                    exposition.body(openmetrics=False, compressed=True)
                    acc[AREAS[5]] += time.thread_time() - t0
            acc["total"] = time.process_time() - cpu0
        finally:
            gc.callbacks.remove(on_gc)
            gc.set_threshold(*threshold)
            gc.unfreeze()
            detection_wiring.observation_of, detection_wiring.observe = observation_of, observe
            cache.update(saved)
        inside, extra = _wrapper_costs()
        calls = acc["library calls"]
        library = max(0.0, acc["library"] - calls * inside)
        acc[AREAS[0]] -= library + calls * extra  # the library's time and the timers', inside the reads
        own = acc["total"] - library - acc["workload"] - calls * extra
        acc[AREAS[6]] = own - sum(acc[a] for a in AREAS[:6])
        return {**{a: acc[a] / sweeps for a in (*AREAS, GC)}, "own": own / sweeps}
    finally:
        worker.shutdown()
        gpm.close()
        nvml.close()
        sim.uninstall()


def stages(spec: str, workload: bool, sweeps: int) -> dict[str, float]:
    """flexmig's own CPU seconds per sweep of ``spec``'s node, by area (:data:`AREAS`, and the garbage collector's
    share), and in all (``own``)."""
    return asyncio.run(_run(spec, workload, sweeps))
