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
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flexmig.act.records import JOB_STATES, JobRecord, JobState, Slot
from flexmig.errors import FlexmigError
from flexmig.hook.protocol import Ack
from flexmig.jobs.spec import JobSpec

__all__ = ["ActionRow", "Journal", "JournalError", "StepEvent", "StepRow"]

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS plans(
    id INTEGER PRIMARY KEY, origin TEXT NOT NULL, notes TEXT NOT NULL, state TEXT NOT NULL,
    created_s REAL NOT NULL, finished_s REAL);
CREATE TABLE IF NOT EXISTS actions(
    id INTEGER PRIMARY KEY, plan_id INTEGER NOT NULL REFERENCES plans(id), seq INTEGER NOT NULL,
    kind TEXT NOT NULL, job TEXT, payload TEXT NOT NULL, state TEXT NOT NULL, error TEXT,
    started_s REAL, finished_s REAL);
CREATE TABLE IF NOT EXISTS steps(
    id INTEGER PRIMARY KEY, action_id INTEGER NOT NULL REFERENCES actions(id), name TEXT NOT NULL,
    args TEXT NOT NULL, state TEXT NOT NULL, result TEXT, started_s REAL NOT NULL, finished_s REAL);
CREATE TABLE IF NOT EXISTS jobs(
    name TEXT PRIMARY KEY, uid TEXT NOT NULL, spec TEXT NOT NULL, source TEXT, state TEXT NOT NULL,
    generation INTEGER NOT NULL, slots TEXT NOT NULL, resume TEXT, last_ack TEXT, master_port INTEGER NOT NULL,
    error TEXT, submitted_s REAL NOT NULL, updated_s REAL NOT NULL);
CREATE INDEX IF NOT EXISTS actions_by_state ON actions(state);
CREATE INDEX IF NOT EXISTS steps_by_action ON steps(action_id);
"""

ActionState = Literal["pending", "running", "done", "failed", "cancelled", "skipped"]
StepState = Literal["intent", "done", "failed"]


class JournalError(FlexmigError):
    """The journal database cannot be opened or is from an incompatible version."""


@dataclass(frozen=True, slots=True)
class StepEvent:
    """Passed to the journal's ``on_step`` callback after each commit (tests use it to crash at step k)."""

    phase: StepState
    action_id: int
    action_kind: str
    step: str
    count: int  # how many step commits this journal object has made, this one included


@dataclass(frozen=True, slots=True)
class ActionRow:
    """One journalled action."""

    id: int
    plan_id: int
    seq: int
    kind: str
    job: str | None
    payload: dict[str, Any]
    state: ActionState
    error: str | None
    started_s: float | None
    finished_s: float | None


@dataclass(frozen=True, slots=True)
class StepRow:
    """One journalled step of an action."""

    id: int
    action_id: int
    name: str
    args: dict[str, Any]
    state: StepState
    result: dict[str, Any] | None
    started_s: float
    finished_s: float | None


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
        """Open (or create) the journal at ``path``. ``synchronous`` below FULL is for benchmarks only."""
        if synchronous not in ("FULL", "NORMAL", "OFF"):
            raise JournalError(f"synchronous must be FULL, NORMAL or OFF, not {synchronous!r}")
        self.path = path
        self.wall = wall
        self.on_step = on_step
        self._count = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(_SCHEMA)
            row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta(key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise JournalError(f"{path}: journal schema {row[0]}, this flexmig reads {SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise JournalError(f"{path}: cannot open the journal: {exc}") from exc
        path.chmod(0o600)

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise JournalError(f"{self.path}: journal write failed: {exc}") from exc

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
        rows = self.db.execute("SELECT id FROM plans WHERE state='running' ORDER BY id").fetchall()
        return [int(r[0]) for r in rows]

    # ------------------------------------------------------------------------------------------- actions
    def actions(self, plan_id: int) -> list[ActionRow]:
        """A plan's actions in order."""
        rows = self.db.execute(
            "SELECT id, plan_id, seq, kind, job, payload, state, error, started_s, finished_s FROM actions "
            "WHERE plan_id=? ORDER BY seq",
            (plan_id,),
        ).fetchall()
        return [self._action(r) for r in rows]

    def action(self, action_id: int) -> ActionRow:
        """One action."""
        r = self.db.execute(
            "SELECT id, plan_id, seq, kind, job, payload, state, error, started_s, finished_s FROM actions WHERE id=?",
            (action_id,),
        ).fetchone()
        if r is None:
            raise JournalError(f"no action {action_id} in {self.path}")
        return self._action(r)

    def recent_actions(self, limit: int = 50) -> list[ActionRow]:
        """The newest actions, newest first."""
        rows = self.db.execute(
            "SELECT id, plan_id, seq, kind, job, payload, state, error, started_s, finished_s FROM actions "
            "ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return [self._action(r) for r in rows]

    @staticmethod
    def _action(r: Sequence[Any]) -> ActionRow:
        return ActionRow(
            id=int(r[0]),
            plan_id=int(r[1]),
            seq=int(r[2]),
            kind=str(r[3]),
            job=r[4],
            payload=json.loads(r[5]),
            state=r[6],
            error=r[7],
            started_s=r[8],
            finished_s=r[9],
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
        rows = self.db.execute(
            "SELECT id, action_id, name, args, state, result, started_s, finished_s FROM steps WHERE action_id=? "
            "ORDER BY id",
            (action_id,),
        ).fetchall()
        return [_step(r) for r in rows]

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
        r = self.db.execute(
            "SELECT id, action_id, name, args, state, result, started_s, finished_s FROM steps WHERE id=?", (step_id,)
        ).fetchone()
        if r is None:
            raise JournalError(f"no step {step_id} in {self.path}")
        return _step(r)

    def _notify(self, phase: StepState, action_id: int, kind: str, name: str) -> None:
        self._count += 1
        if self.on_step is not None:
            self.on_step(StepEvent(phase, action_id, kind, name, self._count))

    # ---------------------------------------------------------------------------------------------- jobs
    def put_job(self, job: JobRecord) -> None:
        """Insert or replace a job record."""
        with self._tx() as db:
            self._put_job(db, job)

    def _put_job(self, db: sqlite3.Connection, job: JobRecord) -> None:
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

    def get_job(self, name: str) -> JobRecord | None:
        """The record of job ``name``, if registered."""
        r = self.db.execute(_JOB_SELECT + " WHERE name=?", (name,)).fetchone()
        return _job(r) if r else None

    def jobs(self) -> list[JobRecord]:
        """Every registered job, by name."""
        return [_job(r) for r in self.db.execute(_JOB_SELECT + " ORDER BY name").fetchall()]

    def delete_job(self, name: str) -> None:
        """Forget a job (only finished ones are forgotten, by the caller's choice)."""
        with self._tx() as db:
            db.execute("DELETE FROM jobs WHERE name=?", (name,))


_JOB_SELECT = (
    "SELECT name, uid, spec, source, state, generation, slots, resume, last_ack, master_port, error, "
    "submitted_s, updated_s FROM jobs"
)


def _step(r: Sequence[Any]) -> StepRow:
    return StepRow(
        id=int(r[0]),
        action_id=int(r[1]),
        name=str(r[2]),
        args=json.loads(r[3]),
        state=r[4],
        result=json.loads(r[5]) if r[5] is not None else None,
        started_s=float(r[6]),
        finished_s=r[7],
    )


def _job(r: Sequence[Any]) -> JobRecord:
    state = str(r[4])
    if state not in JOB_STATES:
        raise JournalError(f"job {r[0]!r} has unknown state {state!r} in the journal")
    st: JobState = state  # type: ignore[assignment]
    return JobRecord(
        name=str(r[0]),
        uid=str(r[1]),
        spec=JobSpec.from_dict(json.loads(r[2]), Path(r[3]) if r[3] else None),
        state=st,
        generation=int(r[5]),
        slots=tuple(Slot.from_json(s) for s in json.loads(r[6])),
        resume=Ack.from_json(json.loads(r[7])) if r[7] else None,
        last_ack=Ack.from_json(json.loads(r[8])) if r[8] else None,
        master_port=int(r[9]),
        error=r[10],
        submitted_s=float(r[11]),
        updated_s=float(r[12]),
    )
