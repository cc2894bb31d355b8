"""A stop that works when the journal cannot be written: the state file system is full.

A job that prints without end fills a small state file system (its rank logs live there, and their cap can be
larger than the file system); every journal write then fails, and a stop, which begins by journalling its plan,
failed with "journal write failed: disk full" while the job went on filling it. So when a stop cannot be
journalled for want of space, it is carried out without a plan: the job's ranks are stopped by force (SIGTERM,
SIGKILL after the grace; no checkpoint is asked, since its acknowledgement could not be recorded either), which
also ends the flood; then the journal's reserve (:meth:`flexmig.act.journal.Journal.release_reserve`) is given
back to the file system and the job is recorded ``stopped``. The answer says all of that. Should even the record
fail, the answer says so too: the journal still says ``running``, and the next start settles the job (its ranks
are gone).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from flexmig.act.journal import JournalError
from flexmig.errors import PlanRejectedError

if TYPE_CHECKING:
    from flexmig.act.executor import Executor

__all__ = ["stop_on_full_storage"]


async def stop_on_full_storage(ex: Executor, name: str, why: str) -> dict[str, Any]:
    """Stop job ``name`` by force without journalling a plan (``why``: the journal's refusal), record it in the
    reserve's space, and answer as a stop's plan result does, with the story in the action's ``error``.
    PlanRejectedError when the job does not run, or an action is moving it (its own stop waits for that action)."""
    t0 = time.monotonic()
    rec = ex.journal.get_job(name)
    if rec is None or rec.state != "running":
        raise PlanRejectedError(f"job {name} is not running ({why})")
    if name in ex.busy:
        raise PlanRejectedError(f"{why}; and job {name} is in the middle of an action: try again after it")
    ex.busy.add(name)  # the settler leaves the exits of this stop alone
    try:
        await ex.supervisor.terminate(name, ex.term_grace_s)
        released = ex.journal.release_reserve()
        note = (
            f"stopped without a checkpoint: the journal could not be written ({why}); its ranks were ended by force "
            f"(SIGTERM, SIGKILL after {ex.term_grace_s:g} s), which ends what it was writing"
        )
        try:
            ex.journal.put_job(rec.with_(state="stopped", error=note))
        except JournalError as exc:
            recorded = f"; the stop could not be recorded ({exc}): the journal still says running until the next start"
        else:
            recorded = "; recorded as stopped" + (" in the space the journal keeps in reserve" if released else "")
    finally:
        ex.busy.discard(name)
    action: dict[str, Any] = {
        "action_id": None,
        "kind": "stop",
        "job": name,
        "outcome": "completed",
        "error": note + recorded,
        "duration_s": round(time.monotonic() - t0, 6),
        "steps": [],
    }
    return {"plan_id": None, "ok": True, "actions": [action], "journal_full": True}
