"""Prometheus families of what the daemon lost or found broken, so that no loss is silent.

* ``flexmig_events_dropped_total{Hostname, reason}``: events that will never reach the broker, by why:
  ``outbox_full`` (past ``mqtt.outbox_max_bytes``, oldest first), ``outbox_unwritable`` (the disk refused them and
  the in-memory buffer for such events was full), ``outbox_corrupt`` (on unreadable pages of a corrupt outbox,
  counted by their sequence numbers); every reason present from the start at 0;
* ``flexmig_outbox_corruptions_total{Hostname}``: outbox files found corrupt, moved aside and replaced;
* ``flexmig_mqtt_command_results_dropped_total{Hostname}``: MQTT command results dropped unsent (more than the
  listener keeps were waiting for the broker);
* ``flexmig_unknown_ranks{Hostname}``: processes carrying flexmig's job markers (``FLEXMIG_JOB_ID``) on this node's
  MIG instances that no journalled job accounts for (a lost or replaced journal, another daemon's jobs), and
  processes of a journalled job (its markers, or its cgroup) that none of its running ranks accounts for.

Each family is exported only when its source exists (MQTT on, commands on, the actuator running). Reads counters
the event loop keeps; no I/O in a scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import Metric

from flexmig.metrics.families import by_name
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["DROP_REASONS", "LossMetrics"]

DROP_REASONS: tuple[str, ...] = ("outbox_full", "outbox_unwritable", "outbox_corrupt")
"""Values of ``flexmig_events_dropped_total``'s ``reason`` label."""


class PublisherLosses(Protocol):
    """What is read of the publisher's stats (``MqttPublisher.stats()``)."""

    @property
    def dropped_total(self) -> int:
        """Events the full outbox dropped."""
        ...

    @property
    def unsaved_dropped_total(self) -> int:
        """Events the disk refused and memory could not keep."""
        ...

    @property
    def outbox_corruptions_total(self) -> int:
        """Corrupt outbox files replaced."""
        ...

    @property
    def outbox_lost_total(self) -> int:
        """Events lost with corrupt pages."""
        ...


class CommandLosses(Protocol):
    """What is read of the command listener's stats (``CommandListener.stats()``)."""

    @property
    def results_dropped(self) -> int:
        """Results dropped unsent."""
        ...


class LossMetrics:
    """The families above, from whichever sources this daemon has (None: that source is off)."""

    def __init__(
        self,
        publisher: Callable[[], PublisherLosses] | None = None,
        commands: Callable[[], CommandLosses] | None = None,
        unknown_ranks: Callable[[], int | None] | None = None,
    ) -> None:
        self._publisher = publisher
        self._commands = commands
        self._unknown = unknown_ranks

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        """The families, labelled with the node's ``Hostname``."""
        host = [snapshot.hostname]
        if self._publisher is not None:
            s = self._publisher()
            c = by_name("flexmig_events_dropped").counter()
            for reason, value in zip(
                DROP_REASONS, (s.dropped_total, s.unsaved_dropped_total, s.outbox_lost_total), strict=True
            ):
                c.add_metric([*host, reason], value)
            yield c
            c = by_name("flexmig_outbox_corruptions").counter()
            c.add_metric(host, s.outbox_corruptions_total)
            yield c
        if self._commands is not None:
            c = by_name("flexmig_mqtt_command_results_dropped").counter()
            c.add_metric(host, self._commands().results_dropped)
            yield c
        if self._unknown is not None:
            n = self._unknown()
            if n is not None:
                g = by_name("flexmig_unknown_ranks").gauge()
                g.add_metric(host, n)
                yield g
