"""Sampling in the running daemon: the sampler component, and the loops that live beside it.

:class:`SamplerComponent` (``sampling``) builds the :class:`~flexmig.telemetry.sampler.SamplingLoop` on the node the
``nvml`` component opened, takes the first inventory and sweep at start (so READY means a snapshot is published,
with detection's report on it: the detection component registered its enricher before), then sweeps every
``sampling.interval_s``. Each published snapshot beats the heartbeat the watchdog reads.

Beside it, three plain loops (:class:`~flexmig.wiring.component.Loop`): ``dcgm`` scrapes dcgm-exporter
(:func:`flexmig.telemetry.sampler.dcgm_loop`), ``workload`` has the sampler step a simulated node's demo workload
before each sweep's reads (:func:`demo_workload_loop`), and ``watchdog`` feeds systemd's watchdog while the
heartbeat is fresh (:func:`watchdog_loop`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence

from flexmig.config import Config
from flexmig.errors import FlexmigError
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.nvml.worker import NvmlWorker
from flexmig.sdnotify import Heartbeat, Notifier, Watchdog, watchdog_timeout_s
from flexmig.telemetry.dcgm import DcgmSource
from flexmig.telemetry.host import HostSource
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.sampler import SamplingLoop
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.backend import NodeComponent
from flexmig.wiring.component import idle

__all__ = ["SamplerComponent", "demo_workload_loop", "watchdog_loop"]


class SamplerComponent:
    """The sampling loop of one daemon, on the node of its ``nvml`` component."""

    name = "sampling"
    restart = False  # a wedged or dead sampler is what the watchdog and a restart of the daemon are for

    def __init__(
        self,
        node: NodeComponent,
        worker: NvmlWorker,
        settings: TelemetrySettings,
        hub: SnapshotHub,
        heartbeat: Heartbeat,
        *,
        hostname: str,
        dcgm: DcgmSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.worker = worker
        self.settings = settings
        self.hub = hub
        self.heartbeat = heartbeat
        self.hostname = hostname
        self.dcgm = dcgm
        self.clock = clock
        self.loop: SamplingLoop | None = None
        """The sampling loop, once started."""
        self.first: Snapshot | None = None
        """The first sweep's snapshot."""
        self.workload: Callable[[float], None] | None = None
        """The simulated node's workload step, once the ``workload`` loop set it (:func:`demo_workload_loop`)."""

    async def start(self) -> None:
        """Build the loop on the open node; the first inventory and sweep (a FlexmigError if NVML cannot be read)."""
        backend = self.node.backend
        if backend is None:
            raise FlexmigError("sampling needs an open NVML session")
        self.loop = SamplingLoop(
            backend.reader,
            self.worker,
            self.settings,
            self._published,
            hostname=self.hostname,
            host=HostSource(clock=self.clock) if self.settings.host else None,
            dcgm=self.dcgm,
            clock=self.clock,
        )
        self.loop.step = self.workload
        self.first = await self.loop.start()

    async def run(self) -> None:
        """Sweep until cancelled."""
        if self.loop is None:  # run() follows a start() that succeeded
            raise FlexmigError("the sampling loop was not started")
        await self.loop.run()

    async def drain(self) -> None:
        """Nothing to finish: a sweep in flight is cancelled with the loop."""

    async def close(self) -> None:
        """Nothing held: the node is the ``nvml`` component's."""

    def reload(self, config: Config) -> None:
        """The new sweep interval, from the next tick (the other ``[sampling]`` keys are restart keys)."""
        self.settings = dataclasses.replace(self.settings, interval_s=config.sampling.interval_s)
        if self.loop is not None:
            self.loop.interval_s = config.sampling.interval_s

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """None beside the snapshot's own families (the collector exports the sampling stats of every snapshot)."""
        return ()

    def set_workload(self, step: Callable[[float], None] | None) -> None:
        """Step a simulated node's workload with ``step`` before each sweep's reads from now on (None: no more)."""
        self.workload = step
        if self.loop is not None:
            self.loop.step = step

    def _published(self, snapshot: Snapshot) -> Snapshot:
        snapshot = self.hub.publish(snapshot)
        self.heartbeat.beat(snapshot.monotonic)
        return snapshot


async def demo_workload_loop(
    node: NodeComponent, sampler: SamplerComponent, exclude: Callable[[], Collection[tuple[int, int]]]
) -> None:
    """Have ``sampler`` step the simulated node's workload (the demo's synthetic load and the jobs' own footprint) on
    the NVML thread before each sweep's reads, leaving the demo's load off the instances ``exclude()`` names (those
    the actuator uses), until cancelled; waits to be cancelled when the node has none (real hardware).

    In the sweep's own trip to the NVML thread, not on a timer of its own: a second trip each second, beside the
    sweep's, cost the daemon more CPU than the step itself (the thread hand-over, both ways)."""
    backend = node.backend
    workload = None if backend is None else backend.workload
    if workload is None:
        await idle()
        return

    def step(now: float) -> None:
        workload(now, exclude=exclude())

    sampler.set_workload(step)
    try:
        await idle()
    finally:
        sampler.set_workload(None)


async def watchdog_loop(notifier: Notifier, heartbeat: Heartbeat, max_age_s: float) -> None:
    """Feed systemd's watchdog while the last sweep is at most ``max_age_s`` old; waits to be cancelled when systemd
    asked for no watchdog (no ``WATCHDOG_USEC`` for this process)."""
    timeout = watchdog_timeout_s()
    if timeout is None or not notifier.enabled:
        await idle()
        return
    await Watchdog(notifier, heartbeat, timeout_s=timeout, max_age_s=max_age_s).run()
