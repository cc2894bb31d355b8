"""Detection's reports as MQTT events and the retained state: :class:`FindingsPublisher`, a snapshot hub subscriber.

For each snapshot that carries a detection Report it hands the sweep's events
(:func:`flexmig.mqtt.events.events_from_report`: GPUs lost, instances destroyed and created, findings ended and
started) to the :class:`~flexmig.mqtt.publisher.MqttPublisher`, which stores each in the persistent outbox before
anything else, and replaces the retained ``state`` document when its content changed (or every ``state_refresh_s``,
so the retained time stays recent). Each event is also logged, one line with its ID, so the journal is the record of
what the daemon emitted. The daemon's ``mqtt`` component (``flexmig.wiring.mqtt``) subscribes it to the hub and
gives it its publisher when the outbox opens. Log lines keep the logger ``flexmig.wiring.mqtt`` (operators' filters
name it).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from flexmig.detect import Report
from flexmig.mqtt.events import Event, EventFactory, EventKind, events_from_report
from flexmig.mqtt.publisher import MqttPublisher
from flexmig.mqtt.state import state_document
from flexmig.telemetry.observation import NodeObservation
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["FindingsPublisher", "LastObservation"]

log = logging.getLogger("flexmig.wiring.mqtt")


class LastObservation(Protocol):
    """What the publisher reads of detection (``flexmig.service.detection.Detector`` has it): the observation the
    last report came from."""

    @property
    def last(self) -> NodeObservation | None:
        """The last sweep's observation (None when detection failed on it)."""


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
        detector: LastObservation,
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
        report = next((f for f in snapshot.findings if isinstance(f, Report)), None)
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
