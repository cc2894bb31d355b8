"""The journal's rows: its schema, the dataclasses of its rows, and the checked decoding of each column.

A row read back is decoded field by field (:class:`Fields`): a corrupt or planted row is one :class:`JournalError`
line naming the journal, the row and the field, never a ValueError out of a start. :mod:`flexmig.act.journal`
reads and writes them.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from flexmig.act.records import JOB_STATES, JobRecord, Slot
from flexmig.errors import JobSpecError, JournalError
from flexmig.hook.boundedjson import JsonBoundsError
from flexmig.hook.boundedjson import loads as bounded_loads
from flexmig.hook.protocol import Ack
from flexmig.jobspec.spec import JobSpec

__all__ = [
    "ACTION_SELECT",
    "ACTION_STATES",
    "JOB_SELECT",
    "SCHEMA",
    "SCHEMA_VERSION",
    "STEP_SELECT",
    "STEP_STATES",
    "TABLES",
    "ActionRow",
    "ActionState",
    "Fields",
    "RankRecord",
    "StepEvent",
    "StepRow",
    "StepState",
    "create_schema",
    "decode_job",
]

_MAX_ROW_JSON = 4 * 1024 * 1024  # a spec's argv alone may hold 256 arguments of 4,096 characters
_MAX_ROW_DEPTH = 32

SCHEMA_VERSION = 1
SCHEMA = """
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
CREATE TABLE IF NOT EXISTS ranks(
    job_uid TEXT NOT NULL, generation INTEGER NOT NULL, slot INTEGER NOT NULL, pid INTEGER NOT NULL,
    started REAL NOT NULL, uid INTEGER NOT NULL, PRIMARY KEY(job_uid, generation, slot));
CREATE INDEX IF NOT EXISTS actions_by_state ON actions(state);
CREATE INDEX IF NOT EXISTS steps_by_action ON steps(action_id);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
"""

ActionState = Literal["pending", "running", "done", "failed", "cancelled", "skipped"]
StepState = Literal["intent", "done", "failed"]


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
class RankRecord:
    """A rank as launched: its pid, when it started (psutil's ``create_time``) and its real user ID."""

    pid: int
    started: float
    uid: int


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


JOB_SELECT = (
    "SELECT name, uid, spec, source, state, generation, slots, resume, last_ack, master_port, error, "
    "submitted_s, updated_s FROM jobs"
)


ACTION_SELECT = "SELECT id, plan_id, seq, kind, job, payload, state, error, started_s, finished_s FROM actions"
STEP_SELECT = "SELECT id, action_id, name, args, state, result, started_s, finished_s FROM steps"
TABLES = frozenset({"meta", "plans", "actions", "steps", "jobs"})
ACTION_STATES: tuple[str, ...] = ("pending", "running", "done", "failed", "cancelled", "skipped")
STEP_STATES: tuple[str, ...] = ("intent", "done", "failed")


def create_schema(db: sqlite3.Connection) -> None:
    """A new journal's tables and schema version, in WAL mode (run on the file before it takes its name)."""
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript("BEGIN;" + SCHEMA + "COMMIT;")
    db.execute("INSERT INTO meta(key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))


def _slots(value: Any) -> tuple[Slot, ...]:
    if not isinstance(value, list):
        raise ValueError(f"must be a list of instances, not {type(value).__name__}")
    out = []
    for i, s in enumerate(value):
        if not isinstance(s, dict):
            raise ValueError(f"item {i} must be an object, not {type(s).__name__}")
        try:
            out.append(Slot.from_json(s))
        except KeyError as exc:
            raise ValueError(f"item {i} lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"item {i}: {exc}") from None
    return tuple(out)


def _ack(value: Any) -> Ack:
    if not isinstance(value, dict):
        raise ValueError(f"must be an object, not {type(value).__name__}")
    try:
        return Ack.from_json(value)
    except KeyError as exc:
        raise ValueError(f"lacks {exc.args[0]!r}") from None


class Fields:
    """Decodes the columns of one journal row; each failure is one JournalError line naming journal, row, field."""

    def __init__(self, path: Path, table: str, key: object) -> None:
        self.path = path
        self.row = f"{table} row {str(key)[:80]!r}" if isinstance(key, str) else f"{table} row {key}"

    def bad(self, field: str, why: str) -> JournalError:
        return JournalError(f"{self.path}: {self.row}: {field}: {why}")

    def text(self, field: str, value: Any, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.bad(field, f"must be text, not {_shown(value)}")
        return value

    def integer(self, field: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.bad(field, f"must be an integer, not {_shown(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.bad(field, f"{value} is out of range")
        return value

    def number(self, field: str, value: Any, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
            raise self.bad(field, f"must be a number, not {_shown(value)}")
        return float(value)

    def choice(self, field: str, value: Any, allowed: tuple[str, ...]) -> str:
        if value not in allowed:
            raise self.bad(field, f"unknown state {_shown(value)} (known: {', '.join(allowed)})")
        return str(value)

    def json_value(self, field: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise self.bad(field, f"must be JSON text, not {_shown(value)}")
        try:  # bounded: a corrupt or planted row is one line naming it, never a ValueError out of a start
            return bounded_loads(value, max_bytes=_MAX_ROW_JSON, max_depth=_MAX_ROW_DEPTH)
        except JsonBoundsError as exc:
            if str(exc).startswith("nests deeper"):
                raise self.bad(field, "JSON nested too deeply") from None
            raise self.bad(field, f"not valid JSON ({str(exc).removeprefix('not JSON: ')})") from None

    def json_object(self, field: str, value: Any, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        data = self.json_value(field, value)
        if not isinstance(data, dict):
            raise self.bad(field, f"must be a JSON object, not {type(data).__name__}")
        return data

    def decode(self, field: str, value: Any, how: Callable[[Any], Any], *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        data = self.json_value(field, value)
        try:
            return how(data)
        except (TypeError, ValueError) as exc:
            raise self.bad(field, str(exc)) from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def decode_job(path: Path, r: Sequence[Any]) -> JobRecord:
    """A job row decoded, its spec checked again as a spec file's structure is (JobSpec.from_dict); one
    JournalError line naming the row and field otherwise (never the spec file it once came from)."""
    name = r[0]
    f = Fields(path, "jobs", name)
    name = f.text("name", name)
    source = f.text("source", r[3], optional=True)
    data = f.json_object("spec", r[2])
    try:
        spec = JobSpec.from_dict(data, None)
    except JobSpecError as exc:
        problems = (line.removeprefix("<job spec>: ") for line in str(exc).splitlines())
        raise f.bad("spec", "; ".join(problems)) from None  # every problem of the spec, on the row's one line
    except (RecursionError, TypeError, ValueError) as exc:
        raise f.bad("spec", f"does not decode: {exc}") from None
    if spec.name != name:
        raise f.bad("spec", f"names job {spec.name!r}, not the row's {name!r}")
    if source:
        spec = replace(spec, source=Path(source))
    return JobRecord(
        name=name,
        uid=f.text("uid", r[1]),
        spec=spec,
        state=f.choice("state", r[4], JOB_STATES),  # type: ignore[arg-type]
        generation=f.integer("generation", r[5], lo=0),
        slots=f.decode("slots", r[6], _slots),
        resume=f.decode("resume", r[7], _ack, optional=True),
        last_ack=f.decode("last_ack", r[8], _ack, optional=True),
        master_port=f.integer("master_port", r[9], lo=0, hi=65535),
        error=f.text("error", r[10], optional=True),
        submitted_s=f.number("submitted_s", r[11]),
        updated_s=f.number("updated_s", r[12]),
    )
