"""File-permission checks and secret handling for configuration and credentials.

flexmig runs as root in ``act`` mode, so a configuration file that someone else can write is a way to make it
create and destroy GPU instances, and a password file that anyone can read leaks broker credentials. Both are
refused before a byte of them is used. Secrets read from files are wrapped in :class:`Secret`, whose ``repr``
and ``str`` never show the value, and :class:`RedactingFilter` scrubs known secret values from log records in
case one slips into a message anyway.

A file is only as safe as the directories above it: whoever can write a directory on the way can rename the
file away and put another in its place. :func:`resolve_trusted` walks the path one component at a time, as the
kernel does (symlinks followed, at most 40), and refuses it when a directory on the way is owned by someone
other than root or the daemon's user, or is writable by its group or by others: OpenSSH's ``StrictModes`` rule
for ``authorized_keys``. One exception, where sshd is stricter: a directory with the sticky bit that root owns
(``/tmp``) is accepted, because the kernel lets nobody but an entry's owner (and root) rename or remove an entry
in it, so the directories and files below it that root or the daemon's user owns cannot be replaced by others.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flexmig.errors import ConfigError, UnsafePathError

__all__ = [
    "REDACTED",
    "FileKind",
    "RedactingFilter",
    "Secret",
    "TrustedPath",
    "UnsafePathError",
    "attach_redaction",
    "check_file_permissions",
    "check_stat_permissions",
    "default_trusted_uids",
    "read_secret_file",
    "redact",
    "resolve_trusted",
    "trusted_dir_problem",
]

REDACTED = "***"

#: ``config``: a file whose content steers the daemon (flexmig.toml, job specs): nobody but its owner may write it.
#: ``secret``: a credential (password file, TLS private key): additionally nobody but owner and group may read it.
FileKind = Literal["config", "secret"]

_MAX_SECRET_BYTES = 4096
_MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP)


def default_trusted_uids() -> frozenset[int]:
    """The owners a file may have: root, and the user the daemon runs as."""
    return frozenset({0, os.geteuid()})


@dataclass(frozen=True, slots=True)
class TrustedPath:
    """Where a path leads once its symlinks are followed, and the symlinks it went through (none: ``links``
    empty), for messages that name both the link the operator wrote and the file it reaches."""

    given: Path
    target: Path
    links: tuple[Path, ...] = ()

    def describe(self) -> str:
        """``/srv/x.toml (the target of symlink /etc/flexmig/x.toml)``, or the path alone."""
        if not self.links:
            return str(self.target)
        return f"{self.target} (the target of symlink {self.links[0]})"


def trusted_dir_problem(path: Path, st: os.stat_result, trusted_uids: Collection[int] | None = None) -> str | None:
    """Why the directory ``path`` (its ``lstat``) lets an untrusted user replace what lies in it, or None.

    Owned by root or a trusted user, and writable by nobody else, or a root-owned directory with the sticky bit
    (see the module docstring)."""
    uids = default_trusted_uids() if trusted_uids is None else frozenset(trusted_uids) | {0}
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in uids:
        owners = " or ".join(str(u) for u in sorted(uids))
        return f"directory {path} is owned by uid {st.st_uid}, not uid {owners} (chown root {path})"
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not (mode & stat.S_ISVTX and st.st_uid == 0):
        return (
            f"directory {path} has mode {mode:04o}: its group or others can write it, so they could put another "
            f"file in place of this one (chmod go-w {path})"
        )
    return None


def resolve_trusted(path: Path, trusted_uids: Collection[int] | None = None) -> TrustedPath:
    """Follow ``path`` to what it names, checking every directory on the way (the module docstring's rule).

    The last component is not judged (the caller checks the file or directory it is). Relative paths start at
    the working directory. Raises :class:`UnsafePathError` for a directory others could change or a symlink loop,
    FileNotFoundError / NotADirectoryError (OSError) when a component is missing or not a directory.
    """
    given = Path(path)
    start = given if given.is_absolute() else Path.cwd() / given
    todo = list(reversed(start.parts[1:]))
    current = Path("/")
    links: list[Path] = []
    problem = trusted_dir_problem(current, os.lstat(current), trusted_uids)
    if problem:
        raise UnsafePathError(given, current, problem)
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent  # a directory we came through, so already checked
            continue
        step = current / name
        st = os.lstat(step)
        if stat.S_ISLNK(st.st_mode):
            links.append(step)
            if len(links) > _MAX_SYMLINKS:
                raise UnsafePathError(given, step, f"more than {_MAX_SYMLINKS} symlinks on the way (a loop?)")
            target = step.readlink()
            if target.is_absolute():
                current = Path("/")
                todo.extend(reversed(target.parts[1:]))
            else:
                todo.extend(reversed(target.parts))
            continue
        if any(part not in ("", ".") for part in todo):  # a directory we go through
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(20, "Not a directory", str(step))
            problem = trusted_dir_problem(step, st, trusted_uids)
            if problem:
                raise UnsafePathError(given, step, problem)
        current = step
    return TrustedPath(given, current, tuple(links))


def check_file_permissions(path: Path, kind: FileKind, trusted_uids: Collection[int] | None = None) -> None:
    """Refuse ``path`` unless it is a regular file that only a trusted owner can change.

    Rules (all kinds): every directory on the way passes :func:`resolve_trusted`; the file exists and is a
    regular file (after symlinks), its owner is in ``trusted_uids`` (root or the current user by default) and it
    is neither group- nor world-writable. ``secret`` files must also not be readable, writable or executable by
    others (group read is allowed, so a ``flexmig`` group can share them). Raises :class:`ConfigError` naming the
    file (and, for a symlink, its target) and the rule it breaks, with the ``chmod``/``chown`` that fixes it.
    """
    try:
        where = resolve_trusted(path, trusted_uids)
        st = where.target.stat()
    except UnsafePathError as exc:
        raise ConfigError(str(exc)) from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not where.links:
        check_stat_permissions(path, st, kind, trusted_uids)
        return
    try:
        check_stat_permissions(where.target, st, kind, trusted_uids)
    except ConfigError as exc:
        raise ConfigError(f"{path}: symlink to {exc}") from None


def check_stat_permissions(
    path: Path, st: os.stat_result, kind: FileKind, trusted_uids: Collection[int] | None = None
) -> None:
    """:func:`check_file_permissions` for a file already stat'ed: a reader that opened the file checks the
    ``fstat`` of what it opened, so a file swapped after the check is not the one read."""
    uids = default_trusted_uids() if trusted_uids is None else frozenset(trusted_uids)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in uids:
        owners = " or ".join(str(u) for u in sorted(uids))
        raise ConfigError(
            f"{path}: refused: owned by uid {st.st_uid}, must be owned by uid {owners} (chown root {path})"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{path}: refused: mode {mode:04o} lets group or others write it (chmod go-w {path})")
    if kind == "secret" and mode & stat.S_IRWXO:
        raise ConfigError(f"{path}: refused: mode {mode:04o} lets others read a credential (chmod o-rwx {path})")


class Secret:
    """A credential that never shows itself in ``repr``, ``str``, f-strings or logs; ``reveal()`` gives it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for the one call that needs it (the broker login)."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, spec: str) -> str:
        return REDACTED

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> tuple[object, ...]:
        # Pickling would write the secret somewhere we do not control (a journal, a cache).
        raise TypeError("a Secret cannot be pickled")


def read_secret_file(path: Path, trusted_uids: Collection[int] | None = None) -> Secret:
    """Read a credential file (first line, trailing newline stripped) after checking its permissions.

    The permission check comes first, so a file readable by others is refused without being read. Empty files,
    files over 4 KiB and files that are not UTF-8 are refused; the message names the file, never the content.
    """
    check_file_permissions(path, "secret", trusted_uids)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > _MAX_SECRET_BYTES:
        raise ConfigError(f"{path}: credential file larger than {_MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: credential file is not UTF-8 text") from None
    value = text.split("\n", 1)[0].rstrip("\r")
    if not value:
        raise ConfigError(f"{path}: credential file is empty (the first line holds the secret)")
    return Secret(value)


def redact(text: str, secrets: Iterable[Secret | str]) -> str:
    """``text`` with every occurrence of each secret value replaced by ``***`` (empty secrets are ignored)."""
    values = sorted({s.reveal() if isinstance(s, Secret) else s for s in secrets} - {""}, key=len, reverse=True)
    for value in values:
        text = text.replace(value, REDACTED)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that rewrites each record with the given secrets replaced by ``***``.

    Attach it to handlers (:func:`attach_redaction`), not loggers: a handler's filters see every record that
    reaches it, a third-party library's included, while a logger's see only records logged on that very logger.
    It formats the record's arguments first, so a secret passed as a ``%s`` argument is caught, and it redacts
    the traceback and stack of the record too (formatted here, so the handler's formatter uses this text).
    """

    def __init__(self, secrets: Iterable[Secret] = ()) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def update(self, secrets: Iterable[Secret]) -> None:
        """Redact these secrets from now on (a reload may have named another password file)."""
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact the record in place; never drops it."""
        secrets = self.secrets
        if not secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a broken log call (arguments that do not fit): the handler reports it, not us
            return True
        cleaned = redact(message, secrets)
        if cleaned != message:
            record.msg = cleaned
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, secrets)
        return True


def attach_redaction(logger: logging.Logger | None = None, secrets: Iterable[Secret] = ()) -> RedactingFilter:
    """One :class:`RedactingFilter` on every handler of ``logger`` (the root logger by default); returns it so
    its secrets can be updated. Call it after the handlers are set up (``logging.basicConfig``)."""
    target = logger if logger is not None else logging.getLogger()
    redactor = RedactingFilter(secrets)
    for handler in target.handlers:
        handler.addFilter(redactor)
    return redactor
