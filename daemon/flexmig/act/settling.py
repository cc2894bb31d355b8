"""Settling: what a rank's exit outside any action means for its job.

The supervisor reports every rank exit. While an action runs on the job, the action owns its ranks and the exit
is expected; otherwise the job's fate is decided here, under the executor's lock: a rank that failed fails the
job (its other ranks are stopped); a job whose every rank exited 0 is done; one that acknowledged a checkpoint
after its move was cancelled is relaunched in place from it; exits the daemon did not see (it was away) fail it.

The fate is decided under the lock, but never waited for there: when the journal cannot take the record now (a
full disk), the lock is let go at once and the record waits for space outside it (:mod:`flexmig.act.durable`), so
that ``migrate``, ``stop`` and the planner are refused at once rather than hang behind it; once the record is
written the job is looked at again (a late acknowledgement then relaunches it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection

from flexmig.act.checkpoint import validate_ack
from flexmig.act.durable import Durable, storage_unavailable
from flexmig.act.events import ActEvent, EventSink
from flexmig.act.journal import Journal, JournalError
from flexmig.act.records import JobRecord
from flexmig.act.steps import StepFailed
from flexmig.act.supervisor import Supervisor
from flexmig.act.userpaths import read_ack_in
from flexmig.hook.protocol import AckError
from flexmig.tasks import cancel_and_wait, spawn

__all__ = ["Settler"]

log = logging.getLogger(__name__)


class Settler:
    """Decides, for each rank exit outside any action, whether its job failed, finished, or checkpointed late.

    ``busy`` holds the jobs an action is working on now (their exits are the action's business); ``restart``
    relaunches a job in place from its newest checkpoint (the executor's ``restart`` action, in mode ``act``).
    """

    def __init__(
        self,
        *,
        journal: Journal,
        supervisor: Supervisor,
        events: EventSink,
        lock: asyncio.Lock,
        busy: Collection[str],
        restart: Callable[[str], Awaitable[None]],
        wall: Callable[[], float],
        term_grace_s: float,
        durable: Durable | None = None,
    ) -> None:
        self.journal = journal
        self.supervisor = supervisor
        self.events = events
        self.lock = lock
        self.busy = busy
        self.restart = restart
        self.wall = wall
        self.term_grace_s = term_grace_s
        self.durable = durable or Durable(journal.path)
        self._settling: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._deferring = False
        self._deferred: tuple[str, JobRecord] | None = None

    def on_exit(self, job: str, slot: int, code: int | None) -> None:
        """The supervisor's exit callback: settle ``job`` in a task of its own, unless one is already on it."""
        if job in self.busy or job in self._settling:
            return
        self._settling.add(job)
        task = spawn(self._settle(job), name=f"settle-{job}")  # its death stops the daemon
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, job: str) -> None:
        try:
            while True:
                async with self.lock:
                    self._deferring, self._deferred = True, None
                    try:
                        await self.settle_locked(job)
                    finally:
                        self._deferring = False
                    deferred, self._deferred = self._deferred, None
                if deferred is None:
                    return
                what, rec = deferred
                await self.durable.write(what, lambda rec=rec: self.journal.put_job(rec))
        finally:
            self._settling.discard(job)

    async def settle_locked(self, job: str) -> None:
        """A rank exited outside any action: decide whether the job failed, finished, or checkpointed.

        The caller holds the executor's lock.
        """
        rec = self.journal.get_job(job)
        if rec is None or rec.state != "running" or job in self.busy:
            return
        ranks = [h for h in self.supervisor.ranks(job) if h.generation == rec.generation]
        if ranks and not any(h.proc.finished() for h in ranks):
            return  # a rank of an older generation exited (adopted across a restart, after its move): nothing to do
        bad = [h for h in ranks if h.proc.finished() and h.proc.returncode not in (0, None)]
        if bad:
            await self.supervisor.terminate(job, self.term_grace_s)
            msg = ", ".join(f"rank {h.slot} exited with status {h.proc.returncode}" for h in bad)
            await self._put(rec.with_(state="failed", error=msg))
            self.events.emit(ActEvent(kind="job_failed", time_s=self.wall(), job=job, error=msg))
            return
        if not await self.supervisor.wait_exited(job, rec.spec.hook.exit_timeout_s):
            return  # others still run; their exits call us again
        await self.supervisor.end_strays(job, self.term_grace_s)  # what left the ranks' process groups goes too
        try:
            ack = read_ack_in(self.supervisor.acks.path(rec))
        except AckError as exc:  # whatever the job left there, its ranks have exited: settle them without it
            log.warning("job %s: %s; ignored", job, exc)
            ack = None
        if ack is not None and (rec.resume is None or ack.step > rec.resume.step):
            try:
                ack = validate_ack(rec, ack)
            except StepFailed:
                ack = None
        else:
            ack = None
        if ack is not None:
            # A checkpoint request was acknowledged after its move was cancelled: resume in place.
            if await self._put(rec.with_(last_ack=ack)):
                await self.restart(job)
            return
        unknown = [h for h in ranks if h.proc.returncode is None]
        if unknown or not ranks:
            msg = "ranks exited while the daemon was away; exit status unknown"
            await self._put(rec.with_(state="failed", error=msg))
            self.events.emit(ActEvent(kind="job_failed", time_s=self.wall(), job=job, error=msg))
            return
        await self._put(rec.with_(state="done", error=None))
        self.events.emit(ActEvent(kind="job_exited", time_s=self.wall(), job=job, detail={"state": "done"}))

    async def _put(self, rec: JobRecord) -> bool:
        """Record the job's fate; its ranks are gone, so this waits out a full disk rather than forget it. Settling
        an exit, it never waits under the lock: a record the storage cannot take now is handed to :meth:`_settle`,
        which waits for it after letting the lock go (False: not written yet)."""
        what = f"{rec.state} record of job {rec.name}"
        if not self._deferring:
            await self.durable.write(what, lambda: self.journal.put_job(rec))
            return True
        try:
            self.journal.put_job(rec)
        except JournalError as exc:
            if storage_unavailable(exc) is None:
                raise
            self._deferred = (what, rec)
            return False
        return True

    async def close(self) -> None:
        """Cancel pending settle tasks."""
        await cancel_and_wait(self._tasks)
