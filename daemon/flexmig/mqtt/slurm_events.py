"""The fleet events of flexmig's Slurm side, built in one place so the daemon and the schema's tests make the same.

* ``slurm_unreachable`` (Slurm started failing, or fails differently) and ``slurm_reachable`` (it answers again,
  after ``down_s``);
* ``slurm_plan``: a new re-registration decision, go or not, with its figures and the instance changes;
* ``slurm_job_signalled`` / ``slurm_job_requeued`` / ``slurm_job_released``: a hook job's checkpoint-and-requeue;
* ``slurm_carving`` (one node per MIG instance): a new carving of the host, in mode act done, in mode advise
  what would be done: the idle instances retired and the instances created with their Slurm nodes and the jobs
  they are for, the region held for a blocked job, the reasons;
* ``slurm_node``: what flexmig did about the node itself (``what``: slurmd restarted, a change waiting in flexmig's
  reservation or abandoned, a hook job that missed its acknowledgement), or why it left it alone (an administrator's
  drain, down or reservation; an unsupported setup).

The re-registration itself is an action: ``action_started``/``action_completed``/... with
``action = slurm_reregister``. Pure: the factory brings the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flexmig.mqtt.events import Event, EventFactory, EventKind
from flexmig.plan.reregistration import Verdict
from flexmig.plan.types import CreateInstance, DestroyInstance, Plan

if TYPE_CHECKING:
    from flexmig.slurm.instances import CarvingReport

__all__ = [
    "NODE_WHATS",
    "CarvingNews",
    "carving_event",
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


MAX_REASONS = 64
"""At most this many of a carving's reasons go into its event (the rest are in the log)."""


class CarvingNews:
    """Which carvings are news for the fleet: one that changes instances each time it is done (mode act) and, not
    done (mode advise proposes the same one every round), when it differs from the last one published; a hold
    when it is taken, moves or is dropped. Rounds that neither change nor hold anything are not news."""

    def __init__(self) -> None:
        self._proposed: dict[str, str] = {}
        self._held: dict[str, tuple[str, str] | None] = {}

    def news(self, node: str, report: CarvingReport, *, done: bool) -> bool:
        """True when host node ``node``'s carving ``report`` (``done``: its actions ran) should be published."""
        hold = None if report.hold is None else report.hold[:2]
        new_hold = hold != self._held.get(node)
        if report.destroy or report.create:
            signature = report.signature()
            if signature == self._proposed.get(node) and not done and not new_hold:
                return False
            self._proposed[node] = signature
        else:
            self._proposed.pop(node, None)
            if not new_hold:
                return False
        self._held[node] = hold
        return True


def carving_event(factory: EventFactory, node: str, mode: str, report: CarvingReport) -> Event:
    """A carving of host node ``node``'s GPUs (mode ``act``: done; ``advise``: proposed)."""
    hold: dict[str, Any] | None = None
    if report.hold is not None:
        job, instance, left = report.hold
        hold = {"job": job, "instance": instance, "start_in_s": left}
    payload: dict[str, Any] = {
        "node": node,
        "mode": mode,
        "destroy": [{"instance": i, "slurm_node": n} for i, n in report.destroy],
        "create": [{"instance": i, "slurm_node": n, "job": j} for i, n, j in report.create],
        "hold": hold,
        "reasons": [r[:500] for r in report.reasons[:MAX_REASONS]],
    }
    return factory.make(EventKind.SLURM_CARVING, payload)
