"""Detection in the running daemon: each published snapshot -> one ``detect.observe`` step -> a Report on the
snapshot.

:class:`Detector` is a snapshot enricher (``SnapshotHub.add_enricher``, put on the hub by the wiring's ``detection``
component): it turns the snapshot into the pure detection layer's inputs
(:func:`flexmig.telemetry.observation.observation_of`: a ``Layout`` per MIG GPU, an ``InstanceUsage`` window per
instance, the lost GPUs), runs :func:`flexmig.detect.observe` with the snapshot's time, keeps the returned state for
the next sweep, and puts the :class:`~flexmig.detect.Report` into ``Snapshot.findings``, where the Prometheus
extension (:mod:`flexmig.metrics.findings`) and the event publisher (:mod:`flexmig.mqtt.findings`) find it. Nothing
here does I/O. Log lines keep the logger ``flexmig.wiring.detection`` (operators' filters name it).

Time: detection takes time as an argument; the daemon gives it the sweep's monotonic time shifted once to Unix
time (``taken_at - monotonic`` of the first sweep). Windows and hysteresis therefore never see a wall-clock step,
while the times in events and findings still read as dates.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from flexmig.config import DetectConfig
from flexmig.config.settings import build_settings
from flexmig.detect import DetectSettings, DetectState, observe
from flexmig.telemetry.observation import LayoutCache, NodeObservation, observation_of
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["Detector", "detect_settings"]

log = logging.getLogger("flexmig.wiring.detection")


def detect_settings(cfg: DetectConfig) -> DetectSettings:
    """The ``[detect]`` table as detection's settings, built from the schema (each key's ``to`` names the field it
    sets: :func:`~flexmig.config.settings.build_settings`)."""
    return build_settings(DetectSettings, cfg)


class Detector:
    """The daemon's detection step, run as a snapshot enricher. Holds the only mutable detection state.

    After each :meth:`enrich`, :attr:`last` is the observation the report came from (for the event publisher,
    which runs as a hub subscriber on the same snapshot right after).
    """

    def __init__(self, settings: DetectSettings, *, cpu_clock: Callable[[], float] = time.perf_counter) -> None:
        self.settings = settings
        self._state = DetectState()
        self._offset: float | None = None
        self._cache = LayoutCache()
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
