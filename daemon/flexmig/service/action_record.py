"""What the running daemon tells about one journalled action: its facts for the fleet event, a move's downtime,
the slots it touches, its line in ``flexmig status`` and its log line.

Read from the actuator's journal only, so that an event says what the journal will say after a restart.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from flexmig.act.encoding import CreateInstancePayload, DestroyInstancePayload, payload_of, reason_of, slots_named
from flexmig.act.events import ActEvent
from flexmig.act.journal import ActionRow, Journal
from flexmig.errors import FlexmigError, JournalError
from flexmig.mqtt.action_events import ActionFacts
from flexmig.mqtt.events import Event, EventKind

__all__ = [
    "action_facts",
    "action_json",
    "action_row",
    "log_event",
    "move_downtime",
    "reconciled_nothing",
    "slots_of",
]

log = logging.getLogger("flexmig.wiring.actuator")  # the actuator's log lines keep their logger name


def action_row(journal: Journal, action_id: int | None) -> ActionRow | None:
    """The journal's row of ``action_id``; None when there is none or the journal cannot be read."""
    if action_id is None:
        return None
    try:
        return journal.action(action_id)
    except FlexmigError:
        return None


def action_facts(journal: Journal, action_id: int) -> ActionFacts:
    """The plan, its origin, the target and (for a move) the downtime of ``action_id``, as far as the journal knows."""
    row = action_row(journal, action_id)
    if row is None:
        return ActionFacts()
    origin = None
    with contextlib.suppress(Exception):
        found = journal.db.execute("SELECT origin FROM plans WHERE id=?", (row.plan_id,)).fetchone()
        origin = str(found[0]) if found else None
    target = None
    with contextlib.suppress(JournalError):
        p = payload_of(row)
        if isinstance(p, CreateInstancePayload | DestroyInstancePayload):
            target = p.slot.spec()
    if row.kind == "slurm_reregister" and isinstance(row.payload.get("node"), str):
        target = f"slurm node {row.payload['node']}"
    downtime = move_downtime(journal, action_id) if row.kind in ("migrate", "resplit") else None
    return ActionFacts(plan_id=row.plan_id, origin=origin, target=target, downtime_s=downtime)


def move_downtime(journal: Journal, action_id: int | None) -> float | None:
    """flexmig's share of a move's pause: its old ranks had exited (``await_exit`` done) to its new ranks started.
    The job's own downtime is longer (its save, start-up, load and first step): :mod:`flexmig.service.first_step`."""
    if action_id is None:
        return None
    steps = {s.name: s for s in journal.steps(action_id)}
    stopped = steps.get("await_exit")
    launch = steps.get("launch")
    started = launch if launch is not None and launch.state == "done" else steps.get("relaunch")
    if stopped is None or started is None or stopped.finished_s is None or started.finished_s is None:
        return None
    if started.state != "done":
        return None
    return max(0.0, started.finished_s - stopped.finished_s)


def reconciled_nothing(event: ActEvent) -> bool:
    """A start-up reconciliation that found no job, rank or action to take care of: not news for the fleet."""
    if event.kind != "reconciled":
        return False
    d = event.detail
    return not any(d.get(k) for k in ("adopted", "killed_stale", "plans", "settled", "unknown_ranks"))


def slots_of(row: ActionRow) -> set[tuple[int, int]]:
    """The (GPU, start) slots an action names; none when its payload cannot be read."""
    try:
        return {s.key for s in slots_named(payload_of(row))}
    except JournalError:
        return set()


def action_json(row: ActionRow) -> dict[str, Any]:
    """An action as ``flexmig status`` lists it."""
    return {
        "action_id": row.id,
        "plan_id": row.plan_id,
        "action": row.kind,
        "job": row.job,
        "state": row.state,
        "error": row.error,
        "started_s": row.started_s,
        "finished_s": row.finished_s,
        "reason": reason_of(row),
    }


def log_event(event: Event) -> None:
    """One journal line per actuator event: kind, action ID, target, and the reason or error with timings."""
    p = event.payload
    level = logging.WARNING if event.kind in (EventKind.ACTION_FAILED, EventKind.JOB_FAILED) else logging.INFO
    head = event.kind.value
    if "action_id" in p:
        head += f" #{p['action_id']} {p.get('action')} {p.get('target')}"
    elif "job" in p:
        head += f" job {p['job']}"
    timing = ""
    if "duration_s" in p:
        timing = f" in {p['duration_s']:.2f} s"
        if "downtime_s" in p:
            timing += f" (flexmig's share of the pause {p['downtime_s']:.2f} s; the job's downtime: job_resumed)"
    why = p.get("error") or p.get("reason") or ""
    log.log(level, "%s%s%s", head, timing, f": {why}" if why else "")
