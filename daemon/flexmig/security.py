"""File-permission checks and secret handling for configuration and credentials.

flexmig runs as root in ``act`` mode, so a configuration file that someone else can write is a way to make it
create and destroy GPU instances, and a password file that anyone can read leaks broker credentials. Both are
refused before a byte of them is used. Secrets read from files are wrapped in :class:`Secret`, whose ``repr``
and ``str`` never show the value, and :class:`RedactingFilter` scrubs known secret values from log records in
case one slips into a message anyway.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Literal

from flexmig.errors import ConfigError

__all__ = [
    "REDACTED",
    "FileKind",
    "RedactingFilter",
    "Secret",
    "attach_redaction",
    "check_file_permissions",
    "check_stat_permissions",
    "default_trusted_uids",
    "read_secret_file",
    "redact",
]

REDACTED = "***"

#: ``config``: a file whose content steers the daemon (flexmig.toml, job specs): nobody but its owner may write it.
#: ``secret``: a credential (password file, TLS private key): additionally nobody but owner and group may read it.
FileKind = Literal["config", "secret"]

_MAX_SECRET_BYTES = 4096


def default_trusted_uids() -> frozenset[int]:
    """The owners a file may have: root, and the user the daemon runs as."""
    return frozenset({0, os.geteuid()})


def check_file_permissions(path: Path, kind: FileKind, trusted_uids: Collection[int] | None = None) -> None:
    """Refuse ``path`` unless it is a regular file that only a trusted owner can change.

    Rules (all kinds): the file exists and is a regular file (after symlinks), its owner is in ``trusted_uids``
    (root or the current user by default) and it is neither group- nor world-writable. ``secret`` files must
    also not be readable, writable or executable by others (group read is allowed, so a ``flexmig`` group can
    share them). Raises :class:`ConfigError` naming the file and the rule it breaks, with the ``chmod``/``chown``
    that fixes it.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    check_stat_permissions(path, st, kind, trusted_uids)


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
