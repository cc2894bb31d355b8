"""The sampling loop: every interval, one sweep on the NVML thread, joined with DCGM and host facts, published.

One sweep is: read every GPU and MIG device (``NodeReader.sample``, on the NVML thread); if the set of MIG
devices differs from the inventory's (an instance was created or destroyed), or the inventory is older than
``inventory_interval_s``, take a new inventory in the same sweep; read host facts for the GPU processes; join the
last fresh dcgm-exporter scrape; build the next :class:`Snapshot` and hand it to ``publish``. On a simulated node,
the simulator's workload (:attr:`SamplingLoop.step`) is stepped on the NVML thread right before the reads, in the
sweep's own trip to that thread: a second trip a second beside the sweep's cost more than the step itself.

Nothing a sweep meets may stop the loop: an NVML error on one GPU or instance is already recorded by ``nvml`` on
that object (and counted here, by call and error name); a sweep that fails outright is counted under
``source_errors["nvml"]``, logged once per kind, and the previous snapshot stays published until the next good
sweep. A GPU that reports GPU_IS_LOST is marked and logged when it is first seen lost, and again when it answers
once more. An NVML issue that persists (the same call failing on the same target, a reading out of range, a UUID
two devices report, in :data:`PERSISTENT_SWEEPS` sweeps in a row) is logged once, and once more when it ends:
each transition one line, never one per sweep, and never none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from flexmig.errors import FlexmigError
from flexmig.nvml.types import GpuSample, Inventory, NvmlIssue
from flexmig.nvml.worker import NvmlWorker
from flexmig.telemetry.dcgm import DcgmSource
from flexmig.telemetry.host import HostSource
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import DcgmStatus, SamplingStats, Snapshot
from flexmig.telemetry.store import TelemetryStore, pids_of

__all__ = ["NodeReader", "SamplingLoop", "dcgm_loop"]

log = logging.getLogger(__name__)

PERSISTENT_SWEEPS = 3
"""Sweeps in a row an NVML issue must last to be logged (a one-off failure is counted, not logged)."""


class NodeReader(Protocol):
    """What the sampler needs from NVML (``flexmig.nvml.Nvml`` with its GPM state, or a test's double).

    Both methods block and are only ever called on the NVML thread.
    """

    def inventory(self) -> Inventory:
        """The whole node: GPUs, GPU/compute instances, MIG devices."""
        ...

    def sample(self) -> tuple[GpuSample, ...]:
        """One sweep of every GPU and MIG device."""
        ...


class SamplingLoop:
    """Owns the sweep cadence, the error counters, and the telemetry store."""

    def __init__(
        self,
        reader: NodeReader,
        worker: NvmlWorker,
        settings: TelemetrySettings,
        publish: Callable[[Snapshot], Snapshot],
        *,
        hostname: str,
        host: HostSource | None = None,
        dcgm: DcgmSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._reader = reader
        self._worker = worker
        self._settings = settings
        self._publish = publish
        self._host = host
        self._dcgm = dcgm
        self._clock = clock
        self._wall = wall
        self.store = TelemetryStore(settings, hostname)
        self.interval_s = settings.interval_s  # the sweep cadence; a reload may change it while running
        self._inventory_at: float | None = None
        self._sweeps = 0
        self._inventories = 0
        self._cpu_total = 0.0
        self._nvml_errors: Counter[tuple[str, str]] = Counter()
        self._source_errors: Counter[str] = Counter()
        self._lost: dict[str, None] = {}  # insertion-ordered set of lost GPU UUIDs
        self._last_failure: str | None = None
        self._streaks: dict[tuple[str, str, str], int] = {}  # (call, error, target) -> sweeps in a row it failed
        self.step: Callable[[float], None] | None = None
        """A simulated node's workload, stepped with the sweep's time on the NVML thread right before each sweep's
        reads (None: none; real hardware). A failing step is logged, and the sweep goes on."""
        self._step_failure: str | None = None

    # ------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> Snapshot:
        """The first inventory and the first sweep; raises (a FlexmigError) if NVML cannot be read at all."""
        await self._take_inventory()
        snap = await self.sweep()
        if snap is None:
            raise FlexmigError(f"the first sampling sweep failed: {self._last_failure}")
        return snap

    async def run(self) -> None:
        """Sweep every ``interval_s`` until cancelled (fixed rate; a late sweep skips the ticks it missed)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            interval = self.interval_s  # read per tick: a configuration reload may change it
            try:
                await self.sweep()
            except Exception:  # a bug in one sweep must not end sampling; it is counted and logged
                self._source_errors["sweep"] += 1
                log.exception("sampling sweep crashed; the loop goes on")
            now = loop.time()
            next_at += interval
            if next_at < now:
                next_at = now + interval - ((now - next_at) % interval)

    # ---------------------------------------------------------------------------------------------- sweep
    async def sweep(self) -> Snapshot | None:
        """One sweep; returns the published snapshot, or None when NVML could not be read at all this time."""
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        try:
            if self.step is None:
                samples, nvml_cpu = await self._worker.call_timed(self._reader.sample)
            else:
                samples, nvml_cpu = await self._worker.call(self._stepped_sample, self.step)
            if self._needs_inventory(samples):
                nvml_cpu += await self._take_inventory()
        except FlexmigError as exc:
            self._failed("nvml", exc)
            return None
        now = self._clock()
        self._count_issues(samples)
        host = None
        if self._host is not None:
            before = self._host.errors
            host = self._host.read(pids_of(samples))
            self._source_errors["host"] += self._host.errors - before
        dcgm_scrape = None
        dcgm_status = None
        if self._dcgm is not None:
            dcgm_scrape = self._dcgm.fresh(now)
            last = self._dcgm.last_scrape()
            dcgm_status = DcgmStatus(
                url=self._dcgm.url,
                up=self._dcgm.up,
                era=None if last is None else last.era,
                instances=0 if last is None else len(last.instances),
                age_s=None if last is None else max(0.0, now - last.taken_at),
            )
            self._source_errors["dcgm"] = self._dcgm.failures
        cpu = (time.thread_time() - cpu0) + nvml_cpu
        self._sweeps += 1
        self._cpu_total += cpu
        stats = SamplingStats(
            sweeps=self._sweeps,
            last_sweep_s=time.perf_counter() - t0,
            last_sweep_cpu_s=cpu,
            sweep_cpu_s_total=self._cpu_total,
            inventories=self._inventories,
            nvml_errors=dict(self._nvml_errors),
            source_errors=dict(self._source_errors),
            lost_gpus=tuple(self._lost),
        )
        snap = self.store.build(
            samples, now=now, wall=self._wall(), stats=stats, dcgm=dcgm_scrape, dcgm_status=dcgm_status, host=host
        )
        snap = self._publish(snap)
        if self._last_failure is not None:
            log.info("sampling recovered after: %s", self._last_failure)
            self._last_failure = None
        return snap

    def _stepped_sample(self, step: Callable[[float], None]) -> tuple[tuple[GpuSample, ...], float]:
        """On the NVML thread: ``step`` the simulated workload, then sample; the sample's CPU seconds beside it (the
        step's are the simulator's, not the sweep's)."""
        try:
            step(self._clock())
        except Exception as exc:  # the demo's load must never cost a sweep; logged once per kind of failure
            text = f"{type(exc).__name__}: {exc}"
            if text != self._step_failure:
                log.warning("workload step failed: %s", text, exc_info=not isinstance(exc, FlexmigError))
                self._step_failure = text
        else:
            self._step_failure = None
        start = time.thread_time()
        return self._reader.sample(), time.thread_time() - start

    def _needs_inventory(self, samples: tuple[GpuSample, ...]) -> bool:
        if self._inventory_at is None or not self.store.matches(samples):
            return True
        return self._clock() - self._inventory_at >= self._settings.inventory_interval_s

    async def _take_inventory(self) -> float:
        inventory, cpu = await self._worker.call_timed(self._reader.inventory)
        self._inventory_at = self._clock()
        self._inventories += 1
        for issue in inventory.errors:
            self._nvml_errors[(issue.call, issue.name)] += 1
        for gpu in inventory.gpus:
            for issue in gpu.errors:
                self._nvml_errors[(issue.call, issue.name)] += 1
            self._mark_lost(gpu.index, gpu.uuid, gpu.lost, answered=gpu.mig_current is not None)
        old = self.store.inventory
        if old is not None:
            before = {d.uuid for _, d in old.mig_devices()}
            after = {d.uuid for _, d in inventory.mig_devices()}
            if before != after:
                log.info(
                    "MIG devices changed: %d appeared, %d disappeared; re-inventoried",
                    len(after - before),
                    len(before - after),
                )
        self.store.set_inventory(inventory)
        return cpu

    def _count_issues(self, samples: tuple[GpuSample, ...]) -> None:
        issues: list[NvmlIssue] = []
        for g in samples:
            for issue in g.errors:
                self._nvml_errors[(issue.call, issue.name)] += 1
            issues.extend(i for i in g.errors if i.name != "GPU_IS_LOST")
            self._mark_lost(g.index, g.uuid, g.lost, answered=g.mig_current is not None)
        self._log_persistent(issues)

    def _log_persistent(self, issues: list[NvmlIssue]) -> None:
        """One line when an issue has lasted :data:`PERSISTENT_SWEEPS` sweeps in a row, one when it ends."""
        now = {(i.call, i.name, i.target) for i in issues}
        for key in now:
            n = self._streaks.get(key, 0) + 1
            self._streaks[key] = n
            if n == PERSISTENT_SWEEPS:
                call, name, target = key
                log.warning(
                    "NVML %s on %s: %s in %d sweeps in a row; counted in flexmig_nvml_errors_total, and logged "
                    "again when it ends", call, target, name, n,
                )  # fmt: skip
        for key in [k for k in self._streaks if k not in now]:
            n = self._streaks.pop(key)
            if n >= PERSISTENT_SWEEPS:
                call, name, target = key
                log.info("NVML %s on %s: %s no more, after %d sweeps", call, target, name, n)

    def _mark_lost(self, index: int, uuid: str, lost: bool, *, answered: bool = True) -> None:
        if lost and uuid not in self._lost:
            self._lost[uuid] = None
            log.error("GPU %d (%s) is lost (GPU_IS_LOST): it is no longer sampled or changed", index, uuid)
        elif not lost and answered and uuid in self._lost:
            del self._lost[uuid]
            log.warning("GPU %d (%s) answers again after it was lost: sampled again", index, uuid)

    def _failed(self, source: str, exc: Exception) -> None:
        self._source_errors[source] += 1
        text = f"{type(exc).__name__}: {exc}"
        if text != self._last_failure:
            log.warning("sampling sweep failed (%s); keeping the last snapshot: %s", source, text)
        self._last_failure = text


async def dcgm_loop(source: DcgmSource, interval_s: float) -> None:
    """Scrape dcgm-exporter every ``interval_s`` until cancelled; failures are counted by the source itself."""
    while True:
        before = source.up
        await source.scrape()
        if before and not source.up:
            log.warning("dcgm-exporter scrape failed: %s", source.last_error)
        elif not before and source.up:
            log.info("dcgm-exporter at %s answers", source.url)
        await asyncio.sleep(interval_s)
