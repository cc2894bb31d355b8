"""Prometheus families of the daemon's own health: its background tasks, its metrics server, its journal's writes.

* ``flexmig_task_restarts_total{Hostname, task}``: restarts of a restartable loop (mqtt, dcgm, the workload) after
  it failed; a loop past its restart budget stops the daemon instead;
* ``flexmig_metrics_connections``, ``flexmig_metrics_connection_limit`` and the ``_evicted``/``_refused``/
  ``_timed_out`` counters of the metrics server (:mod:`flexmig.metrics.server`): what a hostile client costs;
* ``flexmig_journal_write_waiting`` (1 while an action waits for the journal's storage, a full disk) and the
  retries and stalls counted since start (:mod:`flexmig.act.durable`).

Each reads counters the daemon keeps in memory: no I/O in a scrape. The families come from the catalogue
(:mod:`flexmig.metrics.families`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import Metric

from flexmig.act.durable import Durable
from flexmig.metrics.families import by_name
from flexmig.metrics.server import ServerStats
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["JournalWriteMetrics", "ServerMetrics", "TaskMetrics"]


class TaskMetrics:
    """``flexmig_task_restarts_total{task}``, from the daemon's count of restarts by task name."""

    def __init__(self, restarts: Mapping[str, int]) -> None:
        self._restarts = restarts

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        family = by_name("flexmig_task_restarts").counter()
        for task, count in sorted(self._restarts.items()):
            family.add_metric([snapshot.hostname, task], float(count))
        yield family


class ServerMetrics:
    """The metrics server's open connections and cap, and what it cut off at the cap or on time."""

    def __init__(self, stats: Callable[[], ServerStats]) -> None:
        self._stats = stats

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        st, host = self._stats(), [snapshot.hostname]
        for name, value in (("flexmig_metrics_connections", st.open), ("flexmig_metrics_connection_limit", st.limit)):
            gauge = by_name(name).gauge()
            gauge.add_metric(host, float(value))
            yield gauge
        for name, value in (
            ("flexmig_metrics_connections_evicted", st.evicted),
            ("flexmig_metrics_connections_refused", st.refused),
            ("flexmig_metrics_connections_timed_out", st.timed_out),
        ):
            counter = by_name(name).counter()
            counter.add_metric(host, float(value))
            yield counter


class JournalWriteMetrics:
    """How the journal's writes fare; ``durable()`` is the running actuator's (None before it runs: zeros)."""

    def __init__(self, durable: Callable[[], Durable | None]) -> None:
        self._durable = durable

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        d, host = self._durable(), [snapshot.hostname]
        waiting = by_name("flexmig_journal_write_waiting").gauge()
        waiting.add_metric(host, 1.0 if d is not None and d.stalled is not None else 0.0)
        yield waiting
        for name, value in (
            ("flexmig_journal_write_retries", d.retries if d else 0),
            ("flexmig_journal_write_stalls", d.stalls if d else 0),
        ):
            counter = by_name(name).counter()
            counter.add_metric(host, float(value))
            yield counter
