"""Where the latest snapshot lives, and the hooks that run when a new one is published.

The sampling loop calls :meth:`SnapshotHub.publish` once per sweep. Enrichers (pure ``Snapshot -> Snapshot``
functions, e.g. the detect layer attaching findings) run first, in order; the result is swapped in with one
reference assignment, which readers on other threads (the Prometheus server) see atomically; then subscribers
(the MQTT publisher, the planner) are called with it on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flexmig.telemetry.snapshot import Snapshot

__all__ = ["Enricher", "SnapshotHub", "Subscriber"]

log = logging.getLogger(__name__)

Enricher = Callable[[Snapshot], Snapshot]
Subscriber = Callable[[Snapshot], None]


class SnapshotHub:
    """Holds the latest published snapshot; thread-safe for readers, written only by the sampling loop."""

    def __init__(self) -> None:
        self._latest: Snapshot | None = None
        self._enrichers: list[Enricher] = []
        self._subscribers: list[Subscriber] = []

    def add_enricher(self, enricher: Enricher) -> None:
        """Run ``enricher`` on every snapshot before it is published (after those added before it)."""
        self._enrichers.append(enricher)

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call ``subscriber`` with every published snapshot; it must not block (schedule work instead)."""
        self._subscribers.append(subscriber)

    def latest(self) -> Snapshot | None:
        """The last published snapshot, or None before the first sweep."""
        return self._latest

    def publish(self, snapshot: Snapshot) -> Snapshot:
        """Enrich, swap in, notify; a failing enricher or subscriber is logged and skipped, never fatal."""
        for enricher in self._enrichers:
            try:
                snapshot = enricher(snapshot)
            except Exception:  # detect/plan bugs must not stop telemetry
                log.exception("snapshot enricher %r failed; publishing without it", enricher)
        self._latest = snapshot
        for subscriber in self._subscribers:
            try:
                subscriber(snapshot)
            except Exception:
                log.exception("snapshot subscriber %r failed", subscriber)
        return snapshot
