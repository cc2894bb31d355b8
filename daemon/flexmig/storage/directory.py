"""A state directory the daemon may keep its journal, outbox and locks in: one that nobody else can change.

Refused, naming the directory: a symlink (it is opened with ``O_NOFOLLOW|O_DIRECTORY`` and judged by its
``fstat``), anything but a directory, a directory owned by someone other than root or the daemon's user, one its
group or others may write, and one below a directory that others could change
(:func:`flexmig.security.resolve_trusted`). A missing state directory is created, mode 0700. Nothing here ever
changes the mode or owner of what it finds: a directory that fails is refused as it is.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from flexmig.errors import StorageError
from flexmig.security import UnsafePathError, resolve_trusted

__all__ = ["prepare_dir", "trusted_owners"]


def trusted_owners() -> frozenset[int]:
    """Who may own the daemon's state: root, and the user the daemon runs as."""
    return frozenset({0, os.geteuid()})


def prepare_dir(path: Path, what: str = "state directory", *, create: bool = True, mode: int = 0o700) -> Path:
    """Check (and with ``create``, first make, with ``mode``) the directory ``path``; returns it as an absolute path.

    Raises :class:`~flexmig.errors.StorageError` with one line naming ``what``, the path and the fix. Blocks on the
    file system (a few ``stat`` calls).
    """
    path = Path(os.path.normpath(Path(path).absolute()))
    if create and not os.path.lexists(path):
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            path.mkdir(mode=mode)
        except FileExistsError:
            pass  # made meanwhile (a racing daemon): judged below like any directory we find
        except OSError as exc:
            raise StorageError(f"{what} {path}: cannot create it: {exc.strerror or exc}") from None
    try:
        resolve_trusted(path)
    except UnsafePathError as exc:
        raise StorageError(f"{what} {path}: refused: {exc.why}") from None
    except FileNotFoundError:
        raise StorageError(f"{what} {path}: no such directory") from None
    except OSError as exc:
        raise StorageError(f"{what} {path}: cannot use it: {exc.strerror or exc}") from None
    try:
        if path.is_symlink():  # O_DIRECTORY would call it "not a directory"
            raise OSError(errno.ELOOP, "is a symlink")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(
                f"{what} {path}: refused: it is a symlink (to {os.path.realpath(path)}); the daemon keeps its state "
                "only in a real directory: configure the link's target instead"
            ) from None
        if exc.errno == errno.ENOTDIR:
            raise StorageError(f"{what} {path}: refused: not a directory") from None
        raise StorageError(f"{what} {path}: cannot use it: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    problem = directory_problem(path, st)
    if problem:
        raise StorageError(f"{what} {path}: refused: {problem}")
    return path


def directory_problem(path: Path, st: os.stat_result) -> str | None:
    """Why the state directory ``path``, with this ``fstat``, is unsafe, or None."""
    mode = stat.S_IMODE(st.st_mode)
    owners = trusted_owners()
    if st.st_uid not in owners:
        return (
            f"owned by uid {st.st_uid}, not by the daemon's user (uid {os.geteuid()}) or root: someone else could "
            "put files of their choosing in it (chown it to the daemon's user, or move it away)"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"mode {mode:04o} lets its group or others write in it (chmod go-w {path})"
    return None
