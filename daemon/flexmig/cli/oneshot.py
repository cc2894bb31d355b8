"""One look at a simulated node in this process, for ``flexmig status --sim`` and ``flexmig plan --sim``.

:func:`sim_snapshot` installs the simulated node, applies the demo workload (as ``flexmigd --sim`` does), takes
the first inventory and two sweeps a moment apart (so GPM activity has a window), runs detection once with every
window at zero (one sweep is all the history there is, so findings are judged on it at once), and takes the
simulator away again. :func:`sim_plan_input` gives the planner's view of a simulated node (no jobs: a
simulated node seen from outside the daemon has none; the demo workload's processes block their instances).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Sequence

from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.config import Config
from flexmig.detect import Report
from flexmig.metrics.findings import report_of
from flexmig.nvml.worker import NvmlWorker
from flexmig.plan.types import JobRequest
from flexmig.service.detection import Detector, detect_settings
from flexmig.service.planning import PlanningInput, parse_request, planning_state
from flexmig.telemetry.host import HostSource
from flexmig.telemetry.sampler import SamplingLoop
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.backend import Backend, DemoWorkload, open_backend

__all__ = ["instant_detection", "sim_plan_input", "sim_snapshot"]

_GPM_WINDOW_S = 0.2


def instant_detection(config: Config) -> Detector:
    """A detector for ``config``'s thresholds that judges a single sweep (every window 0, or its minimum)."""
    cfg = dataclasses.replace(
        config.detect,
        underuse_window_s=0.0,
        underuse_exit_window_s=0.0,
        oversize_window_s=1.0,
        fragmentation_window_s=0.0,
    )
    return Detector(detect_settings(cfg))


@contextlib.asynccontextmanager
async def _simulated_node(spec: str, *, gpm: bool) -> AsyncIterator[tuple[NvmlWorker, Backend, DemoWorkload]]:
    """The simulated node ``spec`` opened on an NVML thread of its own, its demo workload stepped once; closed, and
    the thread stopped, on leaving."""
    worker = NvmlWorker("flexmig-oneshot")
    backend: Backend | None = None
    try:
        backend = await worker.call(open_backend, spec, gpm, time.monotonic)
        workload = backend.workload
        assert workload is not None
        await worker.call(workload, time.monotonic())
        yield worker, backend, workload
    finally:
        if backend is not None:
            await worker.call(backend.close)
        worker.shutdown()


async def _sweeps(spec: str, config: Config, hostname: str) -> tuple[Snapshot, Report | None]:
    async with _simulated_node(spec, gpm=True) as (worker, backend, workload):
        detector = instant_detection(config)
        sampler = SamplingLoop(
            backend.reader,
            worker,
            TelemetrySettings.from_config(config),
            detector.enrich,
            hostname=hostname,
            host=HostSource(),
        )
        snap = await sampler.start()
        await asyncio.sleep(_GPM_WINDOW_S)
        await worker.call(workload, time.monotonic())
        snap = await sampler.sweep() or snap
        return snap, report_of(snap)


def sim_snapshot(
    spec: str, config: Config | None = None, hostname: str | None = None
) -> tuple[Snapshot, Report | None]:
    """One look at the simulated node ``spec``: its snapshot and detection report (NodeSpecError for a bad spec)."""
    return asyncio.run(_sweeps(spec, config or Config.default(), hostname or socket.gethostname()))


def sim_plan_input(spec: str, requests: Sequence[str], now_s: float) -> PlanningInput:
    """The planner's view of the simulated node ``spec`` with the what-if ``requests`` (``[Nx]PROFILE``) queued.

    ValueError for a bad request, NodeSpecError for a bad spec, PlanRejectedError for a node with no MIG GPU of
    a known model.
    """
    return asyncio.run(_plan_input(spec, requests, now_s))


async def _plan_input(spec: str, requests: Sequence[str], now_s: float) -> PlanningInput:
    async with _simulated_node(spec, gpm=False) as (worker, backend, _):
        inventory = await worker.call(backend.nvml.inventory)
    view = NodeView.of(inventory)
    model = node_model(view)
    extra: list[JobRequest] = [parse_request(r, i + 1, model, now_s) for i, r in enumerate(requests)]
    return planning_state(
        view,
        (),
        alive_pids={},
        now_s=now_s,
        mig_enabled={g.index: g.mig_current for g in inventory.gpus},
        extra=extra,
    )
