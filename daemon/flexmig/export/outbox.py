"""The persistent outbox: events wait here, on disk, until the broker has acknowledged them.

The publisher writes every event here *before* it tries to send it and deletes it only after the broker's PUBACK,
so a broker outage, a crash or a SIGKILL of the daemon loses nothing; at worst an event is sent twice (the
broker acknowledged it but the daemon died before deleting it), which consumers absorb by de-duplicating on the
event ID. SQLite in WAL mode with ``synchronous=FULL``: a committed event survives a power cut too.

One connection, used from the event loop's thread only; each call is one short transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from flexmig.errors import OutboxError
from flexmig.export.events import Event

__all__ = ["Outbox", "StoredEvent"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    id      TEXT NOT NULL UNIQUE,
    kind    TEXT NOT NULL,
    created REAL NOT NULL,
    body    TEXT NOT NULL
)
"""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event waiting in the outbox: its ID, kind (the topic's last level) and the JSON to publish."""

    seq: int
    id: str
    kind: str
    body: str


class Outbox:
    """A FIFO of serialised events in one SQLite file. ``max_events`` bounds it: past that, the oldest go."""

    def __init__(self, path: Path, *, max_events: int = 1_000_000) -> None:
        self.path = path
        self.max_events = max_events
        self.dropped = 0
        try:
            self._db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
            (self._count,) = self._db.execute("SELECT count(*) FROM outbox").fetchone()
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {path}: cannot open: {exc}") from exc

    def put(self, event: Event) -> None:
        """Store ``event`` durably (a second put of the same ID is a no-op). Raises OutboxError (disk full...)."""
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO outbox (id, kind, created, body) VALUES (?, ?, ?, ?)",
                    (event.id, event.kind.value, event.at, event.to_json()),
                )
                count = self._count + cur.rowcount
                excess = count - self.max_events
                if excess > 0:
                    self._db.execute(
                        "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?)", (excess,)
                    )
                    count -= excess
            self._count = count
            self.dropped += max(0, excess)
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {self.path}: cannot store event {event.id}: {exc}") from exc

    def peek(self, limit: int = 100) -> list[StoredEvent]:
        """The oldest ``limit`` events, oldest first, still stored."""
        try:
            rows = self._db.execute("SELECT seq, id, kind, body FROM outbox ORDER BY seq LIMIT ?", (limit,)).fetchall()
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {self.path}: cannot read: {exc}") from exc
        return [StoredEvent(*row) for row in rows]

    def delete(self, event_id: str) -> None:
        """Forget an event the broker acknowledged."""
        try:
            cur = self._db.execute("DELETE FROM outbox WHERE id = ?", (event_id,))
            self._count -= cur.rowcount
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {self.path}: cannot delete event {event_id}: {exc}") from exc

    def ids(self) -> list[str]:
        """Every stored event ID, oldest first (for tests and ``flexmig`` diagnostics)."""
        return [s.id for s in self.peek(limit=-1)]

    def __len__(self) -> int:
        return int(self._count)

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._db.close()
