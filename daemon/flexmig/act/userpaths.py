"""Paths a job's user can change, used by a daemon that runs as root, with no window between a check and its use.

A job's user owns its checkpoint directory and everything in it, and often the directories above it. Between the
moment root looks at such a path and the moment it acts on it, the user can put a symlink in its place (a
``renameat2(RENAME_EXCHANGE)`` loop wins such races almost every time), so root never acts on these paths by name:

* a directory is opened from ``/`` with no symlink followed anywhere on the way: ``openat2(2)`` with
  ``RESOLVE_NO_SYMLINKS`` where the kernel has it (Linux 5.6), else one ``openat(O_NOFOLLOW)`` per component.
  Job specs store their directories resolved (``realpath`` when submitted), so a symlink found later is something
  the user changed since, and it is refused, naming the path;
* everything else is done relative to that descriptor: a file is read with ``O_NOFOLLOW`` (:func:`read_ack` takes
  the descriptor), removed with ``unlinkat`` (which never follows the last component), and a checkpoint the job
  names is resolved with ``openat2(RESOLVE_BENEATH)``, so symlinks inside the checkpoint directory work but never
  lead out of it;
* a missing directory is made with ``mkdirat`` relative to its parent's descriptor, opened again with
  ``O_DIRECTORY|O_NOFOLLOW``, checked (a directory, ours) and only then handed to the job's user with
  ``fchown``/``fchmod`` on that descriptor: the kernel changes exactly the directory that was checked.

This is what systemd's ``chase()`` and OpenSSH's ``safe_path()`` do for the same reason. Used by the checkpoint
steps, the settling of late acknowledgements, the launcher (checkpoint directories, rank logs) and the Slurm side's
acknowledgement reader; a standby generation's ranks go through the same helpers.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexmig.errors import UserPathError
from flexmig.hook.protocol import Ack, AckError, read_ack

__all__ = [
    "UserPathError",
    "clear_ack",
    "ensure_dir",
    "has_entries",
    "open_dir",
    "opened_dir",
    "read_ack_in",
    "remove_in",
    "resolve_beneath",
]

_SYS_OPENAT2 = 437  # the same number on every architecture (a syscall added after the tables were unified)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_AT_FDCWD = -100
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@dataclass
class _Openat2:
    """``openat2(2)`` through libc's ``syscall``, or None where this kernel (or a seccomp filter) lacks it."""

    call: Any = None
    tried: bool = False


_OPENAT2 = _Openat2()


def _openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int | None:
    """The descriptor, or None when openat2 is not available here; OSError as open(2) raises it."""
    if not _OPENAT2.tried:
        _OPENAT2.tried = True
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.syscall
            fn.restype = ctypes.c_long
            _OPENAT2.call = fn
    if _OPENAT2.call is None:
        return None
    how = _OpenHow(flags=flags, mode=0, resolve=resolve)
    fd = int(
        _OPENAT2.call(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd >= 0:
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM):
        _OPENAT2.call = None  # no openat2 here (an old kernel, a container's seccomp filter): walk from now on
        return None
    raise OSError(err, os.strerror(err), path)


def _parts(path: Path) -> list[str]:
    text = os.fspath(path)
    if not text.startswith("/") or os.path.normpath(text) != text:
        raise UserPathError(f"{path}: not an absolute, normalised path")
    return [p for p in text.split("/") if p]


def _refusal(path: Path, at: str, exc: OSError) -> UserPathError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(at).st_mode):
                return UserPathError(
                    f"{path}: {at} is a symbolic link; flexmig follows no symlink in a job's directories (it "
                    "stores them resolved when the job is submitted), so it was changed since: refused"
                )
        return UserPathError(f"{path}: {at} is not a directory; refused")
    return UserPathError(f"{path}: cannot open {at}: {exc.strerror}")


def open_dir(path: Path) -> int:
    """A descriptor (``O_RDONLY|O_DIRECTORY``) of the directory ``path``, reached from ``/`` with no symlink
    followed. FileNotFoundError when a component is missing, PermissionError when the daemon may not open it;
    UserPathError for a symlink or a non-directory on the way (or another reason it cannot be opened). The caller
    closes it (or uses :func:`opened_dir`)."""
    parts = _parts(path)
    try:
        fd = _openat2(_AT_FDCWD, str(path), _DIR_FLAGS, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    except (FileNotFoundError, PermissionError):
        raise
    except OSError as exc:
        raise _first_bad(path, parts, exc) from None
    if fd is not None:
        return fd
    fd = os.open("/", _DIR_FLAGS)
    at = ""
    try:
        for part in parts:
            at = f"{at}/{part}"
            try:
                nfd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except (FileNotFoundError, PermissionError):
                raise
            except OSError as exc:
                raise _refusal(path, at, exc) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _first_bad(path: Path, parts: list[str], exc: OSError) -> UserPathError:
    """The refusal naming the first component of ``path`` that is a symlink or not a directory."""
    at = ""
    for part in parts:
        at = f"{at}/{part}"
        try:
            st = os.lstat(at)
        except OSError:
            break
        if not stat.S_ISDIR(st.st_mode):
            return _refusal(path, at, OSError(errno.ELOOP if stat.S_ISLNK(st.st_mode) else errno.ENOTDIR, ""))
    return _refusal(path, str(path), exc)


@contextlib.contextmanager
def opened_dir(path: Path) -> Iterator[int]:
    """``with opened_dir(path) as fd:`` :func:`open_dir`, closed on leaving."""
    fd = open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)


def ensure_dir(path: Path, uid: int | None, gid: int | None, mode: int = 0o700) -> None:
    """Make the directory ``path`` and any missing parent, each handed to ``uid``:``gid`` with permission bits
    ``mode`` (None: the daemon's own). A directory that exists is left as it is.

    Each missing component is made with ``mkdirat`` in its parent's descriptor, opened again without following a
    link, checked (a directory the daemon owns) and handed over with ``fchown``/``fchmod`` on that
    descriptor, so what changes owner is exactly what was made. UserPathError names the component that is a symlink
    or not a directory, or why it cannot be made or handed over (under a unit without CAP_CHOWN: make it
    beforehand, owned by the job's user)."""
    parts = _parts(path)
    me = os.geteuid()
    fd = os.open("/", _DIR_FLAGS)
    at = ""
    try:
        for part in parts:
            at = f"{at}/{part}"
            made = False
            try:
                os.mkdir(part, mode, dir_fd=fd)
                made = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise UserPathError(f"{path}: cannot create {at}: {exc.strerror}") from None
            try:
                nfd = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:  # swapped for a symlink (or removed) right after it was made: refused, unchanged
                raise _refusal(path, at, exc) from None
            os.close(fd)
            fd = nfd
            if made:
                _hand_over(fd, path, at, me, uid=uid, gid=gid, mode=mode)
    finally:
        os.close(fd)


def _hand_over(fd: int, path: Path, at: str, me: int, *, uid: int | None, gid: int | None, mode: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != me:
        # Not the directory just made (someone renamed one of theirs into its place): leave it exactly as it is.
        # (Entries in it are no sign of that: the daemon's own threads, launching ranks side by side, may already
        # have made the next component; only the daemon can, in a directory it owns with mode 0700.)
        raise UserPathError(f"{path}: {at} was replaced while it was being created; refused")
    try:
        if uid is not None and (uid, gid) != (st.st_uid, st.st_gid):
            os.fchown(fd, uid, -1 if gid is None else gid)
        os.fchmod(fd, mode)
    except OSError as exc:
        raise UserPathError(
            f"{path}: cannot hand {at} to uid {uid} ({exc.strerror}); create it beforehand, owned by the job's user"
        ) from None


def read_ack_in(ack: Path) -> Ack | None:
    """The acknowledgement at ``ack`` (its directory opened as :func:`open_dir` does, the file without following a
    link): None while there is none (or its directory does not exist yet), AckError when it is not a valid one,
    a symlink on the way included."""
    try:
        fd = open_dir(ack.parent)
    except FileNotFoundError:
        return None
    except (UserPathError, PermissionError) as exc:
        raise AckError(f"{ack}: {exc.strerror}" if isinstance(exc, PermissionError) else str(exc)) from None
    try:
        return read_ack(Path(ack.name), dir_fd=fd)
    finally:
        os.close(fd)


def remove_in(dir_fd: int, name: str, shown: Path) -> bool:
    """Remove the file ``name`` of the directory ``dir_fd`` (``unlinkat``: a symlink is removed, never followed);
    False if there is none. UserPathError when it is a directory (or cannot be removed), naming ``shown``."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise UserPathError(f"{shown} is a directory, not an acknowledgement; it was left as it is") from None
    except OSError as exc:
        raise UserPathError(f"{shown}: cannot remove it: {exc.strerror}") from None
    return True


def clear_ack(ack: Path) -> bool:
    """Remove the acknowledgement file ``ack`` (see :func:`remove_in`); False if there is none or its directory
    does not exist. UserPathError when the path is a directory or a symlink lies on the way."""
    try:
        fd = open_dir(ack.parent)
    except FileNotFoundError:
        return False
    try:
        return remove_in(fd, ack.name, ack)
    finally:
        os.close(fd)


def resolve_beneath(root: Path, target: Path) -> tuple[Path, os.stat_result] | None:
    """Where ``target`` (an absolute path, lexically inside ``root``) really is and its ``stat``, resolved inside
    ``root`` alone: symlinks within ``root`` are followed (``openat2`` ``RESOLVE_BENEATH``; where the kernel lacks
    it, none is), one that leads out of it is refused. None when the daemon may not look inside ``root`` (a unit
    without CAP_DAC_READ_SEARCH). FileNotFoundError when missing; UserPathError when it leads out of ``root``."""
    try:
        with _beneath(root, target, os.O_PATH) as fd:
            if fd is None:
                return None
            return Path(f"/proc/self/fd/{fd}").readlink(), os.fstat(fd)
    except PermissionError:
        return None


def has_entries(root: Path, target: Path) -> bool:
    """True when the directory ``target``, opened inside ``root`` as :func:`resolve_beneath` resolves it, holds at
    least one entry (a framework's checkpoint directory that was written). PermissionError when the daemon may not
    look; FileNotFoundError, UserPathError as there."""
    with _beneath(root, target, os.O_RDONLY | os.O_DIRECTORY) as fd:
        if fd is None:
            raise PermissionError(errno.EACCES, "cannot look inside", str(root))
        with os.scandir(fd) as entries:
            return next(entries, None) is not None


@contextlib.contextmanager
def _beneath(root: Path, target: Path, flags: int) -> Iterator[int | None]:
    """A descriptor of ``target`` opened with ``flags`` inside ``root`` alone (None: the daemon may not open
    ``root``), closed on leaving."""
    try:
        rel = target.relative_to(root)
    except ValueError:
        raise UserPathError(f"{target} is outside {root}") from None
    try:
        root_fd = open_dir(root)
    except PermissionError:
        yield None
        return
    try:
        if not rel.parts:
            fd = os.dup(root_fd)
        else:
            try:
                got = _openat2(root_fd, str(rel), flags | os.O_CLOEXEC, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
            except PermissionError:
                raise
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise UserPathError(f"{target} leads out of {root} (a symlink); refused") from None
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise FileNotFoundError(errno.ENOENT, "no such file", str(target)) from None
                raise UserPathError(f"{target}: cannot open it: {exc.strerror}") from None
            fd = got if got is not None else _walk_nofollow(root_fd, rel, target, flags)
        try:
            yield fd
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)


def _walk_nofollow(root_fd: int, rel: Path, shown: Path, flags: int) -> int:
    """``rel`` below ``root_fd`` one component at a time, no symlink followed (openat2's fallback); the last
    component is opened with ``flags``."""
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(rel.parts):
            if part in ("..", "."):
                raise UserPathError(f"{shown}: '{part}' in a checkpoint path; refused")
            last = i == len(rel.parts) - 1
            mode = (flags if last else os.O_PATH | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                nfd = os.open(part, mode, dir_fd=fd)
            except (FileNotFoundError, PermissionError):
                raise
            except OSError as exc:
                raise UserPathError(f"{shown}: cannot open it without following a link: {exc.strerror}") from None
            os.close(fd)
            fd = nfd
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise UserPathError(f"{shown} is a symbolic link; refused (this kernel has no openat2)")
    except BaseException:
        os.close(fd)
        raise
    return fd
