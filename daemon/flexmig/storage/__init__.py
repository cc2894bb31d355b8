"""The daemon's own files on disk: its state directory, SQLite databases (journal, outbox) and locks.

A root daemon that trusts a file someone else could plant runs that someone's commands, so every state file is
checked before it is used, and the checks live here once for the journal and the outbox alike:

* :mod:`~flexmig.storage.directory`: a state directory is a real directory (not a symlink), owned by root or the
  daemon's user, writable by nobody else, and so are the directories above it;
* :mod:`~flexmig.storage.database`: an existing database file is a real file (opened with ``O_NOFOLLOW`` and
  judged by its ``fstat``), ours, writable by nobody else, not empty, and an SQLite file; a new one is built under
  a temporary name and linked into place complete, so a crash never leaves an empty or schema-less file behind;
  a corrupt one is quarantined (renamed, kept for forensics);
* :mod:`~flexmig.storage.lock`: an exclusive lock per state directory and per GPU, so a second daemon is refused
  with the first one's pid.
"""

from flexmig.storage.database import (
    DatabaseCheck,
    check_database_file,
    create_database,
    is_corruption,
    quarantine,
    quick_check,
)
from flexmig.storage.directory import prepare_dir
from flexmig.storage.lock import DirectoryLock, LockSet, lock_holder

__all__ = [
    "DatabaseCheck",
    "DirectoryLock",
    "LockSet",
    "check_database_file",
    "create_database",
    "is_corruption",
    "lock_holder",
    "prepare_dir",
    "quarantine",
    "quick_check",
]
