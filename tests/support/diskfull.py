"""A real small file system that tests fill and free (not a test module): a tmpfs mounted under a test's directory.

``with Tmpfs(path, size_mib=16) as fs:`` mounts it (root can; where ``mount`` is refused the test fails, naming why:
these tests must not pass by being skipped); ``fs.fill()`` writes a filler file until the file system says ENOSPC
(down to the last byte), ``fs.free()`` deletes it. On exit it is unmounted (lazily, so a rank log a job still
holds open cannot keep it mounted).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import pytest


class Tmpfs:
    """A tmpfs at ``path`` of ``size_mib`` MiB."""

    def __init__(self, path: Path, size_mib: int = 16, mode: int = 0o700) -> None:
        self.path = path
        self.size_mib = size_mib
        self.mode = mode
        self.filler = path / ".filler"
        self.fills = 0

    def __enter__(self) -> Tmpfs:
        self.path.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m,mode={self.mode:o}", "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if out.returncode != 0:
            pytest.fail(
                f"cannot mount a tmpfs at {self.path} for the disk-full tests ({out.stderr.strip() or out.returncode});"
                " they need root with CAP_SYS_ADMIN (as CI has), and must not be skipped"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30, check=False)

    def fill(self) -> int:
        """Fill the file system to the last byte; returns the bytes written."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        n = os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    written += n
        finally:
            os.close(fd)
        self.fills += 1
        return written

    def free(self) -> None:
        """Give the space back."""
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    @property
    def full(self) -> bool:
        return self.filler.exists()
