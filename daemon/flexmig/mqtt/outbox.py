"""The persistent outbox: events wait here, on disk, until the broker has acknowledged them.

The publisher writes every event here *before* it tries to send it and deletes it only after the broker's PUBACK,
so a broker outage, a crash or a SIGKILL of the daemon loses nothing; at worst an event is sent twice (the
broker acknowledged it but the daemon died before deleting it), which consumers absorb by de-duplicating on the
event ID. SQLite in WAL mode with ``synchronous=FULL``: a committed event survives a power cut too.

The file is the daemon's own state and is checked as such before it is opened (:mod:`flexmig.storage`): a
symlink, a file of another user or one others may write, an empty file, and an SQLite file without the outbox's
table are refused, naming the file; a new outbox is created whole, mode 0600.

Size: the stored events' JSON may take at most ``max_bytes`` (``mqtt.outbox_max_bytes``); past that the oldest
are dropped, counted (:attr:`Outbox.dropped`) and logged at most once a minute.

Corruption is a storage fault, never the broker's: when SQLite finds the file damaged, at open (``quick_check``)
or in any read or write, the outbox moves it aside as ``NAME.corrupt-<UTC time>`` (kept for inspection), salvages
every event it can still read (seeking past the unreadable pages), says so in one error line, counts it
(:attr:`Outbox.corruptions`, :attr:`Outbox.lost`) and goes on with a fresh file holding the salvaged events.

One connection, used from the event loop's thread only; each call is one short transaction.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from flexmig.errors import OutboxError, StorageError
from flexmig.mqtt.droplog import DropLog
from flexmig.mqtt.events import Event
from flexmig.storage import check_database_file, create_database, is_corruption, prepare_dir, quarantine, quick_check

__all__ = ["DEFAULT_MAX_BYTES", "Outbox", "StoredEvent"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""``mqtt.outbox_max_bytes``'s default: a day of a busy node's events many times over."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    id      TEXT NOT NULL UNIQUE,
    kind    TEXT NOT NULL,
    created REAL NOT NULL,
    body    TEXT NOT NULL
)
"""
# Every statement that reads sizes, written out once (constants: no input goes into SQL text).
_TOTALS = "SELECT count(*), COALESCE(SUM(length(CAST(body AS BLOB))), 0) FROM outbox"
_OLDEST_SIZES = "SELECT seq, length(CAST(body AS BLOB)) FROM outbox WHERE seq > ? ORDER BY seq LIMIT 512"
_DELETE_SIZED = "DELETE FROM outbox WHERE id = ? RETURNING length(CAST(body AS BLOB))"
_MAX_SALVAGE_SEEKS = 4096  # bounds the work on a badly damaged file
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event waiting in the outbox: its ID, kind (the topic's last level) and the JSON to publish."""

    seq: int
    id: str
    kind: str
    body: str


class Outbox:
    """A FIFO of serialised events in one SQLite file, bounded by ``max_bytes`` of event JSON (oldest go first)."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        wall: Callable[[], float] = time.time,
        logger: logging.Logger | None = None,
    ) -> None:
        """Open (or create) the outbox at ``path``; OutboxError naming the file when it is refused or unusable.
        ``wall`` stamps the name of a quarantined file."""
        if max_bytes < 1:
            raise OutboxError(f"outbox {path}: max_bytes must be positive, not {max_bytes}")
        self.path = path = Path(path)
        self.max_bytes = max_bytes
        self.dropped = 0
        """Events dropped, oldest first, because the outbox was full."""
        self.corruptions = 0
        """Times the file was found corrupt and replaced by a fresh one."""
        self.lost = 0
        """Events on unreadable pages of corrupt files, counted by their sequence numbers where those tell."""
        self.quarantined: list[Path] = []
        """Where the corrupt files went."""
        self._wall = wall
        self._log = logger or log
        self._drops = DropLog(self._log)
        self._db = self._open()
        self._count, self._bytes = self._totals()

    # ------------------------------------------------------------------------------------------ opening
    def _open(self) -> sqlite3.Connection:
        path = self.path
        if not path.parent.is_dir():
            raise OutboxError(f"outbox {path}: cannot open: directory {path.parent} does not exist")
        try:
            prepare_dir(path.parent, "outbox directory", create=False)
            if not check_database_file(path, "outbox").exists:
                create_database(path, "outbox", _create_schema)
        except StorageError as exc:
            raise OutboxError(str(exc)) from None
        try:
            db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {path}: cannot open: {exc}") from exc
        try:
            tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "outbox" not in tables:
                db.close()
                shown = f": it has {', '.join(sorted(tables))}" if tables else ""
                raise OutboxError(
                    f"outbox {path}: refused: the file holds no flexmig outbox (no 'outbox' table{shown}); it is "
                    "left as it is (point mqtt.outbox elsewhere, or move it away)"
                )
            damage = quick_check(db)
            if damage:
                db.close()
                return self._recover("; ".join(damage[:3]))
            _settings(db)
        except sqlite3.DatabaseError as exc:
            db.close()
            if is_corruption(exc):
                return self._recover(str(exc))
            raise OutboxError(f"outbox {path}: cannot open: {exc}") from exc
        return db

    def _totals(self) -> tuple[int, int]:
        def count(db: sqlite3.Connection) -> tuple[int, int]:
            n, size = db.execute(_TOTALS).fetchone()
            return int(n), int(size)

        return self._run("cannot read", count)

    # ------------------------------------------------------------------------------------------ corruption
    def _recover(self, cause: str) -> sqlite3.Connection:
        """Quarantine the damaged file, salvage what reads, go on with a fresh file holding it (see module doc)."""
        path = self.path
        try:
            moved = quarantine(path, self._wall)
        except StorageError as exc:
            raise OutboxError(f"outbox {path} is corrupt ({cause}) and {exc}") from None
        rows, lost = _salvage(moved)
        try:
            create_database(path, "outbox", _create_schema)
            db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
            _settings(db)
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR IGNORE INTO outbox (seq, id, kind, created, body) VALUES (?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        except (StorageError, sqlite3.Error) as exc:
            raise OutboxError(f"outbox {path} is corrupt ({cause}); moved to {moved}, but {exc}") from None
        self.corruptions += 1
        self.lost += lost
        self.quarantined.append(moved)
        gone = f", about {lost} lost with the unreadable pages" if lost else ""
        self._log.error(
            "outbox %s is corrupt (%s): a storage fault, not the broker's; moved to %s for inspection; %d event(s) "
            "salvaged%s; going on with a fresh outbox",
            path,
            cause,
            moved,
            len(rows),
            gone,
        )
        return db

    def _run(self, what: str, op: Callable[[sqlite3.Connection], T]) -> T:
        """``op`` on the database; a corrupt file is recovered (module doc) and ``op`` run once more on the fresh
        one. OutboxError for any other SQLite failure (disk full, I/O error)."""
        try:
            return op(self._db)
        except sqlite3.DatabaseError as exc:
            if not is_corruption(exc):
                raise OutboxError(f"outbox {self.path}: {what}: {exc}") from exc
            cause = str(exc)
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {self.path}: {what}: {exc}") from exc
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        self._db = self._recover(cause)
        n, size = self._db.execute(_TOTALS).fetchone()
        self._count, self._bytes = int(n), int(size)
        try:
            return op(self._db)
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox {self.path}: {what}: {exc}") from exc

    # ------------------------------------------------------------------------------------------ events
    def put(self, event: Event) -> None:
        """Store ``event`` durably (a second put of the same ID is a no-op). Raises OutboxError (disk full...)."""
        body = event.to_json()
        size = len(body.encode())

        def insert(db: sqlite3.Connection) -> tuple[int, int, int]:
            db.execute("BEGIN IMMEDIATE")
            try:
                cur = db.execute(
                    "INSERT OR IGNORE INTO outbox (id, kind, created, body) VALUES (?, ?, ?, ?)",
                    (event.id, event.kind.value, event.at, body),
                )
                added = max(0, cur.rowcount)
                dropped, freed = self._make_room(db, self._bytes + size * added - self.max_bytes, cur.lastrowid)
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
            return added, dropped, freed

        added, dropped, freed = self._run(f"cannot store event {event.id}", insert)
        self._count += added - dropped
        self._bytes += size * added - freed
        if dropped:
            self.dropped += dropped
            self._drops.dropped(
                "full",
                dropped,
                f"outbox {self.path} is full (mqtt.outbox_max_bytes = {self.max_bytes}): oldest events dropped",
            )

    @staticmethod
    def _make_room(db: sqlite3.Connection, excess: int, newest: int | None) -> tuple[int, int]:
        """Delete the oldest events until ``excess`` bytes are freed (never the event just stored)."""
        if excess <= 0:
            return 0, 0
        freed = dropped = 0
        last = -1
        while freed < excess:
            batch = db.execute(_OLDEST_SIZES, (last,)).fetchall()
            taken = 0
            for seq, n in batch:
                if freed >= excess or seq == newest:
                    break
                freed += int(n)
                dropped += 1
                taken += 1
                last = int(seq)
            if taken < len(batch) or not batch:
                break
        if dropped:
            db.execute("DELETE FROM outbox WHERE seq <= ?", (last,))
        return dropped, freed

    def peek(self, limit: int = 100) -> list[StoredEvent]:
        """The oldest ``limit`` events, oldest first, still stored."""

        def read(db: sqlite3.Connection) -> list[Any]:
            return db.execute("SELECT seq, id, kind, body FROM outbox ORDER BY seq LIMIT ?", (limit,)).fetchall()

        return [StoredEvent(*row) for row in self._run("cannot read", read)]

    def delete(self, event_id: str) -> None:
        """Forget an event the broker acknowledged."""

        def remove(db: sqlite3.Connection) -> list[Any]:
            return db.execute(_DELETE_SIZED, (event_id,)).fetchall()

        rows = self._run(f"cannot delete event {event_id}", remove)
        self._count -= len(rows)
        self._bytes -= sum(int(r[0]) for r in rows)

    def ids(self) -> list[str]:
        """Every stored event ID, oldest first (for tests and ``flexmig`` diagnostics)."""
        return [s.id for s in self.peek(limit=-1)]

    @property
    def size_bytes(self) -> int:
        """Bytes of event JSON stored now (what ``max_bytes`` bounds)."""
        return self._bytes

    def __len__(self) -> int:
        return int(self._count)

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._db.close()


def _create_schema(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(_SCHEMA)


def _settings(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")


def _salvage(path: Path) -> tuple[list[tuple[Any, ...]], int]:
    """The events still readable in the corrupt outbox ``path``, in order, and how many of its sequence numbers
    between (and after) readable events could not be read (the events lost: the outbox only ever loses its
    oldest events otherwise, so its sequence numbers run without gaps from the first stored event on)."""
    try:
        db = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True)
    except sqlite3.Error:
        return [], 0
    rows: list[tuple[Any, ...]] = []
    lost = 0
    try:
        try:
            found = db.execute("SELECT seq FROM sqlite_sequence WHERE name='outbox'").fetchone()
            top = int(found[0]) if found else None
        except sqlite3.Error:
            top = None
        pos, seeks = 0, 0
        while seeks < _MAX_SALVAGE_SEEKS:
            try:
                for row in db.execute(
                    "SELECT seq, id, kind, created, body FROM outbox WHERE seq >= ? ORDER BY seq", (pos,)
                ):
                    rows.append(tuple(row))
                    pos = int(row[0]) + 1
                break
            except sqlite3.DatabaseError:
                if top is None or pos > top:
                    break
                nxt, used = _next_readable(db, pos, top)
                seeks += used
                skipped = (top + 1 if nxt is None else nxt) - pos
                if rows:  # before the first readable event, skipped numbers may be events sent long ago
                    lost += skipped
                if nxt is None:
                    break
                pos = nxt
    except sqlite3.Error:
        pass
    finally:
        db.close()
    return rows, lost


def _next_readable(db: sqlite3.Connection, pos: int, top: int) -> tuple[int | None, int]:
    """The smallest sequence number in (pos, top] from which a scan can start (past the unreadable page), found
    by doubling then bisecting; None if none. Also returns how many seeks it took."""
    seeks = 0

    def readable(seq: int) -> bool:
        nonlocal seeks
        seeks += 1
        try:
            db.execute("SELECT seq FROM outbox WHERE seq >= ? ORDER BY seq LIMIT 1", (seq,)).fetchone()
        except sqlite3.DatabaseError:
            return False
        return True

    step = 1
    while pos + step <= top and not readable(pos + step):
        step *= 2
    hi = min(pos + step, top)
    if hi == pos + step and hi <= top:
        lo = pos + step // 2 if step > 1 else pos
    elif readable(top):
        lo = pos + step // 2
    else:
        return None, seeks
    while hi - lo > 1:  # lo unreadable (or pos), hi readable
        mid = (lo + hi) // 2
        if readable(mid):
            hi = mid
        else:
            lo = mid
    return hi, seeks
