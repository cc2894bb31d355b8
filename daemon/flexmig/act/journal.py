"""The write-ahead journal of every action, and the job records, in one SQLite database (WAL mode).

Rule: a step is written (``intent``) and committed *before* it runs, and marked ``done`` after. After a crash,
start-up reconciliation (:mod:`flexmig.act.executor`) reads the unfinished actions and re-runs each from its
first step not ``done``; every step checks the node before acting, so re-running one is safe. Job records are
updated in the same transaction as the step intent that changes them.

``synchronous=FULL`` because a lost commit here could mean a leaked MIG instance or a job launched twice; one
fsync per step costs a millisecond or two on an SSD (``bench/migration.py`` measures it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from flexmig.act.journal_rows import (
    ACTION_SELECT,
    ACTION_STATES,
    JOB_SELECT,
    SCHEMA,
    SCHEMA_VERSION,
    STEP_SELECT,
    STEP_STATES,
    TABLES,
    ActionRow,
    ActionState,
    Fields,
    RankRecord,
    StepEvent,
    StepRow,
    StepState,
    create_schema,
    decode_job,
)
from flexmig.act.records import JobRecord
from flexmig.errors import JournalError, StorageError
from flexmig.storage import check_database_file, create_database, is_corruption, prepare_dir, quick_check

__all__ = ["ActionRow", "Journal", "JournalError", "RankRecord", "StepEvent", "StepRow"]

RESERVE_BYTES = 2 * 1024 * 1024
"""Space the journal keeps beside it (``journal.sqlite3.reserve``) for a stop on a full file system: far more than
the few pages and WAL frames that recording a stopped job takes."""


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class Journal:
    """The actuator's database. One object per process; all calls from one thread (the event loop's)."""

    def __init__(
        self,
        path: Path,
        wall: Callable[[], float] = time.time,
        on_step: Callable[[StepEvent], None] | None = None,
        synchronous: Literal["FULL", "NORMAL", "OFF"] = "FULL",
    ) -> None:
        """Open (or create) the journal at ``path``. ``synchronous`` below FULL is for benchmarks only.

        Refused with a JournalError, every problem one line naming the journal (and the row and field): a state
        directory or journal file that fails :mod:`flexmig.storage`'s checks (not ours, writable by others, a
        symlink, empty, not SQLite), a file without the journal's tables or of another schema version, a file
        whose structure SQLite's ``quick_check`` finds damaged, and a row that does not decode.
        """
        if synchronous not in ("FULL", "NORMAL", "OFF"):
            raise JournalError(f"synchronous must be FULL, NORMAL or OFF, not {synchronous!r}")
        self.path = path
        self.wall = wall
        self.on_step = on_step
        self._count = 0
        self._writes = 0  # every write this object made (or tried), queue_job's too
        self.revision = 0
        """Bumped by every write but :meth:`queue_job`'s: a plan worked out at one revision is stale at another."""
        self._decoded: dict[str, tuple[tuple[Any, ...], JobRecord]] = {}
        """Job rows decoded so far, by name, with the raw row they came from: a row that reads back unchanged is
        not decoded (and its spec checked) again."""
        self._listing: dict[str, JobRecord] | None = None
        """:meth:`jobs` as last read, kept up to date row by row as this object writes (each written row is read
        back and decoded after its commit), and read again in full when another connection wrote the file (SQLite's
        ``data_version``): listing a queue of thousands costs neither a decode nor a read per job."""
        self._sorted: list[JobRecord] | None = None
        self._listing_version: int | None = None
        self._written: set[str] = set()  # job rows written by the transaction in progress
        try:
            prepare_dir(path.parent, "state directory")
            if not check_database_file(path, "journal").exists:
                create_database(path, "journal", create_schema)
        except StorageError as exc:
            raise JournalError(str(exc)) from None
        try:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise JournalError(f"{path}: cannot open the journal: {exc}") from exc
        try:
            self._check_file(synchronous)
            problems = self.check_rows()
        except BaseException:
            self.db.close()
            raise
        if problems:
            self.db.close()
            raise JournalError("\n".join(problems))
        self.reserve = path.with_name(path.name + ".reserve")
        """Space kept for the journal (:data:`RESERVE_BYTES`): a stop on a full file system frees it to record
        itself (:meth:`release_reserve`)."""
        self._reserved = self.restore_reserve()

    def _check_file(self, synchronous: str) -> None:
        """Integrity, then our tables and schema version, then the settings; JournalError for what is wrong."""
        path = self.path
        try:
            damage = quick_check(self.db)
            if damage:
                raise JournalError(
                    f"{path}: the journal is corrupt (SQLite quick_check: {'; '.join(damage[:3])}); nothing was "
                    "changed: keep the file for inspection and restore it from a backup, or move it away to start "
                    "with an empty journal (the jobs it records will then be unknown)"
                )
            tables = {str(r[0]) for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            missing = sorted(TABLES - tables)
            if "meta" in missing:
                raise JournalError(
                    f"{path}: refused: the file holds no flexmig journal (no 'meta' table"
                    f"{': it has ' + ', '.join(sorted(tables)) if tables else ''}); it is left as it is"
                )
            row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                raise JournalError(f"{path}: refused: meta row 'schema': missing (no flexmig journal writes that)")
            if str(row[0]) != str(SCHEMA_VERSION):
                raise JournalError(
                    f"{path}: meta row 'schema': journal schema {str(row[0])[:40]}, this flexmig reads {SCHEMA_VERSION}"
                )
            if missing:
                raise JournalError(f"{path}: refused: the journal lacks its table(s) {', '.join(missing)}")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(SCHEMA)  # indexes a journal of an earlier release may lack
        except sqlite3.Error as exc:
            raise JournalError(f"{path}: cannot open the journal: {exc}") from exc

    def check_rows(self) -> list[str]:
        """Decode every job record, and every action and step of the unfinished plans (the rows a start acts
        on); one line per problem, naming the journal, the row and the field. Empty when all decode."""
        problems: list[str] = []
        try:
            for r in self.db.execute(JOB_SELECT + " ORDER BY name").fetchall():
                try:
                    self._job(r)
                except JournalError as exc:
                    problems.append(str(exc))
            plans = self.db.execute("SELECT id FROM plans WHERE state='running' ORDER BY id").fetchall()
            for (plan_id,) in plans:
                for r in self.db.execute(ACTION_SELECT + " WHERE plan_id=? ORDER BY seq", (plan_id,)).fetchall():
                    try:
                        action = self._action(r)
                    except JournalError as exc:
                        problems.append(str(exc))
                        continue
                    for sr in self.db.execute(STEP_SELECT + " WHERE action_id=? ORDER BY id", (action.id,)):
                        try:
                            self._step(sr)
                        except JournalError as exc:
                            problems.append(str(exc))
        except sqlite3.Error as exc:
            problems.append(self._read_failed(exc))
        return problems

    def _read_failed(self, exc: sqlite3.Error) -> str:
        if is_corruption(exc):
            return f"{self.path}: the journal is corrupt ({exc}); restore it from a backup or move it away"
        return f"{self.path}: cannot read the journal: {exc}"

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """Rows of a query; JournalError (one line naming the journal) for a damaged or unreadable file."""
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise JournalError(self._read_failed(exc)) from exc

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    # ------------------------------------------------------------------------------------------- reserve
    def restore_reserve(self) -> bool:
        """Make (or complete) the reserve file, :data:`RESERVE_BYTES` really allocated; False when the file
        system has no room for it now (or the name is taken by something that is not the daemon's regular file,
        which is left alone). Tried again after each write while it is missing."""
        try:
            fd = os.open(self.reserve, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return False
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def release_reserve(self) -> bool:
        """Give the reserve's space back to the file system (a write that must go through on a full disk: a stop);
        True when there was one to give."""
        had, self._reserved = self._reserved, False
        try:
            self.reserve.unlink()
        except OSError:
            return False
        return had

    @contextmanager
    def _tx(self, *, revise: bool = True) -> Iterator[sqlite3.Connection]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._listing = self._sorted = None  # whether it took or not, read it all again
            raise JournalError(f"{self.path}: journal write failed: {exc}") from exc
        finally:
            self._writes += 1
            if revise:  # also after a failed write: whether it took, what was read before may be stale
                self.revision += 1
            written, self._written = self._written, set()
        if not self._reserved:  # a write went through: there may be room for the reserve again
            self._reserved = self.restore_reserve()
        if written and self._listing is not None:
            self._relist(written)

    # --------------------------------------------------------------------------------------------- plans
    def begin_plan(
        self, origin: str, actions: Sequence[tuple[str, str | None, dict[str, Any]]], notes: Sequence[str] = ()
    ) -> tuple[int, list[int]]:
        """Record a plan and all its actions as ``pending``, in one transaction; returns the IDs."""
        now = self.wall()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO plans(origin, notes, state, created_s) VALUES (?, ?, 'running', ?)",
                (origin, _dumps(list(notes)), now),
            )
            plan_id = int(cur.lastrowid or 0)
            ids = []
            for seq, (kind, job, payload) in enumerate(actions):
                c = db.execute(
                    "INSERT INTO actions(plan_id, seq, kind, job, payload, state) VALUES (?, ?, ?, ?, ?, 'pending')",
                    (plan_id, seq, kind, job, _dumps(payload)),
                )
                ids.append(int(c.lastrowid or 0))
        return plan_id, ids

    def append_actions(self, plan_id: int, actions: Sequence[tuple[str, str | None, dict[str, Any]]]) -> list[int]:
        """Add actions at the end of a plan (undo actions after a failure), as ``pending``."""
        with self._tx() as db:
            row = db.execute("SELECT COALESCE(MAX(seq), -1) FROM actions WHERE plan_id=?", (plan_id,)).fetchone()
            seq = int(row[0]) + 1
            ids = []
            for k, (kind, job, payload) in enumerate(actions):
                c = db.execute(
                    "INSERT INTO actions(plan_id, seq, kind, job, payload, state) VALUES (?, ?, ?, ?, ?, 'pending')",
                    (plan_id, seq + k, kind, job, _dumps(payload)),
                )
                ids.append(int(c.lastrowid or 0))
        return ids

    def finish_plan(self, plan_id: int, state: str) -> None:
        """Mark a plan finished (``done`` or ``failed``)."""
        with self._tx() as db:
            db.execute("UPDATE plans SET state=?, finished_s=? WHERE id=?", (state, self.wall(), plan_id))

    def unfinished_plans(self) -> list[int]:
        """IDs of plans not finished, oldest first."""
        rows = self._read("SELECT id FROM plans WHERE state='running' ORDER BY id")
        return [int(r[0]) for r in rows]

    # ------------------------------------------------------------------------------------------- actions
    def actions(self, plan_id: int) -> list[ActionRow]:
        """A plan's actions in order."""
        rows = self._read(ACTION_SELECT + " WHERE plan_id=? ORDER BY seq", (plan_id,))
        return [self._action(r) for r in rows]

    def action(self, action_id: int) -> ActionRow:
        """One action."""
        rows = self._read(ACTION_SELECT + " WHERE id=?", (action_id,))
        if not rows:
            raise JournalError(f"no action {action_id} in {self.path}")
        return self._action(rows[0])

    def recent_actions(self, limit: int = 50) -> list[ActionRow]:
        """The newest actions, newest first."""
        rows = self._read(ACTION_SELECT + " ORDER BY id DESC LIMIT ?", (limit,))
        return [self._action(r) for r in rows]

    def _action(self, r: Sequence[Any]) -> ActionRow:
        f = Fields(self.path, "actions", r[0])
        return ActionRow(
            id=f.integer("id", r[0]),
            plan_id=f.integer("plan_id", r[1]),
            seq=f.integer("seq", r[2]),
            kind=f.text("kind", r[3]),
            job=f.text("job", r[4], optional=True),
            payload=f.json_object("payload", r[5]),
            state=f.choice("state", r[6], ACTION_STATES),  # type: ignore[arg-type]
            error=f.text("error", r[7], optional=True),
            started_s=f.number("started_s", r[8], optional=True),
            finished_s=f.number("finished_s", r[9], optional=True),
        )

    def start_action(self, action_id: int) -> None:
        """Mark an action running (idempotent: a re-run after a crash keeps the first start time)."""
        with self._tx() as db:
            db.execute(
                "UPDATE actions SET state='running', started_s=COALESCE(started_s, ?) WHERE id=?",
                (self.wall(), action_id),
            )

    def finish_action(self, action_id: int, state: ActionState, error: str | None = None) -> None:
        """Mark an action finished."""
        with self._tx() as db:
            db.execute(
                "UPDATE actions SET state=?, error=?, finished_s=? WHERE id=?", (state, error, self.wall(), action_id)
            )

    # --------------------------------------------------------------------------------------------- steps
    def steps(self, action_id: int) -> list[StepRow]:
        """An action's steps in the order they were written."""
        rows = self._read(STEP_SELECT + " WHERE action_id=? ORDER BY id", (action_id,))
        return [self._step(r) for r in rows]

    def step_intent(
        self, action_id: int, kind: str, name: str, args: dict[str, Any], job: JobRecord | None = None
    ) -> int:
        """Write that step ``name`` is about to run (and ``job``'s new record, atomically); returns its ID."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO steps(action_id, name, args, state, started_s) VALUES (?, ?, ?, 'intent', ?)",
                (action_id, name, _dumps(args), self.wall()),
            )
            step_id = int(cur.lastrowid or 0)
            if job is not None:
                self._put_job(db, job)
        self._notify("intent", action_id, kind, name)
        return step_id

    def step_done(
        self, step_id: int, kind: str, result: dict[str, Any] | None = None, job: JobRecord | None = None
    ) -> None:
        """Write that a step finished (and ``job``'s new record, atomically)."""
        with self._tx() as db:
            db.execute(
                "UPDATE steps SET state='done', result=?, finished_s=? WHERE id=?",
                (_dumps(result or {}), self.wall(), step_id),
            )
            if job is not None:
                self._put_job(db, job)
            row = db.execute("SELECT action_id, name FROM steps WHERE id=?", (step_id,)).fetchone()
        self._notify("done", int(row[0]), kind, str(row[1]))

    def step_failed_with(
        self,
        step_id: int,
        kind: str,
        error: str,
        *,
        outcome: str = "failed",
        code: str | None = None,
        job: JobRecord | None = None,
    ) -> None:
        """Write that a step failed (``outcome`` ``cancelled`` when the action is cancelled rather than failed)."""
        with self._tx() as db:
            db.execute(
                "UPDATE steps SET state='failed', result=?, finished_s=? WHERE id=?",
                (_dumps({"error": error, "outcome": outcome, "code": code}), self.wall(), step_id),
            )
            if job is not None:
                self._put_job(db, job)
            row = db.execute("SELECT action_id, name FROM steps WHERE id=?", (step_id,)).fetchone()
        self._notify("failed", int(row[0]), kind, str(row[1]))

    def step_row(self, step_id: int) -> StepRow:
        """One step."""
        rows = self._read(STEP_SELECT + " WHERE id=?", (step_id,))
        if not rows:
            raise JournalError(f"no step {step_id} in {self.path}")
        return self._step(rows[0])

    def _step(self, r: Sequence[Any]) -> StepRow:
        f = Fields(self.path, "steps", r[0])
        return StepRow(
            id=f.integer("id", r[0]),
            action_id=f.integer("action_id", r[1]),
            name=f.text("name", r[2]),
            args=f.json_object("args", r[3]),
            state=f.choice("state", r[4], STEP_STATES),  # type: ignore[arg-type]
            result=f.json_object("result", r[5], optional=True),
            started_s=f.number("started_s", r[6]),
            finished_s=f.number("finished_s", r[7], optional=True),
        )

    def _notify(self, phase: StepState, action_id: int, kind: str, name: str) -> None:
        self._count += 1
        if self.on_step is not None:
            self.on_step(StepEvent(phase, action_id, kind, name, self._count))

    # ---------------------------------------------------------------------------------------------- jobs
    def put_job(self, job: JobRecord) -> None:
        """Insert or replace a job record."""
        with self._tx() as db:
            self._put_job(db, job)

    def queue_job(self, job: JobRecord) -> None:
        """Insert a ``pending`` job record (a submission that waits for room), or replace one. A new name leaves
        :attr:`revision` alone: a queued job changes nothing a plan worked out before relies on (the plan just does
        not know it yet), so a steady stream of submissions does not keep every plan from running. Replacing a
        record (a name submitted again) is a change like any other."""
        if job.state != "pending":
            raise ValueError(f"queue_job takes pending jobs, not a {job.state} one")
        new = not self._read("SELECT 1 FROM jobs WHERE name=?", (job.name,))
        with self._tx(revise=not new) as db:
            self._put_job(db, job)

    def _put_job(self, db: sqlite3.Connection, job: JobRecord) -> None:
        self._written.add(job.name)
        db.execute(
            "INSERT OR REPLACE INTO jobs(name, uid, spec, source, state, generation, slots, resume, last_ack, "
            "master_port, error, submitted_s, updated_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job.name,
                job.uid,
                _dumps(job.spec.to_dict()),
                str(job.spec.source) if job.spec.source else None,
                job.state,
                job.generation,
                _dumps([s.to_json() for s in job.slots]),
                _dumps(job.resume.to_json()) if job.resume else None,
                _dumps(job.last_ack.to_json()) if job.last_ack else None,
                job.master_port,
                job.error,
                job.submitted_s,
                self.wall(),
            ),
        )

    # --------------------------------------------------------------------------------------------- ranks
    def record_ranks(self, job_uid: str, generation: int, ranks: Mapping[int, RankRecord]) -> None:
        """Remember the processes launched (or handed over) as the ranks of generation ``generation`` of the job
        ``job_uid``: what a restarted daemon adopts, whatever other process says it is that rank. Rows of the job's
        earlier generations go. JournalError when the write fails."""
        with self._tx(revise=False) as db:
            db.execute("DELETE FROM ranks WHERE job_uid=? AND generation<>?", (job_uid, generation))
            db.executemany(
                "INSERT OR REPLACE INTO ranks(job_uid, generation, slot, pid, started, uid) VALUES (?, ?, ?, ?, ?, ?)",
                [(job_uid, generation, slot, r.pid, r.started, r.uid) for slot, r in ranks.items()],
            )

    def recorded_ranks(self, job_uid: str, generation: int) -> dict[int, RankRecord]:
        """The ranks :meth:`record_ranks` remembered for that generation, by slot (rows that do not decode as
        numbers are left out: they vouch for nothing)."""
        rows = self._read(
            "SELECT slot, pid, started, uid FROM ranks WHERE job_uid=? AND generation=?", (job_uid, generation)
        )
        out = {}
        for slot, pid, started, uid in rows:
            if all(isinstance(v, int) for v in (slot, pid, uid)) and isinstance(started, (int, float)):
                out[int(slot)] = RankRecord(int(pid), float(started), int(uid))
        return out

    def get_job(self, name: str) -> JobRecord | None:
        """The record of job ``name``, if registered."""
        rows = self._read(JOB_SELECT + " WHERE name=?", (name,))
        return self._cached_job(rows[0]) if rows else None

    def jobs(self) -> list[JobRecord]:
        """Every registered job, by name."""
        version = self._data_version()
        if self._listing is None or version != self._listing_version:
            rows = self._read(JOB_SELECT + " ORDER BY name")
            self._listing = {rec.name: rec for rec in (self._cached_job(r) for r in rows)}
            self._listing_version = version
            self._sorted = None
            if len(self._decoded) > len(self._listing):  # rows gone (none are deleted today): forget them
                self._decoded = {k: v for k, v in self._decoded.items() if k in self._listing}
        if self._sorted is None:
            self._sorted = sorted(self._listing.values(), key=lambda rec: rec.name)
        return list(self._sorted)

    def stamp(self) -> tuple[int, int]:
        """Changes whenever the file may have: a write of this object, or a commit by another connection. What was
        read at one stamp is still what the file holds while the stamp stays the same."""
        return self._writes, self._data_version()

    def _data_version(self) -> int:
        """SQLite's count of commits by other connections to this file (ours do not change it)."""
        rows = self._read("PRAGMA data_version")
        return int(rows[0][0])

    def _relist(self, names: set[str]) -> None:
        """After this object committed job rows ``names``: read each back into :attr:`_listing` (decoded as
        :meth:`jobs` would), or drop the listing if that fails, for the next :meth:`jobs` to read in full."""
        listing = self._listing
        assert listing is not None
        self._sorted = None
        try:
            for name in names:
                rows = self._read(JOB_SELECT + " WHERE name=?", (name,))
                if rows:
                    listing[name] = self._cached_job(rows[0])
                else:
                    listing.pop(name, None)
        except JournalError:
            self._listing = None

    def jobs_in(self, *states: str) -> list[JobRecord]:
        """The jobs in one of ``states``, by name (an index finds them: the queue of pending jobs is not read to
        find the running ones)."""
        marks = ", ".join("?" * len(states))
        rows = self._read(JOB_SELECT + f" WHERE state IN ({marks}) ORDER BY name", states)
        return [self._cached_job(r) for r in rows]

    def job_counts(self) -> dict[str, int]:
        """How many jobs are in each state (states with none are absent); from the index alone."""
        rows = self._read("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {str(state): int(n) for state, n in rows}

    def _job(self, r: Sequence[Any]) -> JobRecord:
        """A job row decoded (:func:`~flexmig.act.journal_rows.decode_job`)."""
        return decode_job(self.path, r)

    def _cached_job(self, r: Sequence[Any]) -> JobRecord:
        """``r`` decoded (:meth:`_job`), or the record decoded from the very same row before."""
        key = tuple(r)
        hit = self._decoded.get(key[0]) if isinstance(key[0], str) else None
        if hit is not None and hit[0] == key:
            return hit[1]
        rec = self._job(r)
        self._decoded[rec.name] = (key, rec)
        return rec
