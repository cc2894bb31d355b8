"""Journal writes that wait for storage instead of failing: a full disk never leaves an action half-done.

An action's steps are journalled before and after they run (:mod:`flexmig.act.steps`). When the disk fills in the
middle of a migration (the job has acknowledged its checkpoint and its ranks have exited), failing the write would
leave a stopped job that the journal calls running, and no one to finish the move. So every write of an action in
flight goes through :meth:`Durable.write`: when SQLite says the storage cannot take it (full, read-only, an I/O
error, a descriptor it cannot open, a lock), the action waits where it is and tries again, 0.2 s doubling to 5 s,
until the write goes through; then it carries on from exactly that write (roll forward from the checkpoint). It
says so once when it starts waiting (ERROR, naming the journal and what waits) and once when it can go on, and
counts every retry. While it waits, :attr:`Durable.stalled` tells the control API and the metrics what is held up.

Any other journal error is raised as before. Writes before anything is done (registering a plan, a submitted job)
do not wait: they fail at once with the journal's error, and nothing has changed. Nor does a request wait behind a
write that waits: :meth:`Durable.hold` takes the action lock for a request unless a journal write waits for storage
(already, or while the request queues for the lock), and then refuses it at once, naming the journal and the write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

from flexmig.act.journal import JournalError
from flexmig.errors import PlanRejectedError

__all__ = ["Durable", "Stall", "storage_unavailable"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Primary SQLite result codes that mean "the storage cannot take this write now", not "this write is wrong".
_STORAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
    }
)


def storage_unavailable(exc: BaseException) -> sqlite3.Error | None:
    """The SQLite error behind ``exc`` when it says the storage cannot take a write now (else None)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, sqlite3.Error):
            code = getattr(cur, "sqlite_errorcode", None)
            if isinstance(code, int) and code & 0xFF in _STORAGE_CODES:
                return cur
        cur = cur.__cause__ or cur.__context__
    return None


@dataclass(frozen=True, slots=True)
class Stall:
    """What waits for the journal: the write, since when (wall time), and SQLite's reason."""

    what: str
    since_s: float
    reason: str

    def describe(self, now_s: float) -> str:
        """``journal write (step launch of action 7) waits 12 s: database or disk is full``."""
        return f"journal write ({self.what}) waits {now_s - self.since_s:.0f} s: {self.reason}"


class Durable:
    """Runs journal writes of actions in flight, waiting out storage errors (see the module doc)."""

    def __init__(
        self,
        journal_path: object,
        *,
        first_s: float = 0.2,
        longest_s: float = 5.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.journal_path = journal_path
        self.first_s = first_s
        self.longest_s = longest_s
        self.wall = wall
        self.stalled: Stall | None = None
        """The write that waits now, if any."""
        self.retries = 0
        """Writes tried again since start (``flexmig_journal_write_retries_total``)."""
        self.stalls = 0
        """Times a write had to wait since start."""
        self._stalling = asyncio.Event()
        self._queued = 0
        self.contended = asyncio.Event()
        """Set while a request queues for the action lock (:meth:`hold`)."""

    async def write(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` (a journal write), tried again while the storage cannot take it; ``what`` names it in the log."""
        pause = self.first_s
        while True:
            try:
                result = fn()
            except JournalError as exc:
                cause = storage_unavailable(exc)
                if cause is None:
                    raise
                if self.stalled is None:
                    self.stalled = Stall(what, self.wall(), str(cause))
                    self.stalls += 1
                    self._stalling.set()
                    log.error(
                        "cannot write the journal %s (%s): %s waits and is tried again until it goes through; "
                        "free space (or fix the storage) and it carries on",
                        self.journal_path, cause, what,
                    )  # fmt: skip
                self.retries += 1
                await asyncio.sleep(pause)
                pause = min(self.longest_s, pause * 2)
                continue
            stall, self.stalled = self.stalled, None
            self._stalling.clear()
            if stall is not None:
                log.warning(
                    "journal %s written again after %.1f s: %s goes on", self.journal_path,
                    self.wall() - stall.since_s, what,
                )  # fmt: skip
            return result

    def refusal(self, what: str) -> PlanRejectedError | None:
        """The error that refuses ``what`` while a journal write waits for storage (None when none waits)."""
        stall = self.stalled
        if stall is None:
            return None
        return PlanRejectedError(
            f"{what} refused: the journal {self.journal_path} cannot be written now "
            f"({stall.describe(self.wall())}); try again once there is space"
        )

    @contextlib.asynccontextmanager
    async def hold(self, lock: asyncio.Lock, what: str, *, contends: bool = True) -> AsyncIterator[None]:
        """``async with durable.hold(lock, "jobs.migrate"):`` hold ``lock`` for a request, unless a journal write
        waits for storage, now or while the request queues for the lock (it may be the holder's): then
        PlanRejectedError at once, and the request changed nothing. What waits for storage never makes a request
        hang behind it."""
        refused = self.refusal(what)
        if refused is not None:
            raise refused
        if lock.locked():
            await self._acquire_unless_stalled(lock, what, contends)
        else:
            await lock.acquire()
        try:
            yield
        finally:
            lock.release()

    async def _acquire_unless_stalled(self, lock: asyncio.Lock, what: str, contends: bool = True) -> None:
        """Queue for ``lock``; give up (PlanRejectedError) if a journal write starts waiting first. While a
        request that ``contends`` queues, :attr:`contended` is set (what the holder waits for at will, such as
        standby ranks that take their time to be ready, it stops waiting for)."""
        acquire = asyncio.ensure_future(lock.acquire())
        stalling = asyncio.ensure_future(self._stalling.wait())
        self._queued += contends
        if self._queued:
            self.contended.set()
        try:
            await asyncio.wait({acquire, stalling}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while queueing: never leave the lock taken behind us
            stalling.cancel()
            if not acquire.cancel() and not acquire.cancelled():
                lock.release()
            raise
        finally:
            self._queued -= contends
            if not self._queued:
                self.contended.clear()
        stalling.cancel()
        if not acquire.done():
            acquire.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acquire
        if not acquire.cancelled():
            return  # the lock is ours (a lock's acquire either returns True or is cancelled)
        raise self.refusal(what) or PlanRejectedError(f"{what} refused: the action lock was not taken")
