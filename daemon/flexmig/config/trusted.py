"""Reading a file that steers the daemon (its configuration, a job spec) only once it is known to be safe to read.

Both kinds of file may make a root daemon act, so both are read the same way: the file must be a regular file
that only a trusted owner can change, in directories that only trusted owners can change
(:func:`flexmig.security.resolve_trusted`: sshd's ``StrictModes`` rule), no larger than a limit, and UTF-8 text.
Refused unread: anything that is not a regular file (a FIFO would block the reader forever, a device may act on
being opened), a file others can write or that lies in a directory others can write, and a file whose size is over
the limit (``/proc/kcore`` claims terabytes). A file that holds other than its stated size (``/proc`` and ``/sys``
files say 0 bytes and yield more; a file being written) is refused after at most its size plus one byte has been
read, and a file swapped between the check and the open is refused. A symlink is judged by its target, and a
refusal names both (``/etc/flexmig/flexmig.toml: symlink to /srv/flexmig.toml: refused: ...``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from flexmig.config.problems import ConfigFileError, ConfigProblem
from flexmig.errors import ConfigError
from flexmig.security import UnsafePathError, check_stat_permissions, resolve_trusted

__all__ = ["read_trusted_text"]


def read_trusted_text(
    path: Path,
    *,
    what: str,
    max_bytes: int,
    trusted_uids: Collection[int] | None = None,
    check_permissions: bool = True,
) -> str:
    """The text of ``path`` after the checks above; ConfigFileError naming the file (and the line, for bad UTF-8).

    ``what`` names the kind of file in messages (``job spec``); ``trusted_uids`` are the owners it may have (root
    and the current user by default); ``check_permissions`` False skips the owner and mode rules (never the
    others), for files the caller vouches for. Blocks on the file system.
    """
    rules = _Rules(path, what, max_bytes, trusted_uids, check_permissions)
    target, st = rules.locate()
    rules.check(target, st)
    try:
        # O_NOFOLLOW: the target was resolved above; a symlink put in its place since is refused, not followed.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise rules.refuse(f"cannot read: {exc.strerror or exc}") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise rules.refuse("refused: the file was replaced while it was being opened")
        rules.check(target, opened)
        raw = _read_at_most(fd, opened.st_size + 1)  # one byte more than stated tells a file that holds more
    except OSError as exc:
        raise rules.refuse(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) != opened.st_size:
        raise rules.refuse(
            f"refused: holds other than the {opened.st_size} bytes its size says "
            "(a /proc or /sys file, or one being written)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise rules.refuse("not UTF-8 text", raw[: exc.start].count(b"\n") + 1) from None


@dataclass(slots=True)
class _Rules:
    """One read's rules, and its refusals: each names the file, and the symlink's target once the path turned out
    to be one."""

    path: Path
    what: str
    max_bytes: int
    trusted_uids: Collection[int] | None
    check_permissions: bool
    via: str = ""  # "symlink to TARGET: " once the path turns out to be a symlink

    def refuse(self, message: str, line: int | None = None) -> ConfigFileError:
        return ConfigFileError([ConfigProblem(str(self.path), "", line, self.via + message)])

    def locate(self) -> tuple[Path, os.stat_result]:
        """The file the path leads to (through trusted directories and links) and its status."""
        try:
            if self.check_permissions:
                where = resolve_trusted(self.path, self.trusted_uids)
                target, linked = where.target, bool(where.links)
            else:
                target = Path(os.path.realpath(self.path))
                linked = target != Path(os.path.normpath(Path(self.path).absolute()))
            if linked:
                self.via = f"symlink to {target}: "
            return target, target.stat()
        except UnsafePathError as exc:
            raise self.refuse(f"refused: {exc.why}") from None
        except FileNotFoundError:
            raise self.refuse("no such file") from None
        except OSError as exc:
            raise self.refuse(f"cannot read: {exc.strerror or exc}") from None

    def check(self, target: Path, st: os.stat_result) -> None:
        """A regular file, owned and moded as trusted (unless the caller vouches for it), within the size limit."""
        if not stat.S_ISREG(st.st_mode):
            raise self.refuse(f"refused: not a regular file ({_kind(st.st_mode)})")
        if self.check_permissions:
            try:
                check_stat_permissions(target, st, "config", self.trusted_uids)
            except ConfigError as exc:
                raise self.refuse(_without_path(str(exc), target)) from None
        if st.st_size > self.max_bytes:
            raise self.refuse(f"{self.what} larger than {self.max_bytes} bytes ({st.st_size} bytes)")


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``fd``, until its end."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _without_path(message: str, path: Path) -> str:
    prefix = f"{path}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "not an ordinary file")
