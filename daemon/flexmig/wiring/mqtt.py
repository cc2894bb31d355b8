"""Detection -> MQTT in the running daemon: events on every transition, the retained state, the publisher loop.

:class:`FindingsPublisher` subscribes to the snapshot hub. For each snapshot that carries a detection Report it
hands the sweep's events (``mqtt.events.events_from_report``: GPUs lost, instances destroyed and created,
findings ended and started) to the :class:`~flexmig.mqtt.publisher.MqttPublisher`, which stores each in the
persistent outbox before anything else, and replaces the retained ``state`` document when its content changed
(or every ``state_refresh_s``, so the retained time stays recent). Each event is also logged, one line with its
ID, so the journal is the record of what the daemon emitted.

:class:`MqttComponent` (component ``mqtt``) owns the outbox and the publisher; at start it subscribes its
:class:`FindingsPublisher` to the hub (before the first sweep), and its loop is the publisher's, restarted after a
failure (its state is in the outbox, on disk); cancelling it (SIGTERM) publishes ``offline`` before the connection
closes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flexmig.config import Config, MqttConfig
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.findings import PublisherMetrics, report_of
from flexmig.metrics.losses import LossMetrics
from flexmig.mqtt.events import Event, EventFactory, EventKind, events_from_report
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings
from flexmig.mqtt.state import state_document
from flexmig.storage import LockSet
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.detection import Detector

__all__ = ["FindingsPublisher", "MqttComponent"]

log = logging.getLogger(__name__)


def describe(event: Event) -> str:
    """One line for the journal: the event's reason, or what changed."""
    p = event.payload
    if "reason" in p:
        return str(p["reason"])
    if event.kind in (EventKind.INSTANCE_CREATED, EventKind.INSTANCE_DESTROYED):
        return f"{p.get('profile')} at GPU {p.get('gpu')} slice {p.get('start')} ({p.get('uuid') or 'no UUID'})"
    return ""


class FindingsPublisher:
    """A hub subscriber: each detection Report becomes events and the retained state on ``publisher``."""

    def __init__(
        self,
        publisher: MqttPublisher | None,
        detector: Detector,
        node: str,
        *,
        mode: str | None = None,
        state_refresh_s: float = 60.0,
    ) -> None:
        """``publisher`` None: it is :meth:`attach`-ed at start (the daemon's outbox is opened then, not while the
        components are built)."""
        self._publisher = publisher
        self.detector = detector
        self.node = node
        self.mode = mode
        self.state_refresh_s = state_refresh_s
        self._factory = EventFactory(node)
        self._uuids: dict[tuple[int, int], str] = {}
        self._emitted: Counter[str] = Counter()
        self._state_key: str | None = None
        self._state_at: float | None = None

    def attach(self, publisher: MqttPublisher) -> None:
        """Publish through ``publisher`` from now on (:class:`MqttComponent` attaches its own at start)."""
        self._publisher = publisher

    @property
    def publisher(self) -> MqttPublisher:
        """The publisher events go to; RuntimeError before one is attached (an event emitted before the MQTT
        component started is a bug of the component order)."""
        if self._publisher is None:
            raise RuntimeError("MQTT event emitted before the mqtt component started")
        return self._publisher

    def emitted(self) -> Mapping[str, int]:
        """Events handed to the publisher since start, by kind."""
        return dict(self._emitted)

    def emit(self, event: Event) -> None:
        """Publish an event of another component (the actuator's, the planner's): stored in the outbox, counted
        and logged with its ID exactly like detection's, so the journal records every ID the daemon emitted."""
        self.publisher.emit(event)
        self._emitted[event.kind.value] += 1
        log.info("event %s %s: %s", event.kind.value, event.id, describe(event))

    def __call__(self, snapshot: Snapshot) -> None:
        """Publish what detection found on ``snapshot`` (nothing if detection did not run on it)."""
        report = report_of(snapshot)
        node = self.detector.last
        if report is None or node is None or node.observation.now != report.now:
            return
        # A destroyed instance is no longer in this sweep: its UUID comes from the previous one (never from
        # this one, where another instance may sit at its place by now).
        for event in events_from_report(
            report,
            self._factory,
            instance_uuids=node.instance_uuids,
            gpu_uuids=node.gpu_uuids,
            previous_uuids=self._uuids,
        ):
            self.publisher.emit(event)
            self._emitted[event.kind.value] += 1
            log.info("event %s %s: %s", event.kind.value, event.id, describe(event))
        self._uuids = dict(node.instance_uuids)
        obs = node.observation
        doc = state_document(
            self.node,
            report,
            obs.layouts,
            gpu_uuids=node.gpu_uuids,
            instance_uuids=node.instance_uuids,
            lost=obs.lost_gpus,
            mode=self.mode,
        )
        self._maybe_set_state(doc, report.now)

    def _maybe_set_state(self, doc: Mapping[str, Any], now: float) -> None:
        """Replace the retained state when anything but its time changed, or when it is ``state_refresh_s`` old."""
        key = repr(sorted((k, repr(v)) for k, v in doc.items() if k != "time"))
        stale = self._state_at is None or now - self._state_at >= self.state_refresh_s
        if key != self._state_key or stale:
            self.publisher.set_state(doc)
            self._state_key, self._state_at = key, now


class MqttComponent:
    """The outbox, the publisher and the detection-to-MQTT subscriber of one daemon (``[mqtt] enabled = true``).

    Construction only keeps the settings; :meth:`start` takes the outbox's directory, opens the outbox (OutboxError:
    the daemon refuses to start rather than lose events) and subscribes to the hub. The broker address and
    credentials are only used by :meth:`run`, which never raises for network or broker trouble.

    ``broker_problem`` (flexmigd started with a malformed ``mqtt.broker``, see
    :func:`flexmig.config.load_config_deferring`): one error line says so, naming the file, line and key;
    publishing stays off, events wait in the outbox, and the first accepted reload (:meth:`reload`) turns it on.
    """

    name = "mqtt"
    restart = True  # its state is in the outbox, on disk

    def __init__(
        self,
        cfg: MqttConfig,
        node: str,
        detector: Detector,
        hub: SnapshotHub,
        *,
        mode: str | None = None,
        broker_problem: str | None = None,
        locks: LockSet | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.hub = hub
        self.broker_problem = broker_problem
        """Why publishing starts off (a malformed broker address), until a reload fixes it; None: it starts on."""
        self.locks = locks or LockSet()
        self.findings = FindingsPublisher(None, detector, node, mode=mode)
        self._lock: Path | None = None
        self._outbox: Outbox | None = None
        self._reloaded: Config | None = None  # a reload accepted before start (SIGHUP during start-up)

    @property
    def outbox(self) -> Outbox:
        """The open outbox (from :meth:`start` to :meth:`close`)."""
        if self._outbox is None:
            raise RuntimeError("the mqtt component has not started")
        return self._outbox

    @property
    def publisher(self) -> MqttPublisher:
        """The publisher (from :meth:`start` on)."""
        return self.findings.publisher

    async def start(self) -> None:
        """Take the outbox's directory, open the outbox, and publish what detection finds on every sweep from the
        first on."""
        cfg = self.cfg
        if cfg.outbox.parent.is_dir():  # a missing directory: the outbox says so, naming itself
            # Before the outbox is opened: another daemon's outbox is neither read nor, if corrupt, moved aside.
            self._lock = self.locks.take_dir(cfg.outbox.parent, "state directory")
        try:
            self._outbox = Outbox(cfg.outbox, max_bytes=cfg.outbox_max_bytes)
        except BaseException:
            self._release()
            raise
        settings = PublisherSettings.from_config(cfg, self.node)
        self.findings.attach(MqttPublisher(settings, self._outbox, off=self.broker_problem))
        if self.broker_problem is not None:
            log.error(
                "%s; MQTT publishing is off until it is fixed (SIGHUP after fixing); events wait in the outbox %s",
                self.broker_problem,
                self._outbox.path,
            )
        if self._reloaded is not None:
            self.reload(self._reloaded)
        self.hub.subscribe(self.findings)

    async def drain(self) -> None:
        """Nothing to wait for: events are in the outbox; the loop says ``offline`` when cancelled."""

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """The publisher's counters, and the events it lost."""
        stats = self.publisher.stats
        return PublisherMetrics(stats, self.findings.emitted), LossMetrics(publisher=stats)

    def reload(self, config: Config) -> None:
        """An accepted reload: if publishing was off for a malformed broker address, publish to the new one (the
        reload validated it). Otherwise ``[mqtt]`` changes wait for the next start."""
        if self._outbox is None:
            self._reloaded = config  # applied at start
            return
        if config.mqtt.enabled and self.publisher.resume(PublisherSettings.from_config(config.mqtt, self.node)):
            log.info(
                "MQTT broker address fixed by the reload: publishing to %s; %d event(s) queued",
                config.mqtt.broker,
                len(self.outbox),
            )

    async def run(self) -> None:
        """The publisher loop until cancelled (it says ``offline`` first). It may run again after a failure (the
        daemon restarts it): the outbox stays open until :meth:`close`."""
        await self.publisher.run()

    async def close(self) -> None:
        """Close the outbox and let its directory go (after every loop has ended, however it ended, or a start
        that never happened)."""
        outbox, self._outbox = self._outbox, None
        if outbox is not None:
            outbox.close()
        self._release()

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            self.locks.drop(lock)
