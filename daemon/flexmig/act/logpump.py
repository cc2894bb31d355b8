"""A rank's log writer, run as a process of its own: what the rank prints reaches it through a pipe, and it writes
that to the rank's log file, rotating it at a size, so that a job can never fill the daemon's disk with its output.

Before it, a rank wrote straight into a file of the daemon's state directory: root's file, so no quota applied and
ext4's blocks reserved for root were spent too, and nothing bounded it (``/usr/bin/yes`` wrote 30 MB in 23 ms).
Now the rank holds only the write end of a pipe. This process holds the read end and the log directory (an
inherited descriptor, opened by the daemon without following links); it creates each file relative to that
descriptor with ``O_NOFOLLOW``, hands it to the job's user (``fchown``, where the daemon may) so the user's quota
counts it, and once a file reaches ``max_bytes`` renames it ``.1`` (``.1`` to ``.2``, ...), keeping ``keep`` of
them. Output it cannot write (a full disk, a quota) is dropped, never waited for (a rank blocked on a full pipe
would stall its training), and one line in the log says how many bytes were lost once writing works again.

It runs in a session of its own, so stopping a rank's process group never cuts the rank's last lines: it ends when
every process holding the pipe (the rank and whatever it started) has closed it, and it outlives a daemon that
stops or crashes, as the ranks do. It is started as a file (``python -I -S logpump.py ...``): standard library
only, nothing of flexmig imported, so it starts in milliseconds and stays small.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys

__all__ = ["RotatingLog", "main", "pump"]

_CHUNK = 64 * 1024


class RotatingLog:
    """The log file ``name`` of directory ``dir_fd``: appended to, rotated at ``max_bytes``, ``keep`` old files kept,
    each file owned by ``owner`` (uid, gid) when it can be."""

    def __init__(self, dir_fd: int, name: str, max_bytes: int, keep: int, owner: tuple[int, int] | None) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.max_bytes = max_bytes
        self.keep = keep
        self.owner = owner
        self.fd: int | None = None
        self.size = 0
        self.dropped = 0
        self.why = ""

    def _open(self, truncate: bool = False) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
        try:
            fd = os.open(self.name, flags, dir_fd=self.dir_fd)
        except FileNotFoundError:
            fd = self._create()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "the log is not a regular file")
        self.fd, self.size = fd, st.st_size
        return fd

    def _create(self) -> int:
        """A new, empty log, already its owner's when it appears under its name (made under a dot name, handed
        over with ``fchown``, then renamed into place)."""
        tmp = f".{self.name}.new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self.dir_fd)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o640, dir_fd=self.dir_fd)
        if self.owner is not None:
            with contextlib.suppress(OSError):  # a daemon without CAP_CHOWN keeps its own files
                os.fchown(fd, *self.owner)
        os.rename(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        return fd

    def rotate(self) -> None:
        """``NAME`` becomes ``NAME.1`` (and so on up to ``NAME.keep``, the oldest removed); a new ``NAME`` begins.
        With ``keep`` 0 the file is emptied instead."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.keep == 0:
            self._open(truncate=True)
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self.name}.{self.keep}", dir_fd=self.dir_fd)
        for i in range(self.keep - 1, -1, -1):
            src = self.name if i == 0 else f"{self.name}.{i}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(src, f"{self.name}.{i + 1}", src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self._open()

    def write(self, data: bytes) -> None:
        """Append ``data``, rotating whenever the file would pass ``max_bytes``; on a write error the rest is
        dropped and counted, and noted in the log once writing works again."""
        try:
            if self.dropped:
                note = f"[flexmig: {self.dropped} bytes of this rank's output were dropped: {self.why}]\n".encode()
                self.dropped = 0
                self._put(note)
            self._put(data)
        except OSError as exc:
            self.dropped += len(data)
            self.why = exc.strerror or str(exc)
            if self.fd is not None:  # opened again at the next write: the file may have been the trouble
                os.close(self.fd)
                self.fd = None

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            fd = self.fd if self.fd is not None else self._open()
            room = self.max_bytes - self.size
            if room <= 0:
                self.rotate()
                continue
            n = os.write(fd, view[:room])
            self.size += n
            view = view[n:]

    def close(self) -> None:
        """Close the file (at the end of the rank's output)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def pump(source: int, log: RotatingLog) -> None:
    """Copy ``source`` to ``log`` until every writer of the pipe has closed it."""
    try:
        while True:
            try:
                data = os.read(source, _CHUNK)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                break
            if not data:
                break
            log.write(data)
    finally:
        log.close()


def main(argv: list[str]) -> int:
    """``logpump.py DIR_FD NAME MAX_BYTES KEEP [UID GID]``: the pipe on standard input, the directory on ``DIR_FD``."""
    try:
        dir_fd, name, max_bytes, keep = int(argv[0]), argv[1], int(argv[2]), int(argv[3])
        owner = (int(argv[4]), int(argv[5])) if len(argv) >= 6 else None
    except (IndexError, ValueError):
        print("usage: logpump.py DIR_FD NAME MAX_BYTES KEEP [UID GID]", file=sys.stderr)
        return 2
    if "/" in name or name in ("", ".", "..") or max_bytes < 1 or keep < 0:
        print(f"logpump: bad log name or bounds: {name!r} {max_bytes} {keep}", file=sys.stderr)
        return 2
    pump(0, RotatingLog(dir_fd, name, max_bytes, keep, owner))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
