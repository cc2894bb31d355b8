"""The daemon's SQLite files (journal, outbox): checked before SQLite opens them, created whole, quarantined when
corrupt.

Checked (:func:`check_database_file`), each refusal one line naming the file and the fix, nothing changed:

* the file is opened with ``O_NOFOLLOW`` and judged by its ``fstat``: a symlink, a FIFO, a device are refused;
* it is owned by root or the daemon's user and writable by nobody else (a file another user planted is refused as
  it is: its mode is never "fixed" into acceptance; only a file that passed has read access for others removed);
* it is not empty and starts with SQLite's header: SQLite would take an empty file for a new database, and every
  job record would silently be gone;
* its ``-wal``, ``-shm`` and ``-journal`` companions obey the same rules (SQLite replays a write-ahead log it finds
  beside the database), and none may exist without the database.

A new database is built under a temporary name (:func:`create_database`: created 0600, schema written, closed)
and then linked into place, so the final name never holds an empty or half-made file, whatever the moment of a
crash. A corrupt one is renamed to ``NAME.corrupt-YYYYMMDDTHHMMSSZ`` (companions likewise) by :func:`quarantine`
and kept for forensics.

The directory they lie in is checked by :func:`flexmig.storage.directory.prepare_dir` first: only root and the
daemon's user can write it, so the file checked here is the file SQLite opens next.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from flexmig.errors import StorageError
from flexmig.storage.directory import trusted_owners

__all__ = [
    "COMPANIONS",
    "SQLITE_HEADER",
    "DatabaseCheck",
    "check_database_file",
    "create_database",
    "is_corruption",
    "quarantine",
    "quick_check",
]

SQLITE_HEADER = b"SQLite format 3\x00"
COMPANIONS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database (write-ahead log, its index, a rollback journal)."""
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes)
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class DatabaseCheck:
    """What :func:`check_database_file` found: whether the file exists, and whether its mode was tightened."""

    exists: bool
    tightened_from: int | None = None
    """The mode the (accepted) file had before others' read access was removed, or None if it was left alone."""


def check_database_file(path: Path, what: str) -> DatabaseCheck:
    """Check the database ``path`` and its companions by the rules of the module docstring.

    Returns ``exists=False`` when there is no file (and no companion): the caller creates it with
    :func:`create_database`. Raises :class:`~flexmig.errors.StorageError` naming ``what`` and the path otherwise.
    """
    found = _check_one(path, what, database=True)
    for suffix in COMPANIONS:
        companion = Path(f"{path}{suffix}")
        if _check_one(companion, f"{what} companion", database=False) is not None and found is None:
            raise StorageError(
                f"{what} {path}: refused: {companion} exists without the database (SQLite would replay it into a "
                f"new one); move it away"
            )
    if found is None:
        return DatabaseCheck(False)
    return DatabaseCheck(True, found if found & 0o077 else None)


def _check_one(path: Path, what: str, *, database: bool) -> int | None:
    """The mode ``path`` had if it exists and passes (others' access then removed), None if it does not exist."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(
                f"{what} {path}: refused: it is a symlink (to {os.path.realpath(path)}); the daemon opens its state "
                "files only as real files (O_NOFOLLOW)"
            ) from None
        raise StorageError(f"{what} {path}: cannot open it: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{what} {path}: refused: not a regular file")
        if st.st_uid not in trusted_owners():
            raise StorageError(
                f"{what} {path}: refused: owned by uid {st.st_uid}, not by the daemon's user (uid {os.geteuid()}) "
                "or root: someone else may have put it there; it is left as it is (inspect it, then move it away)"
            )
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise StorageError(
                f"{what} {path}: refused: mode {mode:04o} lets its group or others write it; it is left as it is "
                f"(inspect it, then chmod go-w {path})"
            )
        if database:
            if st.st_size == 0:
                raise StorageError(
                    f"{what} {path}: refused: the file is empty (0 bytes), so it holds none of the records it should; "
                    "it is not taken for a new one (move it away to start afresh)"
                )
            header = os.pread(fd, len(SQLITE_HEADER), 0)
            if header != SQLITE_HEADER:
                raise StorageError(
                    f"{what} {path}: refused: not an SQLite database (its first bytes are not SQLite's header); "
                    "it is left as it is (move it away to start afresh)"
                )
        if mode & 0o077:
            os.fchmod(fd, mode & 0o700)  # ours and writable only by us: others lose read access to our records
    except OSError as exc:
        raise StorageError(f"{what} {path}: cannot check it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return mode


def create_database(path: Path, what: str, init: Callable[[sqlite3.Connection], None]) -> None:
    """Create the database ``path`` whole: ``init`` (schema, WAL mode) runs on a temporary file, mode 0600, which
    is then linked to ``path``. StorageError if ``path`` appeared meanwhile or the directory refuses."""
    tmp = path.with_name(f".{path.name}.new")
    try:
        for leftover in (tmp, *(Path(f"{tmp}{s}") for s in COMPANIONS)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()  # a crash during an earlier creation; the directory is ours
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            init(db)
        finally:
            db.close()
        try:
            os.link(tmp, path)  # fails if path exists: never replaces a file that appeared meanwhile
        except FileExistsError:
            raise StorageError(f"{what} {path}: appeared while a new one was being created; start again") from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            if os.path.lexists(path):  # no hard links here: rename, after the same check
                raise StorageError(f"{what} {path}: appeared while a new one was being created") from None
            tmp.rename(path)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        _fsync_dir(path.parent)
    except sqlite3.Error as exc:
        raise StorageError(f"{what} {path}: cannot create it: {exc}") from None
    except OSError as exc:
        raise StorageError(f"{what} {path}: cannot create it: {exc.strerror or exc}") from None


def quarantine(path: Path, wall: Callable[[], float] = time.time) -> Path:
    """Rename the corrupt database ``path`` (and its companions) to ``NAME.corrupt-<UTC time>``; returns the new
    name. The caller closed every connection to it."""
    stamp = datetime.fromtimestamp(wall(), UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while os.path.lexists(target):
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        path.rename(target)
        for suffix in COMPANIONS:
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}{suffix}").rename(f"{target}{suffix}")
        _fsync_dir(path.parent)
    except OSError as exc:
        raise StorageError(f"cannot move the corrupt {path} aside: {exc.strerror or exc}") from None
    return target


def is_corruption(exc: BaseException) -> bool:
    """True when an SQLite error says the file is damaged (SQLITE_CORRUPT, SQLITE_NOTADB), not busy, full or gone."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _CORRUPT_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


def quick_check(db: sqlite3.Connection, limit: int = 10) -> list[str]:
    """SQLite's ``PRAGMA quick_check``: empty when the file's structure is sound, else its first ``limit``
    findings (a file too damaged to check gives the error itself)."""
    try:
        rows = db.execute(f"PRAGMA quick_check({int(limit)})").fetchall()
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    found = [str(r[0]) for r in rows]
    return [] if found == ["ok"] else found


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
