"""Events the actuator emits: each action started, completed, failed or cancelled, with timings; job exits.

The actuator only knows the :class:`EventSink` Protocol. The MQTT publisher (``flexmig.mqtt``) implements it
and sends each event to ``flexmig/v1/<node>/events/<kind>``; :class:`LoggingSink` and :class:`MemorySink` serve
the standalone service and tests. ``emit`` must not block: the MQTT sink queues into its persistent outbox.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["ActEvent", "EventSink", "LoggingSink", "MemorySink", "Relay"]


@dataclass(frozen=True, slots=True)
class ActEvent:
    """One thing the actuator did or saw (the fleet's versioned form is ``flexmig.mqtt.events.Event``).

    ``kind`` (the last segment of the MQTT topic) is one of ``action_started``, ``action_completed``,
    ``action_failed``, ``action_cancelled``, ``action_skipped``, ``job_started``, ``job_exited``, ``job_failed``,
    ``reconciled``, ``request_dropped`` (a control request that could not begin within its client's deadline:
    ``reason`` says so, ``detail["op"]`` names the operation; the fleet does not get it); ``action`` names the
    action (``migrate``, ``resplit``, ``start``, ``stop``, ``create_instance``, ``destroy_instance``,
    ``restart``); ``time_s`` is wall-clock time (epoch seconds); ``duration_s`` is set on completion/failure;
    ``steps`` gives each journalled step's duration in seconds.
    """

    kind: str
    time_s: float
    action: str | None = None
    action_id: int | None = None
    job: str | None = None
    reason: str = ""
    error: str | None = None
    duration_s: float | None = None
    steps: tuple[tuple[str, float], ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (the MQTT payload adds its event ID and schema version around it)."""
        out: dict[str, Any] = {"kind": self.kind, "time_s": self.time_s}
        for key in ("action", "action_id", "job", "error", "duration_s"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.reason:
            out["reason"] = self.reason
        if self.steps:
            out["steps"] = [{"step": n, "duration_s": round(d, 6)} for n, d in self.steps]
        if self.detail:
            out["detail"] = dict(self.detail)
        return out


class EventSink(Protocol):
    """Where events go. ``emit`` is called on the event loop and must return at once."""

    def emit(self, event: ActEvent) -> None:
        """Take one event."""


class LoggingSink:
    """Writes each event as one JSON line to a logger (INFO, WARNING for failures)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("flexmig.act.events")

    def emit(self, event: ActEvent) -> None:
        """Log the event."""
        level = logging.WARNING if event.kind in ("action_failed", "job_failed", "request_dropped") else logging.INFO
        self.logger.log(level, "%s", json.dumps(event.to_json(), sort_keys=True))


class MemorySink:
    """Keeps events in a list (tests and the migration benchmark read them back)."""

    def __init__(self) -> None:
        self.events: list[ActEvent] = []

    def emit(self, event: ActEvent) -> None:
        """Append the event."""
        self.events.append(event)


class Relay:
    """An event sink that passes events on to the sink connected later, keeping those that come before.

    The actuator needs its sink when it is built; the daemon's sink (its service layer) needs the built actuator.
    The relay stands between them: events come only once the actuator starts, after :meth:`connect`, but any that
    came earlier would be handed on then, never lost."""

    def __init__(self) -> None:
        self._target: EventSink | None = None
        self._early: list[ActEvent] = []

    def connect(self, target: EventSink) -> None:
        """Pass every event on to ``target`` from now on (those kept so far first)."""
        self._target = target
        early, self._early = self._early, []
        for event in early:
            target.emit(event)

    def emit(self, event: ActEvent) -> None:
        """Pass ``event`` on, or keep it until a sink is connected."""
        if self._target is None:
            self._early.append(event)
        else:
            self._target.emit(event)
