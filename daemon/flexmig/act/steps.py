"""The step runner: one action's steps, each journalled as intent before it runs and as done (or failed) after.

Every step of every action goes through :meth:`ActionRun.step`, which skips a step the journal already has as
done (returning its recorded result) and re-raises one it has as failed, so that re-running an action after a
crash continues it where it stopped. Steps are idempotent given what NVML and the process table show.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from flexmig.act.durable import Durable
from flexmig.act.journal import ActionRow, Journal, StepRow
from flexmig.act.records import JobRecord
from flexmig.act.results import ActionOutcome
from flexmig.errors import FlexmigError

__all__ = ["ActionRun", "Refused", "StepFailed"]

T = TypeVar("T")


class StepFailed(FlexmigError):
    """A step could not be carried out; ``outcome`` says whether the action failed or was cancelled."""

    def __init__(self, message: str, *, outcome: ActionOutcome = "failed", code: str | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.code = code


class Refused(FlexmigError):
    """An action's preconditions do not hold; nothing was done."""


class ActionRun:
    """One execution (or recovery) of one action: runs steps, skipping those the journal says are done.

    Its journal writes go through ``durable`` (:class:`~flexmig.act.durable.Durable`): when the storage cannot take
    one, the action waits at that write and carries on once it goes through, instead of failing half-way.
    """

    def __init__(self, journal: Journal, row: ActionRow, durable: Durable | None = None) -> None:
        self.journal = journal
        self.row = row
        self.durable = durable or Durable(journal.path)
        prior = journal.steps(row.id)
        self.prior: dict[str, StepRow] = {s.name: s for s in prior}
        self.resumed = bool(prior)
        self.current: str | None = None
        """The step running now (or waiting to be journalled), for the control API."""

    async def write(self, what: str, fn: Callable[[], T]) -> T:
        """A journal write of this action, waiting out a full disk (``what`` names it in the log)."""
        return await self.durable.write(f"{what} of action {self.row.id} ({self.row.kind})", fn)

    def args_of(self, name: str) -> dict[str, Any] | None:
        """The arguments a previous run wrote for step ``name`` (None if it never started)."""
        s = self.prior.get(name)
        return s.args if s else None

    def job(self, name: str | None) -> JobRecord:
        """The journal's current record of job ``name``; Refused when there is none."""
        rec = self.journal.get_job(name or "")
        if rec is None:
            raise Refused(f"no job named {name!r}")
        return rec

    async def step(
        self,
        name: str,
        args: dict[str, Any],
        fn: Callable[[], Awaitable[dict[str, Any]]],
        *,
        job_before: JobRecord | None = None,
        job_after: Callable[[dict[str, Any]], JobRecord] | None = None,
        job_failed: JobRecord | None = None,
    ) -> dict[str, Any]:
        """Run step ``name`` unless already done: journal intent, run ``fn``, journal done (or failed)."""
        prior = self.prior.get(name)
        if prior is not None and prior.state == "done":
            return prior.result or {}
        if prior is not None and prior.state == "failed":
            res = prior.result or {}
            outcome = res.get("outcome", "failed")
            raise StepFailed(str(res.get("error", "failed")), outcome=outcome, code=res.get("code"))
        j, kind = self.journal, self.row.kind
        self.current = name
        step_id = await self.write(
            f"intent of step {name}", lambda: j.step_intent(self.row.id, kind, name, args, job=job_before)
        )
        try:
            result = await fn()
        except StepFailed as exc:
            error, outcome, code = str(exc), exc.outcome, exc.code
            await self.write(
                f"failure of step {name}",
                lambda: j.step_failed_with(step_id, kind, error, outcome=outcome, code=code, job=job_failed),
            )
            self.prior[name] = j.step_row(step_id)
            raise
        after = job_after(result) if job_after else None
        await self.write(f"end of step {name}", lambda: j.step_done(step_id, kind, result, job=after))
        self.prior[name] = j.step_row(step_id)
        return result

    def names(self, prefix: str) -> list[str]:
        """Names of the steps recorded so far that start with ``prefix``, in order."""
        return [s.name for s in self.journal.steps(self.row.id) if s.name.startswith(prefix)]
