"""How actions and plans ended: what the executor answers the control API, the CLI and the daemon's metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from flexmig.act.journal import ActionRow, StepRow

__all__ = ["ActionOutcome", "ActionResult", "PlanResult", "action_result"]

ActionOutcome = Literal["completed", "failed", "cancelled", "skipped"]
"""How an action ended, in the words of the control API's answers and the action events."""

_OUTCOMES: Mapping[str, ActionOutcome] = {"done": "completed", "failed": "failed", "cancelled": "cancelled"}


@dataclass(frozen=True, slots=True)
class ActionResult:
    """How one action ended, with the duration of each of its steps (seconds)."""

    action_id: int
    kind: str
    job: str | None
    outcome: ActionOutcome
    error: str | None
    duration_s: float
    steps: tuple[tuple[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form (control API answers)."""
        return {
            "action_id": self.action_id,
            "kind": self.kind,
            "job": self.job,
            "outcome": self.outcome,
            "error": self.error,
            "duration_s": round(self.duration_s, 6),
            "steps": [{"step": n, "duration_s": round(d, 6)} for n, d in self.steps],
        }


@dataclass(frozen=True, slots=True)
class PlanResult:
    """How a plan ended: one result per action, in order."""

    plan_id: int
    results: tuple[ActionResult, ...]

    @property
    def ok(self) -> bool:
        """True when every action completed."""
        return all(r.outcome == "completed" for r in self.results)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"plan_id": self.plan_id, "ok": self.ok, "actions": [r.to_json() for r in self.results]}


def action_result(row: ActionRow, steps: Sequence[StepRow], now: float) -> ActionResult:
    """The result of journalled action ``row`` with its ``steps``; ``now`` ends an action still unfinished."""
    durations = tuple((s.name, (s.finished_s or s.started_s) - s.started_s) for s in steps)
    outcome = _OUTCOMES.get(row.state, "skipped")
    duration = (row.finished_s or now) - (row.started_s or row.finished_s or now)
    return ActionResult(row.id, row.kind, row.job, outcome, row.error, duration, durations)
