"""What the daemon's Slurm component tells: its log lines, its ``flexmig_slurm_*`` metrics and its MQTT events
(``slurm_unreachable``/``reachable``, ``slurm_plan``, ``slurm_job_*``, ``slurm_node``, ``slurm_carving``), from the
rounds its agents ran.

:class:`SlurmReporting` is a part of :class:`flexmig.wiring.slurm.SlurmComponent` (its base), kept apart so that
the component's module holds its lifecycle and its loop. Events go to whatever holds an event emitter as
``findings`` (:class:`FindingsOwner`: the MQTT component), so this module needs nothing of the wiring.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from flexmig.errors import SlurmError
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.mqtt.events import Event, EventFactory
from flexmig.mqtt.slurm_events import (
    CarvingNews,
    carving_event,
    job_event,
    node_event,
    plan_changes,
    plan_event,
    reachable_event,
    unreachable_event,
)
from flexmig.slurm.agent_read import SlurmRound, describe_error

__all__ = ["EventEmitter", "FindingsOwner", "SlurmReporting"]


class EventEmitter(Protocol):
    """Publishes one event of the daemon (the MQTT component's findings publisher)."""

    def emit(self, event: Event) -> None:
        """Store, count and log ``event``."""


class FindingsOwner(Protocol):
    """What the Slurm reporting needs of the MQTT component: its emitter of events."""

    @property
    def findings(self) -> EventEmitter:
        """The emitter events go to."""

log = logging.getLogger("flexmig.wiring.slurm")


class SlurmReporting:
    """The log lines, metrics and events of :class:`flexmig.wiring.slurm.SlurmComponent` (see the module
    docstring)."""

    node: str
    per_node: bool
    clock: Callable[[], float]
    factory: EventFactory
    mqtt: FindingsOwner | None
    slurm_metrics: SlurmMetrics
    _failing: str | None
    _failing_since: float
    _last_decision: dict[str, str]
    _carvings: CarvingNews
    _last_note: dict[str, str]
    _last_node_event: dict[str, tuple[str, str]]

    def _unreachable(self, exc: SlurmError) -> None:
        self.slurm_metrics.read_failed()
        text = str(exc)
        if self._failing != text:
            if self._failing is None:
                self._failing_since = self.clock()
            self._failing = text
            log.warning("%s", describe_error(exc))
            self._publish(unreachable_event(self.factory, self.node, text))

    def _reachable(self) -> None:
        if self._failing is None:
            return
        down = max(0.0, self.clock() - self._failing_since)
        self._failing = None
        log.info("Slurm answers again (after %.0f s)", down)
        self._publish(reachable_event(self.factory, self.node, down))

    def _account_reads(self, rounds: Sequence[SlurmRound]) -> None:
        """The gauges of what the round's reads showed (every GPU node's together)."""
        reads = [r.read for r in rounds if r.read is not None]
        if not reads:
            return
        registered: dict[str, int] = {}
        for read in reads:
            for profile, n in read.registered_as.items():
                registered[profile] = registered.get(profile, 0) + n
        self.slurm_metrics.read_ok(
            pending=len({j.job_id for read in reads for j in read.demand.pending_jobs}),
            running=sum(len(read.demand.running) for read in reads),
            movable=sum(len(read.demand.movable) for read in reads),
            in_sync=all(read.in_sync for read in reads),
            registered=registered,
        )

    def _account(self, node: str, rnd: SlurmRound, mode: str) -> None:
        read = rnd.read
        who = f"{node}: " if self.per_node else ""
        if rnd.note and rnd.note != self._last_note.get(node):
            log.info("Slurm: %s%s", who, rnd.note)
        self._last_note[node] = rnd.note

        if rnd.result is not None:
            for a in rnd.result.results:
                waited = dict(a.steps).get("await_idle")
                if waited is not None:
                    self.slurm_metrics.drained(waited)
                log.info(
                    "slurm_reregister #%d %s in %.2f s%s",
                    a.action_id,
                    a.outcome,
                    a.duration_s,
                    f": {a.error}" if a.error else "",
                )
        if rnd.carving is not None:
            self._carving_event(node, rnd, mode)
        v = rnd.verdict
        if v is None or read is None:
            return
        self.slurm_metrics.decided(node, drain_s=v.drain_s, gain=v.gain, cost=v.cost, go=v.go)
        changes = plan_changes(rnd.plan)
        if not changes:
            return
        signature = json.dumps([v.go, changes, list(v.newly_served)])
        if signature == self._last_decision.get(node) and rnd.result is None:
            return
        self._last_decision[node] = signature
        log.info("Slurm plan (%s): %s%s; changes: %s", mode, who, v.reason, ", ".join(changes))
        movable = [r.job.job_id for r in read.demand.movable]
        self._publish(plan_event(self.factory, node, mode, v, rnd.plan, checkpoint=movable))

    def _carving_event(self, node: str, rnd: SlurmRound, mode: str) -> None:
        """A ``slurm_carving`` event for the host round ``rnd``'s carving, when it is news."""
        report = rnd.carving
        assert report is not None
        if self._carvings.news(node, report, done=rnd.result is not None):
            self._publish(carving_event(self.factory, node, mode, report))

    def _job_event(self, kind: str, detail: dict[str, Any], node: str) -> None:
        """From the agent of ``node``: a Slurm job signalled, requeued or released, or (``slurm_node:WHAT``) a node
        event."""
        if kind.startswith("slurm_node:"):
            self._node_event(kind.split(":", 1)[1], detail, node)
            return
        action = kind.removeprefix("slurm_job_")
        self.slurm_metrics.job_action(action)
        step = detail.get("step")
        log.info("Slurm job %s %s%s", detail.get("slurm_job"), action, f" (checkpoint step {step})" if step else "")
        self._publish(job_event(self.factory, node, kind, detail))

    def _node_event(self, what: str, detail: dict[str, Any], node: str) -> None:
        """A ``slurm_node`` event (the same one twice in a row is published once: a node left alone stays so)."""
        key = (what, str(detail.get("reason", "")))
        if key == self._last_node_event.get(node) and what in ("left_alone", "refused"):
            return
        self._last_node_event[node] = key
        if what == "slurmd_restarted":
            self.slurm_metrics.slurmd_restarted()
        log.info("Slurm node %s: %s: %s", node, what, detail.get("reason", ""))
        self._publish(node_event(self.factory, node, what, detail))

    def _publish(self, event: Event) -> None:
        if self.mqtt is not None:
            self.mqtt.findings.emit(event)
