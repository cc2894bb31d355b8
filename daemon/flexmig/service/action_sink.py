"""The actuator's event sink in the running daemon: action metrics, the jobs' own downtime, the instances the demo
workload must leave alone, a log line and the fleet event of each action.

Actions and plans reach the fleet as events (:mod:`flexmig.mqtt.action_events`, through the MQTT publisher when
``[mqtt]`` is on) and Prometheus as :mod:`flexmig.metrics.actions`. Every action is also one log line.

The simulated node's demo workload (``flexmigd --sim``) never runs on an instance that a job holds or that an action
has touched since start (:attr:`ActionSink.workload_exclude`): its synthetic processes belong to no registered job, so
on those instances they would stop the actuator (it never destroys or moves onto an instance running a process it
cannot account for).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flexmig.act.events import ActEvent
from flexmig.act.mode import RuntimeMode
from flexmig.act.service import Actuator
from flexmig.metrics.actions import ActionMetrics
from flexmig.mqtt.action_events import ActionEventTranslator, ActionFacts
from flexmig.mqtt.events import Event, EventFactory
from flexmig.service.action_record import (
    action_facts,
    action_row,
    log_event,
    move_downtime,
    reconciled_nothing,
    slots_of,
)
from flexmig.service.first_step import FirstSteps

__all__ = ["ActionSink"]

log = logging.getLogger(__name__)

_RESCAN = frozenset({"stop", "migrate", "resplit", "restart"})  # after these, look for ranks of no job again


class ActionSink:
    """Turns one actuator's events into metrics, log lines and fleet events (an ``EventSink``)."""

    def __init__(
        self,
        act: Actuator,
        *,
        mode: RuntimeMode,
        metrics: ActionMetrics,
        first_steps: FirstSteps,
        factory: EventFactory,
        fleet: Callable[[Event], None],
        wake: Callable[[], None],
        rescan: Callable[[], None],
    ) -> None:
        self.act = act
        self.mode = mode
        self.metrics = metrics
        self.first_steps = first_steps
        """Moves whose job has yet to report its first step (the job's own downtime)."""
        self.fleet = fleet
        self.wake = wake
        self.rescan = rescan
        self.translate = ActionEventTranslator(factory, self._facts)
        self.workload_exclude: frozenset[tuple[int, int]] = frozenset()
        """Instances the simulator's demo workload must leave alone: held by a job or touched by an action."""
        self._touched: set[tuple[int, int]] = set()
        self._refreshed_at: tuple[int, int] | None = None  # the journal's stamp at the last refresh
        self._refreshed_touched: set[tuple[int, int]] = set()

    def remember_running(self) -> None:
        """Count the instances of the jobs the journal says run as touched (at start, before reconciling)."""
        for rec in self.act.journal.jobs_in("running"):
            self._touched.update(s.key for s in rec.slots)

    def emit(self, event: ActEvent) -> None:
        """One event of the actuator: metrics, the demo workload's exclusions, a log line, the fleet event."""
        row = action_row(self.act.journal, event.action_id)
        if event.kind == "action_started" and row is not None:
            self._touched.update(slots_of(row))
        downtime = None
        ended = event.kind in ("action_completed", "action_failed") and row is not None
        if ended and row is not None and row.kind in _RESCAN:
            self.rescan()
        if ended and row is not None and row.kind in ("migrate", "resplit"):
            downtime = move_downtime(self.act.journal, event.action_id)
            if event.kind == "action_completed" and row.job is not None and event.action_id is not None:
                self._expect_first_step(row.job, row.kind, event.action_id, downtime)
        self.metrics.record(event, downtime)
        self.refresh()
        fleet = self.translate(event, mode=self.mode.value)
        if fleet is not None:
            log_event(fleet)
            if not reconciled_nothing(event):
                self.fleet(fleet)
        if event.kind in ("job_failed",) or (event.kind == "job_exited" and event.detail.get("state") == "done"):
            self.wake()
        if event.kind == "action_completed" and event.action == "stop":
            self.wake()

    def _expect_first_step(self, job: str, action: str, action_id: int, pause_s: float | None) -> None:
        """After a completed move: wait for the job's first-step report, if its acknowledgement said when its last
        step before the move ended (a hook that says nothing gets no job-side figure)."""
        if self.first_steps.waiting():
            # The job's report of its previous move may be there already (a move right after a move, before the
            # next sweep read it): take it before this move's wait replaces that one.
            self._report_first_steps()
        rec = self.act.journal.get_job(job)
        if rec is None or rec.state != "running" or rec.last_ack is None:
            return
        if rec.last_ack.step_done_s is None:
            self.first_steps.forget(job)
            return
        self.first_steps.expect(
            job,
            action=action,
            action_id=action_id,
            generation=rec.generation,
            step_done_s=rec.last_ack.step_done_s,
            pause_s=pause_s,
            ack_path=self.act.supervisor.acks.path(rec),
        )

    def _report_first_steps(self) -> None:
        """The moved jobs that reported their first step: their own downtime, exported and logged beside
        flexmig's share."""
        for r in self.first_steps.poll():
            self.metrics.record_job_downtime(r.action, r.downtime_s)
            share = "unknown" if r.pause_s is None else f"{r.pause_s:.2f} s"
            log.info(
                "job_resumed job %s generation %d after %s #%d: job downtime %.2f s (its last step before the "
                "checkpoint to its first step after the move; flexmig's share %s)",
                r.job, r.generation, r.action, r.action_id, r.downtime_s, share,
            )  # fmt: skip

    def _facts(self, action_id: int) -> ActionFacts:
        """What the fleet event of ``action_id`` says beyond the actuator's event (plan, origin, target, downtime)."""
        return action_facts(self.act.journal, action_id)

    def refresh(self) -> None:
        """Job counts for the metrics, and the instances the demo workload must leave alone (at every sweep)."""
        if self.first_steps.waiting():
            self._report_first_steps()
        journal = self.act.journal  # runs at every sweep: read again only when the journal may have changed
        stamp = journal.stamp()
        if stamp == self._refreshed_at and self._touched == self._refreshed_touched:
            return
        self.metrics.set_jobs(journal.job_counts())
        held = {s.key for rec in journal.jobs_in("running") for s in rec.slots}
        self.workload_exclude = frozenset(self._touched | held)
        self._refreshed_at, self._refreshed_touched = stamp, set(self._touched)
