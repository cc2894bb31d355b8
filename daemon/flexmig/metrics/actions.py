"""Prometheus families for the actuator's actions, the jobs it runs, and the planner's rounds.

Names, types, labels and help texts come from :mod:`flexmig.metrics.families` (the dashboards and alert rules read
the same names):

* ``flexmig_actions_total{Hostname, action, outcome}``: actions finished; every known action and outcome is
  present from the start at 0, so a panel or an ``increase()`` has a series before the first action;
* ``flexmig_action_duration_seconds{Hostname, action}`` (histogram): first journalled step to last;
* ``flexmig_move_pause_seconds{Hostname, action}`` (histogram, migrate and resplit): flexmig's share of a move's
  pause, the job's old ranks exited to its new ranks started; both histograms have a series per action once that
  action has run;
* ``flexmig_job_downtime_seconds{Hostname, action}`` (histogram, migrate and resplit): the job's own downtime, its
  last step before the checkpoint to its first step after the move, once a moved job reported it
  (:mod:`flexmig.service.first_step`);
* ``flexmig_actions_in_progress{Hostname}``: 1 while an action executes (they run one at a time);
* ``flexmig_jobs{Hostname, state}``: registered jobs by state, every state present;
* ``flexmig_planner_runs_total{Hostname}``, ``flexmig_planner_failures_total{Hostname}``,
  ``flexmig_planned_actions{Hostname, action}`` (what the last plan proposes, by kind) and
  ``flexmig_plan_cost_seconds{Hostname}`` (its estimated cost): the planner in modes advise and act.

:class:`ActionMetrics` is fed on the event loop (actuator events, job counts, plans) and read by the scrape thread,
so its state sits behind a lock and a scrape copies it; nothing here does I/O.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from flexmig.act.events import ActEvent
from flexmig.act.records import JOB_STATES
from flexmig.metrics.families import by_name
from flexmig.telemetry.snapshot import Snapshot

__all__ = [
    "ACTIONS",
    "DOWNTIME_BUCKETS_S",
    "DURATION_BUCKETS_S",
    "OUTCOMES",
    "PLANNED_ACTIONS",
    "ActionMetrics",
    "Histogram",
]

ACTIONS: tuple[str, ...] = ("migrate", "resplit", "start", "stop", "create_instance", "destroy_instance", "restart")
"""Values of the ``action`` label (the journal's action kinds)."""
OUTCOMES: tuple[str, ...] = ("completed", "failed", "cancelled", "skipped")
"""Values of the ``outcome`` label."""
MOVES: tuple[str, ...] = ("migrate", "resplit")
"""Actions that stop a job and start it elsewhere: the ones with a downtime."""
PLANNED_ACTIONS: tuple[str, ...] = ("create_instance", "destroy_instance", "start", "migrate", "resplit")
"""Action kinds a planner's plan holds."""
DURATION_BUCKETS_S: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
DOWNTIME_BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

_TERMINAL = {
    "action_completed": "completed",
    "action_failed": "failed",
    "action_cancelled": "cancelled",
    "action_skipped": "skipped",
}


@dataclass(slots=True)
class Histogram:
    """A fixed-bucket histogram (non-cumulative counts per bucket, plus +Inf), its sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs, ``+Inf`` last, as the exposition wants them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
        return out

    def copy(self) -> Histogram:
        """An independent copy."""
        return Histogram(self.bounds, list(self.counts), self.total)


class ActionMetrics:
    """The action, job and planner families, fed by :meth:`record`, :meth:`set_jobs` and :meth:`record_plan`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._actions: Counter[tuple[str, str]] = Counter()
        # Histograms appear per action once it has been observed: a quantile or a mean of an action that never
        # ran would only be NaN on a dashboard.
        self._durations: dict[str, Histogram] = {}
        self._downtimes: dict[str, Histogram] = {}
        self._pauses: dict[str, Histogram] = {}
        self._running: set[int] = set()
        self._jobs: dict[str, int] = dict.fromkeys(JOB_STATES, 0)
        self._planner_runs = 0
        self._planner_failures = 0
        self._planned: dict[str, int] = dict.fromkeys(PLANNED_ACTIONS, 0)
        self._plan_cost_s: float | None = None

    # ------------------------------------------------------------------------------------------ feeding
    def record(self, event: ActEvent, pause_s: float | None = None) -> None:
        """Count an actuator event: an action starting or ending (with flexmig's share of its pause, for moves)."""
        with self._lock:
            if event.kind == "action_started" and event.action_id is not None:
                self._running.add(event.action_id)
                return
            outcome = _TERMINAL.get(event.kind)
            if outcome is None or event.action is None:
                return
            if event.action_id is not None:
                self._running.discard(event.action_id)
            self._actions[(event.action, outcome)] += 1
            if outcome != "skipped" and event.duration_s is not None:
                hist = self._durations.setdefault(event.action, Histogram(DURATION_BUCKETS_S))
                hist.observe(max(0.0, event.duration_s))
            if pause_s is not None and event.action in MOVES:
                hist = self._pauses.setdefault(event.action, Histogram(DOWNTIME_BUCKETS_S))
                hist.observe(max(0.0, pause_s))

    def record_job_downtime(self, action: str, downtime_s: float) -> None:
        """A moved job's own downtime, as it reported it (its last step before the move to its first after)."""
        with self._lock:
            hist = self._downtimes.setdefault(action, Histogram(DOWNTIME_BUCKETS_S))
            hist.observe(max(0.0, downtime_s))

    def set_jobs(self, counts: Mapping[str, int]) -> None:
        """Registered jobs by state (every known state is exported; missing ones as 0)."""
        with self._lock:
            self._jobs = {**dict.fromkeys(JOB_STATES, 0), **counts}

    def record_plan(self, actions: Sequence[str], cost_s: float) -> None:
        """One planning round and its plan (the action kinds it proposes, its estimated cost)."""
        with self._lock:
            self._planner_runs += 1
            self._planned = dict.fromkeys(PLANNED_ACTIONS, 0)
            for a in actions:
                self._planned[a] = self._planned.get(a, 0) + 1
            self._plan_cost_s = cost_s

    def record_plan_failure(self) -> None:
        """A planning round that failed (a bug or an unreadable node; logged by the caller)."""
        with self._lock:
            self._planner_runs += 1
            self._planner_failures += 1

    def in_progress(self) -> int:
        """Actions started and not finished."""
        with self._lock:
            return len(self._running)

    # ------------------------------------------------------------------------------------------ scraping
    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        """Every family, labelled with the snapshot's host."""
        with self._lock:
            actions = Counter(self._actions)
            durations = {a: h.copy() for a, h in self._durations.items()}
            downtimes = {a: h.copy() for a, h in self._downtimes.items()}
            pauses = {a: h.copy() for a, h in self._pauses.items()}
            running = len(self._running)
            jobs = dict(self._jobs)
            runs, failures = self._planner_runs, self._planner_failures
            planned = dict(self._planned)
            cost = self._plan_cost_s
        host = snapshot.hostname
        c = by_name("flexmig_actions").counter()
        kinds = (*ACTIONS, *sorted({a for a, _ in actions} - set(ACTIONS)))
        for action in kinds:
            for outcome in OUTCOMES:
                c.add_metric([host, action, outcome], actions[(action, outcome)])
        yield c
        h = by_name("flexmig_action_duration_seconds").histogram()
        for action, hist in durations.items():
            h.add_metric([host, action], hist.cumulative(), hist.total)
        yield h
        d = by_name("flexmig_job_downtime_seconds").histogram()
        for action, hist in downtimes.items():
            d.add_metric([host, action], hist.cumulative(), hist.total)
        yield d
        m = by_name("flexmig_move_pause_seconds").histogram()
        for action, hist in pauses.items():
            m.add_metric([host, action], hist.cumulative(), hist.total)
        yield m
        g = by_name("flexmig_actions_in_progress").gauge()
        g.add_metric([host], running)
        yield g
        j = by_name("flexmig_jobs").gauge()
        for state, n in jobs.items():
            j.add_metric([host, state], n)
        yield j
        r = by_name("flexmig_planner_runs").counter()
        r.add_metric([host], runs)
        yield r
        f = by_name("flexmig_planner_failures").counter()
        f.add_metric([host], failures)
        yield f
        p = by_name("flexmig_planned_actions").gauge()
        for action, n in planned.items():
            p.add_metric([host, action], n)
        yield p
        if cost is not None:
            e = by_name("flexmig_plan_cost_seconds").gauge()
            e.add_metric([host], cost)
            yield e
