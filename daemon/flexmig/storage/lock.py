"""Exclusive locks that keep a second daemon off a state directory and off a node's GPUs.

Two daemons on one state directory adopt each other's ranks, write each other's journal and start a job twice;
two in mode ``act`` on one node reconfigure the same GPUs. So each directory the daemon keeps state in, and in mode
``act`` each GPU it may change, is held with ``flock(LOCK_EX | LOCK_NB)`` on a lock file for as long as the daemon
runs: the kernel drops the lock when the process ends, however it ends (SIGKILL included), so a stale lock file
never blocks a restart. The holder writes its pid into the file, and a daemon that finds the lock taken is refused
with a line naming that pid (read from the file, else from ``/proc/locks``).

The lock file is opened with ``O_NOFOLLOW`` and must be a regular file of root or the daemon's user, writable by
nobody else, like every state file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from flexmig.errors import StateInUseError, StorageError
from flexmig.storage.directory import trusted_owners

__all__ = ["LOCK_NAME", "DirectoryLock", "LockSet", "lock_holder"]

LOCK_NAME = "flexmigd.lock"
_PID_BYTES = 32


class DirectoryLock:
    """One held lock file. :meth:`acquire` takes it; :meth:`release` (or the process's end) lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, what: str) -> DirectoryLock:
        """Lock the file ``path`` (created 0600 if missing) for this process, or raise StateInUseError naming
        ``what`` and the pid of the daemon that holds it (StorageError if the lock file itself is unsafe)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StorageError(f"lock file {path}: refused: it is a symlink") from None
            raise StorageError(f"lock file {path}: cannot open it: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in trusted_owners() or st.st_mode & 0o022:
                raise StorageError(
                    f"lock file {path}: refused: not a regular file of the daemon's user writable only by it "
                    f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); move it away"
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _pid_in(fd) or lock_holder(st)
                who = f"pid {pid}" if pid else "a process whose pid could not be read"
                raise StateInUseError(
                    f"{what} is in use by another flexmigd ({who}, lock {path}): two daemons must never share it; "
                    "stop that one first, or give this one its own"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        """True until released."""
        return self._fd is not None

    def release(self) -> None:
        """Let the lock go (idempotent). The file stays: removing it would race with the next daemon's open."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)


def _pid_in(fd: int) -> int | None:
    try:
        text = os.pread(fd, _PID_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock_holder(st: os.stat_result, proc_locks: Path = Path("/proc/locks")) -> int | None:
    """The pid holding a ``flock`` on the file with this ``stat``, from ``/proc/locks`` (None if not found)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = proc_locks.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:02:131 0 EOF" (a "->" after the number marks a waiter)
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if fields[5] == want and fields[4].isdigit():
            return int(fields[4])
    return None


class LockSet:
    """The locks one daemon holds, by lock file: taking one it already holds only counts (the journal and the
    outbox may share a directory), and it is let go when the last holder drops it."""

    def __init__(self) -> None:
        self._held: dict[Path, tuple[DirectoryLock, int]] = {}

    def take(self, path: Path, what: str) -> Path:
        """Hold the lock file ``path`` (see :meth:`DirectoryLock.acquire`); returns its key for :meth:`drop`."""
        key = Path(os.path.realpath(Path(path).parent)) / Path(path).name  # the file itself: never followed
        lock, count = self._held.get(key, (None, 0))
        if lock is None:
            lock = DirectoryLock.acquire(key, what)
        self._held[key] = (lock, count + 1)
        return key

    def take_dir(self, directory: Path, what: str) -> Path:
        """Hold ``directory``'s lock (``directory/flexmigd.lock``)."""
        return self.take(Path(directory) / LOCK_NAME, f"{what} {directory}")

    def drop(self, key: Path) -> None:
        """Give back one hold of ``key``; the lock goes with the last."""
        lock, count = self._held.get(key, (None, 0))
        if lock is None:
            return
        if count <= 1:
            del self._held[key]
            lock.release()
        else:
            self._held[key] = (lock, count - 1)

    def held(self) -> list[Path]:
        """The lock files held now."""
        return sorted(self._held)

    def close(self) -> None:
        """Let every lock go."""
        for lock, _ in self._held.values():
            lock.release()
        self._held.clear()
