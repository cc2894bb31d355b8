"""Crash-safe file writes: a reader sees the old content or the new one, never a torn file.

The checkpoint hook depends on this twice: a checkpoint must never be half-written when the daemon reads the
acknowledgement that names it, and the acknowledgement itself is read by another process at any moment. The
recipe is the classic one: write a temporary file in the same directory, ``fsync`` it, ``os.replace`` it over
the target (atomic on POSIX within one file system), then ``fsync`` the directory so the rename survives a power
cut. Standard library only: training scripts import this without any of the daemon's dependencies.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_writer", "fsync_dir", "fsync_tree"]


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry (a rename or a new file) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """Flush a checkpoint a framework wrote without fsync (a file, or a directory and everything in it, then the
    directory holding it) to disk, so that it survives a power cut once acknowledged. Links are not followed."""
    root = Path(path)
    if root.is_dir() and not root.is_symlink():
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                p = Path(dirpath) / name
                if p.is_symlink():
                    continue
                fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(Path(dirpath))
    elif root.is_file() and not root.is_symlink():
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(root.parent)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: int = 0o600) -> Iterator[IO[bytes]]:
    """Yield a binary file; on a clean exit it replaces ``path`` atomically, on an exception it vanishes.

    Use it for writers that stream (``torch.save(obj, f)``). The file gets permission bits ``mode`` (owner-only
    by default: checkpoints hold the model).
    """
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        tmp.chmod(mode)
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, ``os.replace``, fsync of the directory)."""
    with atomic_writer(path, mode) as f:
        f.write(data)


def atomic_write_json(
    path: str | os.PathLike[str], obj: Any, mode: int = 0o600, default: Callable[[Any], Any] | None = None
) -> None:
    """Write ``obj`` as one line of JSON to ``path`` atomically."""
    data = json.dumps(obj, sort_keys=True, default=default).encode() + b"\n"
    atomic_write_bytes(path, data, mode)
