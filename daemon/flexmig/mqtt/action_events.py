"""The actuator's events (``flexmig.act.events.ActEvent``) as fleet events (``flexmig.mqtt.events.Event``).

The actuator reports what it does in its own terms: an action ID, the action's kind, the job, the steps' durations,
a free-form ``detail``. The fleet gets versioned events on ``<prefix>/<node>/events/<kind>`` whose payloads
``schemas/event.v1.schema.json`` pins down. :class:`ActionEventTranslator` maps one onto the other, adding what a
consumer needs and the actuator's event does not carry: the action's target (``job train`` or
``gpu0:1g.18gb@3``), its plan and origin, and for moves the job's downtime, looked up in the journal through the
:class:`ActionLookup` it is given. :func:`plan_event` makes the ``plan_proposed`` event of a plan (mode advise,
or act before executing it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from flexmig.act.events import ActEvent
from flexmig.mqtt.events import Event, EventFactory, EventKind
from flexmig.plan.types import CreateInstance, DestroyInstance, MigrateJob, Plan, ResplitJob, StartJob

__all__ = ["ActionEventTranslator", "ActionFacts", "ActionLookup", "plan_actions", "plan_event", "plan_summary"]

_ACTION_KINDS = {
    "action_started": EventKind.ACTION_STARTED,
    "action_completed": EventKind.ACTION_COMPLETED,
    "action_failed": EventKind.ACTION_FAILED,
    "action_cancelled": EventKind.ACTION_CANCELLED,
    "action_skipped": EventKind.ACTION_SKIPPED,
}


@dataclass(frozen=True, slots=True)
class ActionFacts:
    """What the journal knows about one action beyond the actuator's event."""

    plan_id: int | None = None
    origin: str | None = None
    target: str | None = None  # "gpu0:1g.18gb@3" for instance actions
    downtime_s: float | None = None  # moves: old ranks exited -> new ranks started


class ActionLookup(Protocol):
    """Finds :class:`ActionFacts` for an action ID (the daemon reads its journal)."""

    def __call__(self, action_id: int) -> ActionFacts:
        """Facts about action ``action_id``; an empty :class:`ActionFacts` when it is unknown."""
        ...


def _no_facts(action_id: int) -> ActionFacts:
    return ActionFacts()


def _target(event: ActEvent, facts: ActionFacts) -> str:
    if facts.target:
        return facts.target
    if event.job:
        return f"job {event.job}"
    return event.action or "node"


class ActionEventTranslator:
    """Turns actuator events into fleet events for one node (``factory``), looking facts up with ``lookup``."""

    def __init__(self, factory: EventFactory, lookup: ActionLookup = _no_facts) -> None:
        self.factory = factory
        self.lookup = lookup

    def __call__(self, event: ActEvent, *, mode: str = "act") -> Event | None:
        """The fleet event for ``event`` (at the actuator's time), or None for a kind the fleet does not get."""
        kind = _ACTION_KINDS.get(event.kind)
        if kind is not None:
            return self.factory.make(kind, self._action_payload(kind, event), event.time_s)
        if event.kind == "job_started":
            return self.factory.make(EventKind.JOB_STARTED, _job_started(event), event.time_s)
        if event.kind == "job_exited":
            return self.factory.make(EventKind.JOB_EXITED, _job_exited(event), event.time_s)
        if event.kind == "job_failed":
            payload = {"job": event.job or "?", "error": event.error or "failed (no reason given)"}
            return self.factory.make(EventKind.JOB_FAILED, payload, event.time_s)
        if event.kind == "reconciled":
            return self.factory.make(EventKind.RECONCILED, _reconciled(event.detail, mode), event.time_s)
        return None

    def _action_payload(self, kind: EventKind, event: ActEvent) -> dict[str, Any]:
        action_id = event.action_id if event.action_id is not None else 0
        facts = self.lookup(action_id) if event.action_id is not None else ActionFacts()
        action = event.action or "unknown"
        out: dict[str, Any] = {
            "action_id": str(action_id),
            "action": action,
            "target": _target(event, facts),
            "job": event.job,
        }
        if facts.plan_id is not None:
            out["plan_id"] = facts.plan_id
        if facts.origin:
            out["origin"] = facts.origin
        if kind is EventKind.ACTION_STARTED:
            out["reason"] = event.reason or f"{action} asked by {facts.origin or 'an operator'}"
            out["resumed"] = bool(event.detail.get("resumed", False))
            return out
        if kind is EventKind.ACTION_SKIPPED:
            out["reason"] = event.error or "an earlier action of its plan did not complete"
            return out
        out["duration_s"] = round(max(0.0, event.duration_s or 0.0), 6)
        out["steps"] = [{"step": n, "duration_s": round(max(0.0, d), 6)} for n, d in event.steps]
        if facts.downtime_s is not None:
            out["downtime_s"] = round(facts.downtime_s, 6)
        if kind is not EventKind.ACTION_COMPLETED:
            out["error"] = event.error or f"{action} did not complete (no reason given)"
        return out


def _job_started(event: ActEvent) -> dict[str, Any]:
    d = event.detail
    pids = d.get("pids") or {}
    resume = d.get("resume_step")
    gen = int(d.get("generation", 0))
    where = ", ".join(str(i) for i in d.get("instances", ()))
    return {
        "job": event.job or "?",
        "generation": gen,
        "instances": [str(i) for i in d.get("instances", ())],
        "pids": {str(k): int(v) for k, v in pids.items()},
        "resume_step": None if resume is None else int(resume),
        "reason": f"generation {gen} on {where or 'no instance'}" + _how_started(d, resume),
    }


def _how_started(detail: Mapping[str, Any], resume: object) -> str:
    """How a generation's ranks started: as standby ranks (they wait for a move's checkpoint), resuming, afresh."""
    if detail.get("standby"):
        return ", standby ranks waiting for the checkpoint to resume from"
    if resume is not None:
        return f", resuming after step {resume}" + (" (standby ranks handed over)" if detail.get("handed_over") else "")
    return ", first start"


def _job_exited(event: ActEvent) -> dict[str, Any]:
    d = event.detail
    out: dict[str, Any] = {"job": event.job or "?"}
    for key in ("slot", "pid", "generation"):
        if isinstance(d.get(key), int):
            out[key] = d[key]
    if "exit_code" in d:
        code = d["exit_code"]
        out["exit_code"] = code if isinstance(code, int) else None
    if d.get("state") == "done":
        out["state"] = "done"
        out["reason"] = f"every rank of job {out['job']} exited 0: the job is done"
    else:
        code = out.get("exit_code")
        status = "an unknown status" if code is None else f"status {code}"
        out["reason"] = f"rank {out.get('slot', '?')} of job {out['job']} exited with {status}"
    return out


def _pid_lists(value: Any) -> dict[str, list[int]]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): [int(p) for p in v if isinstance(p, int)] for k, v in value.items() if isinstance(v, list)}


def _reconciled(detail: Mapping[str, Any], mode: str) -> dict[str, Any]:
    adopted = _pid_lists(detail.get("adopted"))
    plans = detail.get("plans") if isinstance(detail.get("plans"), list) else []
    settled = [str(s) for s in detail.get("settled", ()) if isinstance(s, str)]
    ranks = sum(len(v) for v in adopted.values())
    unknown = _unknown_ranks(detail.get("unknown_ranks"))
    reason = (
        f"journal reconciled in mode {mode}: {ranks} running rank(s) of {len(adopted)} job(s) adopted, "
        f"{len(plans or [])} unfinished plan(s) run to their end, {len(settled)} job(s) settled"
    )
    if unknown:
        reason += f"; {len(unknown)} rank(s) of no journalled job run on this node's instances (left alone)"
    out: dict[str, Any] = {
        "adopted": adopted,
        "killed_stale": _pid_lists(detail.get("killed_stale")),
        "resumed_plans": len(plans or []),
        "settled": settled,
        "mode": mode,
        "reason": reason,
    }
    if unknown:
        out["unknown_ranks"] = unknown
    return out


def _unknown_ranks(value: Any) -> list[dict[str, Any]]:
    """The reconciliation's ranks of no journalled job, as the event schema has them."""
    if not isinstance(value, list):
        return []
    out = []
    for r in value:
        if isinstance(r, Mapping) and isinstance(r.get("pid"), int):
            out.append(
                {
                    "pid": int(r["pid"]),
                    "job": str(r.get("job") or ""),
                    "job_id": str(r.get("job_id") or ""),
                    "instance": str(r.get("instance") or ""),
                    "user": str(r.get("user") or ""),
                }
            )
    return out


# ------------------------------------------------------------------------------------------------- plans


def plan_actions(plan: Plan) -> list[dict[str, Any]]:
    """Each action of ``plan`` as JSON: kind (the journal's names), job, target, from/to, reason, estimated cost."""
    out: list[dict[str, Any]] = []
    for a in plan.actions:
        item: dict[str, Any]
        if isinstance(a, CreateInstance | DestroyInstance):
            kind = "create_instance" if isinstance(a, CreateInstance) else "destroy_instance"
            item = {"action": kind, "job": None, "target": f"gpu{a.gpu}:{a.profile.name}@{a.start}"}
        elif isinstance(a, StartJob):
            item = {"action": "start", "job": a.job, "target": f"job {a.job}", "to": [i.spec() for i in a.instances]}
        elif isinstance(a, MigrateJob):
            item = {
                "action": "migrate",
                "job": a.job,
                "target": f"job {a.job}",
                "from": [i.spec() for i in a.from_instances],
                "to": [i.spec() for i in a.to_instances],
            }
        else:
            assert isinstance(a, ResplitJob)
            item = {
                "action": "resplit",
                "job": a.job,
                "target": f"job {a.job}",
                "from": [i.spec() for i in a.from_instances],
                "to": [i.spec() for i in a.to_instances],
                "ranks": a.ranks,
            }
        item["reason"] = a.reason or item["action"]
        item["cost_s"] = round(max(0.0, a.cost_s), 6)
        out.append(item)
    return out


def plan_summary(plan: Plan) -> str:
    """One line: how many actions of which kinds, and their estimated cost."""
    kinds: dict[str, int] = {}
    for item in plan_actions(plan):
        kinds[item["action"]] = kinds.get(item["action"], 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
    return f"{len(plan.actions)} action(s) ({parts}), estimated {plan.cost_s:.1f} s"


def plan_event(factory: EventFactory, plan: Plan, mode: str, at: float | None = None) -> Event:
    """The ``plan_proposed`` event of a non-empty ``plan`` (advise: published only; act: about to run)."""
    payload = {
        "mode": mode,
        "actions": plan_actions(plan),
        "notes": list(plan.notes),
        "cost_s": round(max(0.0, plan.cost_s), 6),
        "reason": plan_summary(plan),
    }
    return factory.make(EventKind.PLAN_PROPOSED, payload, at)
