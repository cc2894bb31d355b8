"""Reading the configuration: TOML text to a checked :class:`~flexmig.config.schema.Config`, and the file checks.

:func:`parse_config` is the pure part (text in, configuration or every problem out). :func:`load_config` adds
what only a file has: its owner and mode, its size and encoding, and the credential files it names. The loader
reads; it does not create directories or open sockets.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal, cast

from flexmig.config.checks import Checker, cross_check_problems
from flexmig.config.keys import find_key_line, no_index, split_dotted
from flexmig.config.migparted import read_mig_parted
from flexmig.config.problems import ConfigFileError, ConfigProblem, in_file_order
from flexmig.config.schema import Config
from flexmig.config.trusted import read_trusted_text
from flexmig.errors import ConfigError
from flexmig.security import check_file_permissions

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFERRABLE_KEYS",
    "load_config",
    "load_config_deferring",
    "parse_config",
]

DEFAULT_CONFIG_PATH = Path("/etc/flexmig/flexmig.toml")

_MAX_FILE_BYTES = 1 << 20


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse and validate TOML text; pure (no file access). ``source`` names the file in error messages.

    Raises :class:`ConfigFileError` (a :class:`~flexmig.errors.ConfigError`) listing every problem with its
    dotted key and line; never anything else for any text.
    """
    return _parse(text, source)


def _drop_key(data: dict[str, Any], dotted: str) -> None:
    """Remove the dotted key from parsed TOML (its default applies), if every table on the way is a table."""
    *tables, leaf = split_dotted(dotted)
    node: object = data
    for name in tables:
        node = node.get(name) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def _parse(text: str, source: str, without: Collection[str] = ()) -> Config:
    """:func:`parse_config`, with the keys ``without`` left at their defaults whatever the text says."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(m.group(1)) if m else (text.count("\n") + 1 if "end of document" in message else None)
        raise ConfigFileError([ConfigProblem(source, "", line, f"TOML syntax: {message}")]) from None
    except RecursionError:
        raise ConfigFileError([ConfigProblem(source, "", None, "TOML syntax: nested too deeply")]) from None
    except ValueError as exc:  # tomllib's int() of more than 4,300 digits raises a plain ValueError
        raise ConfigFileError([ConfigProblem(source, "", None, f"TOML value out of range: {exc}")]) from None
    for key in without:
        _drop_key(data, key)
    checker = Checker()
    cfg = checker.section(Config, data, "")
    for keys, msg in list(cross_check_problems(cfg, checker)):
        checker.fail(next((k for k in keys if find_key_line(text, no_index(k), exact=True)), keys[0]), msg)
    if checker.problems:
        problems = [
            ConfigProblem(source, key, find_key_line(text, no_index(key)), msg) for key, msg in checker.problems
        ]
        problems.sort(key=lambda p: (p.line is None, p.line or 0))
        raise ConfigFileError(problems)
    return cfg


def _file_problem(path: Path, config_text: str, key: str, exc: ConfigError) -> ConfigProblem:
    return ConfigProblem(str(path), key, find_key_line(config_text, key), str(exc))


def load_config(path: Path | str = DEFAULT_CONFIG_PATH, *, trusted_uids: Collection[int] | None = None) -> Config:
    """Read, permission-check and validate a configuration file.

    The file must be owned by root or the current user (``trusted_uids`` overrides) and be neither group- nor
    world-writable; the credential files it names (``mqtt.password_file``, ``mqtt.tls_key``) must exist and not
    be readable by others; certificates must exist. Raises :class:`ConfigFileError` naming the file, key and
    line of every problem.
    """
    path = Path(path)
    text = _read_config_text(path, trusted_uids)
    cfg = parse_config(text, str(path))
    problems = _file_problems(path, text, cfg, trusted_uids)
    if problems:
        raise ConfigFileError(problems)
    return cfg


#: Keys whose problems ``flexmigd`` can start with (:func:`load_config_deferring`): a malformed broker address
#: only stops MQTT publishing, which the outbox makes up for once a reload fixes it.
DEFERRABLE_KEYS = ("mqtt.broker",)


def load_config_deferring(
    path: Path | str,
    keys: Collection[str] = DEFERRABLE_KEYS,
    *,
    trusted_uids: Collection[int] | None = None,
) -> tuple[Config, tuple[ConfigProblem, ...]]:
    """:func:`load_config` for the daemon's start: when every problem of the file is in ``keys``, return the
    configuration with those keys at their defaults, and the problems (the caller turns off what they steer).

    Any other problem raises :class:`ConfigFileError` listing all of them, the deferrable ones included, exactly
    as :func:`load_config` would. ``flexmig config check`` and reloads stay strict (:func:`load_config`).
    """
    path = Path(path)
    text = _read_config_text(path, trusted_uids)
    deferred: tuple[ConfigProblem, ...] = ()
    try:
        cfg = parse_config(text, str(path))
    except ConfigFileError as exc:
        if not exc.problems or any(p.key not in keys for p in exc.problems):
            raise
        deferred = exc.problems
        try:
            cfg = _parse(text, str(path), without=keys)
        except ConfigFileError as rest:  # rules between keys that the bad keys' problems left out
            raise ConfigFileError(in_file_order([*deferred, *rest.problems])) from None
    problems = _file_problems(path, text, cfg, trusted_uids)
    if problems:
        raise ConfigFileError(in_file_order([*deferred, *problems]))
    return cfg, deferred


def _read_config_text(path: Path, trusted_uids: Collection[int] | None) -> str:
    """The file's text after its type, permission, size and encoding checks (ConfigFileError otherwise)."""
    return read_trusted_text(path, what="configuration file", max_bytes=_MAX_FILE_BYTES, trusted_uids=trusted_uids)


def _credential_file_problems(
    path: Path, text: str, cfg: Config, trusted_uids: Collection[int] | None
) -> list[ConfigProblem]:
    """Problems with the files the configuration names (password file, TLS key and certificates)."""
    problems: list[ConfigProblem] = []
    m = cfg.mqtt
    for key, file, kind in (
        ("mqtt.password_file", m.password_file, "secret"),
        ("mqtt.tls_key", m.tls_key, "secret"),
        ("mqtt.tls_cert", m.tls_cert, "config"),
        ("mqtt.tls_ca", m.tls_ca, "config"),
    ):
        if file is None:
            continue
        try:
            check_file_permissions(file, cast(Literal["config", "secret"], kind), trusted_uids)
        except ConfigError as exc:
            problems.append(_file_problem(path, text, key, exc))
    return problems


def _baseline_problems(path: Path, text: str, cfg: Config, trusted_uids: Collection[int] | None) -> list[ConfigProblem]:
    """Problems with the mig-parted file ``[baseline]`` names: unreadable, untrusted, not mig-parted's format, or
    without the configuration named."""
    b = cfg.baseline
    if b.mig_parted_file is None:
        return []
    try:
        spec = read_mig_parted(b.mig_parted_file, trusted_uids=trusted_uids)
    except ConfigError as exc:
        return [_file_problem(path, text, "baseline.mig_parted_file", exc)]
    try:
        spec.select(b.mig_parted_config or None)
    except ConfigError as exc:
        key = "baseline.mig_parted_config" if b.mig_parted_config else "baseline.mig_parted_file"
        return [_file_problem(path, text, key, exc)]
    return []


def _file_problems(path: Path, text: str, cfg: Config, trusted_uids: Collection[int] | None) -> list[ConfigProblem]:
    """Problems with every file the configuration names."""
    return _credential_file_problems(path, text, cfg, trusted_uids) + _baseline_problems(path, text, cfg, trusted_uids)
