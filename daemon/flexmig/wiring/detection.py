"""Detection in the running daemon: each published snapshot -> one ``detect.observe`` step -> a Report on the
snapshot.

:class:`Detector` is a snapshot enricher (``SnapshotHub.add_enricher``): it turns the snapshot into the pure
detection layer's inputs (:func:`observation_of`: a ``Layout`` per MIG GPU, an ``InstanceUsage`` window per
instance, the lost GPUs), runs :func:`flexmig.detect.observe` with the snapshot's time, keeps the returned state
for the next sweep, and puts the :class:`~flexmig.detect.Report` into ``Snapshot.findings``, where the Prometheus
extension (:mod:`flexmig.export.findings_metrics`) and the event publisher find it. Nothing here does I/O.

Time: detection takes time as an argument; the daemon gives it the sweep's monotonic time shifted once to Unix
time (``taken_at - monotonic`` of the first sweep). Windows and hysteresis therefore never see a wall-clock step,
while the times in events and findings still read as dates.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from flexmig.config import DetectConfig
from flexmig.detect import DetectSettings, DetectState, InstanceUsage, Observation, observe, settings_from_thresholds
from flexmig.errors import LayoutError
from flexmig.mig import GpuModel, Layout, model_by_name
from flexmig.telemetry.snapshot import GpuSnapshot, InstanceSnapshot, Snapshot

__all__ = ["Detector", "NodeObservation", "detect_settings", "observation_of", "usage_of"]

log = logging.getLogger(__name__)

_MIN_WINDOW_S = 1e-3  # InstanceUsage needs a positive window; one reading covers "an instant"


def detect_settings(cfg: DetectConfig) -> DetectSettings:
    """The daemon's ``[detect]`` table as detection settings: the one place this mapping lives."""
    return settings_from_thresholds(
        activity=cfg.underuse_activity,
        activity_exit=cfg.underuse_activity_exit,
        memory=cfg.underuse_memory,
        memory_exit=cfg.underuse_memory_exit,
        window_s=cfg.underuse_window_s,
        exit_window_s=cfg.underuse_exit_window_s,
        oversize_margin=cfg.oversize_margin,
        oversize_window_s=cfg.oversize_window_s,
        fragmentation=cfg.fragmentation_threshold,
        fragmentation_exit=cfg.fragmentation_exit,
        fragmentation_window_s=cfg.fragmentation_window_s,
        demand=cfg.demand_mix.weights(),
    )


@dataclass(frozen=True, slots=True)
class NodeObservation:
    """A snapshot as detection sees it, plus the identities events need (MIG and GPU UUIDs by position)."""

    observation: Observation
    instance_uuids: Mapping[tuple[int, int], str]
    gpu_uuids: Mapping[int, str]


LayoutCache = dict[tuple[str, tuple[tuple[int, int], ...]], Layout | None]


def _layout_of(gpu: GpuSnapshot, cache: LayoutCache) -> Layout | None:
    """The GPU's layout from its GPU instances (profile and start), those without a MIG device included (they hold
    their slices all the same); None when our catalogue cannot model it."""
    model = model_by_name(gpu.model_name)
    if model is None:
        return None
    placed = {(i.start, i.profile_id) for i in gpu.instances} | {(g.start, g.profile_id) for g in gpu.gpu_instances}
    items = tuple(sorted(placed))
    key = (model.key, items)
    if key in cache:
        return cache[key]
    layout = _build_layout(model, items)
    if len(cache) > 256:  # layouts change rarely; a node that churns forever must not grow this
        cache.clear()
    cache[key] = layout
    return layout


def _build_layout(model: GpuModel, items: tuple[tuple[int, int], ...]) -> Layout | None:
    try:
        return Layout.of(model, [(model.profile_by_id(pid), start) for start, pid in items])
    except (KeyError, LayoutError):
        return None  # a profile we have no table for, or a layout our catalogue thinks impossible: claim nothing


def usage_of(inst: InstanceSnapshot, at: float) -> InstanceUsage:
    """The telemetry window of one instance at detection time ``at``.

    Activity comes from the SM-activity window (mean and p95), memory from the memory window's peak (a job must
    fit its peak, not its mean), processes from this sweep. The window is what the readings really cover
    (``span_s``), and for an instance without processes no more than how long it has been idle, so a job that
    just exited is not called idle for the whole window.
    """
    sm, mem = inst.sm_active_window, inst.memory_used_window
    spans = [w.span_s for w in (sm, mem) if w is not None]
    window = max(spans, default=0.0)
    processes = None if inst.processes is None else len(inst.processes)
    if processes == 0 and inst.idle_seconds is not None:
        window = min(window, inst.idle_seconds)
    memory_used = mem.max if mem is not None else inst.memory_used_bytes
    return InstanceUsage(
        gpu=inst.gpu_index,
        start=inst.start,
        profile=inst.profile_name,
        at=at,
        window_s=max(window, _MIN_WINDOW_S),
        activity_mean=None if sm is None else _ratio(sm.mean),
        activity_p95=None if sm is None else _ratio(sm.p95),
        memory_used_bytes=None if memory_used is None else int(memory_used),
        memory_total_bytes=inst.memory_total_bytes,
        processes=processes,
        uuid=inst.mig_uuid,
    )


def _ratio(x: float) -> float:
    return min(max(x, 0.0), 1.5)  # InstanceUsage refuses values beyond what any source can legitimately report


def observation_of(snapshot: Snapshot, now: float, cache: LayoutCache | None = None) -> NodeObservation:
    """Detection's inputs from one snapshot: layouts of MIG GPUs our catalogue models, one usage window per GI
    (its first compute instance), lost GPUs; ``now`` is the detection time of the sweep."""
    cache = {} if cache is None else cache
    layouts: dict[int, Layout] = {}
    usage: list[InstanceUsage] = []
    uuids: dict[tuple[int, int], str] = {}
    lost: set[int] = set()
    for gpu in snapshot.gpus:
        if gpu.lost:
            lost.add(gpu.index)
            continue
        if not gpu.mig_current:
            continue
        layout = _layout_of(gpu, cache)
        if layout is None:
            continue
        layouts[gpu.index] = layout
        for inst in gpu.instances:
            key = (inst.gpu_index, inst.start)
            if key in uuids:
                continue  # a GI with several compute instances: judged once, by its first
            uuids[key] = inst.mig_uuid
            usage.append(usage_of(inst, now))
    instance_uuids = MappingProxyType(uuids)
    obs = Observation(now=now, layouts=layouts, usage=tuple(usage), lost_gpus=frozenset(lost), uuids=instance_uuids)
    gpu_uuids = {g.index: g.uuid for g in snapshot.gpus}
    return NodeObservation(obs, instance_uuids, MappingProxyType(gpu_uuids))


class Detector:
    """The daemon's detection step, run as a snapshot enricher. Holds the only mutable detection state.

    After each :meth:`enrich`, :attr:`last` is the observation the report came from (for the event publisher,
    which runs as a hub subscriber on the same snapshot right after).
    """

    def __init__(self, settings: DetectSettings, *, cpu_clock: Callable[[], float] = time.perf_counter) -> None:
        self.settings = settings
        self._state = DetectState()
        self._offset: float | None = None
        self._cache: LayoutCache = {}
        self._clock = cpu_clock
        self.last: NodeObservation | None = None
        self.last_duration_s: float | None = None
        self.failures = 0
        self._failure_logged: str | None = None

    def configure(self, settings: DetectSettings) -> None:
        """New thresholds (a configuration reload); running conditions keep their state."""
        self.settings = settings

    def stats(self) -> tuple[float | None, int]:
        """(wall seconds of the last step, failed steps since start), for ``flexmig_detect_*``."""
        return self.last_duration_s, self.failures

    def now_of(self, snapshot: Snapshot) -> float:
        """Detection time of ``snapshot``: its monotonic time on a Unix-time scale fixed at the first sweep."""
        if self._offset is None:
            self._offset = snapshot.taken_at - snapshot.monotonic
        return snapshot.monotonic + self._offset

    def enrich(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` with this sweep's Report in ``findings``; on a failure, the snapshot unchanged (counted,
        logged once per kind of failure, so a detection bug never stops telemetry nor floods the journal)."""
        started = self._clock()
        try:
            node = observation_of(snapshot, self.now_of(snapshot), self._cache)
            self._state, report = observe(self._state, node.observation, self.settings)
        except Exception as exc:
            self.failures += 1
            self.last = None
            kind = f"{type(exc).__name__}: {exc}"
            if kind != self._failure_logged:
                log.exception("detection failed on sweep %d; publishing without findings", snapshot.stats.sweeps)
                self._failure_logged = kind
            return snapshot
        self.last = node
        self.last_duration_s = self._clock() - started
        return dataclasses.replace(snapshot, findings=(*snapshot.findings, report))

    @property
    def state(self) -> DetectState:
        """Detection's state after the last sweep."""
        return self._state
