"""The fleet events of flexmig's Slurm side, built in one place so the daemon and the schema's tests make the same.

* ``slurm_unreachable`` (Slurm started failing, or fails differently) and ``slurm_reachable`` (it answers again,
  after ``down_s``);
* ``slurm_plan``: a new re-registration decision, go or not, with its figures and the instance changes;
* ``slurm_job_signalled`` / ``slurm_job_requeued`` / ``slurm_job_released``: a hook job's checkpoint-and-requeue;
* ``slurm_node``: what flexmig did about the node itself (``what``: slurmd restarted, a change waiting in flexmig's
  reservation or abandoned, a hook job that missed its acknowledgement), or why it left it alone (an administrator's
  drain, down or reservation; an unsupported setup).

The re-registration itself is an action: ``action_started``/``action_completed``/... with
``action = slurm_reregister``. Pure: the factory brings the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flexmig.mqtt.events import Event, EventFactory, EventKind
from flexmig.plan.reregistration import Verdict
from flexmig.plan.types import CreateInstance, DestroyInstance, Plan

__all__ = [
    "NODE_WHATS",
    "job_event",
    "node_event",
    "plan_changes",
    "plan_event",
    "reachable_event",
    "unreachable_event",
]

NODE_WHATS = frozenset(
    {"slurmd_restarted", "left_alone", "change_waiting", "change_abandoned", "ack_missed", "refused"}
)
"""The ``what`` of a ``slurm_node`` event."""

_JOB_KINDS = {
    "slurm_job_signalled": EventKind.SLURM_JOB_SIGNALLED,
    "slurm_job_requeued": EventKind.SLURM_JOB_REQUEUED,
    "slurm_job_released": EventKind.SLURM_JOB_RELEASED,
}


def unreachable_event(factory: EventFactory, node: str, error: str) -> Event:
    """Slurm cannot be read (``error``: what the failing command said)."""
    return factory.make(EventKind.SLURM_UNREACHABLE, {"node": node, "error": error[:500] or "unknown error"})


def reachable_event(factory: EventFactory, node: str, down_s: float) -> Event:
    """Slurm answers again after ``down_s`` seconds."""
    return factory.make(EventKind.SLURM_REACHABLE, {"node": node, "down_s": round(max(0.0, down_s), 3)})


def plan_changes(plan: Plan) -> list[str]:
    """The plan's instance changes in words: ``create gpu0:1g.18gb@3``."""
    return [
        f"{'create' if isinstance(a, CreateInstance) else 'destroy'} gpu{a.gpu}:{a.profile.name}@{a.start}"
        for a in plan.actions
        if isinstance(a, CreateInstance | DestroyInstance)
    ]


def plan_event(
    factory: EventFactory, node: str, mode: str, verdict: Verdict, plan: Plan, *, checkpoint: Sequence[int]
) -> Event:
    """A re-registration decision for ``plan``."""
    payload: dict[str, Any] = {
        "node": node,
        "mode": mode,
        "go": verdict.go,
        "reason": verdict.reason,
        "drain_s": round(verdict.drain_s, 3),
        "gain_slice_s": round(verdict.gain, 3),
        "cost_slice_s": round(verdict.cost, 3),
        "serves": list(verdict.newly_served),
        "changes": plan_changes(plan),
        "checkpoint": list(checkpoint),
    }
    return factory.make(EventKind.SLURM_PLAN, payload)


def job_event(factory: EventFactory, node: str, kind: str, detail: dict[str, Any]) -> Event:
    """A hook job ``detail["slurm_job"]`` was signalled, requeued (after ``step``) or released; ``kind`` is one of
    ``slurm_job_signalled``, ``slurm_job_requeued``, ``slurm_job_released``."""
    payload: dict[str, Any] = {"slurm_job": int(detail["slurm_job"]), "node": node}
    if kind == "slurm_job_signalled":
        payload["signal"] = str(detail.get("signal", ""))
    if kind == "slurm_job_requeued":
        step = detail.get("step")
        payload["step"] = step if isinstance(step, int) else None
    return factory.make(_JOB_KINDS[kind], payload)


def node_event(factory: EventFactory, node: str, what: str, detail: dict[str, Any]) -> Event:
    """A ``slurm_node`` event: ``what`` (one of :data:`NODE_WHATS`) happened to node ``node``, with ``detail``'s
    ``reason`` and, where they apply, ``slurm_job``, ``start_in_s`` and ``gres``."""
    if what not in NODE_WHATS:
        raise ValueError(f"unknown slurm_node event {what!r}")
    payload: dict[str, Any] = {"node": node, "what": what, "reason": str(detail.get("reason", ""))[:500]}
    for key, kind in (("slurm_job", int), ("start_in_s", float), ("gres", str)):
        if key in detail and detail[key] is not None:
            payload[key] = kind(detail[key])
    return factory.make(EventKind.SLURM_NODE, payload)
