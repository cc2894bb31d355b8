"""Reloading the configuration (SIGHUP, ``systemctl reload``): the new file or the old one, and what changed.

A reload never leaves the daemon without a configuration: a file with errors keeps the old settings and says
why, and keys that only a restart can apply (the schema marks them ``restart``) are named.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from flexmig.config.address import HostPort
from flexmig.config.keys import join_key
from flexmig.config.load import DEFAULT_CONFIG_PATH, load_config
from flexmig.config.schema import Config, iter_keys, toml_name
from flexmig.errors import ConfigError

__all__ = ["ReloadResult", "applies_at_next_start", "as_applied", "changed_keys", "reload_config"]


@dataclass(frozen=True)
class ReloadResult:
    """What a reload gave: the configuration to use from now on, and what changed.

    On error, ``config`` is the old configuration unchanged and ``error`` says why. ``needs_restart`` lists
    changed keys that only take effect after a restart (those the schema marks ``restart``).
    """

    config: Config
    error: ConfigError | None = None
    changed: tuple[str, ...] = ()
    needs_restart: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the new file was accepted."""
        return self.error is None


def reload_config(
    current: Config, path: Path | str = DEFAULT_CONFIG_PATH, *, trusted_uids: Collection[int] | None = None
) -> ReloadResult:
    """Load ``path`` again; on any error keep ``current`` (the daemon goes on with its old settings)."""
    try:
        new = load_config(path, trusted_uids=trusted_uids)
    except ConfigError as exc:
        return ReloadResult(current, exc)
    changed = changed_keys(current, new)
    restart = tuple(k for k in changed if applies_at_next_start(k))
    return ReloadResult(new, None, changed, restart)


def as_applied(running: Config, new: Config, *, fixed: Collection[str] = ()) -> Config:
    """``new`` as a running daemon applies it: every key the schema marks ``restart`` keeps its value in ``running``
    (what the daemon runs with), so no component can take one up before the restart the reload announces. ``fixed``:
    restart keys whose new value applies all the same (a key that was unusable at start, kept at its default until
    a reload fixed it: ``mqtt.broker``)."""
    applied: Config = _applied(running, new, "", fixed=frozenset(fixed), restart=False)
    return applied


def _applied(running: Any, new: Any, prefix: str, *, fixed: frozenset[str], restart: bool) -> Any:
    values: dict[str, Any] = {}
    for f in fields(new):
        key = join_key(prefix, toml_name(f))
        old, value = getattr(running, f.name), getattr(new, f.name)
        marked = restart or bool(f.metadata.get("restart"))
        if is_dataclass(value) and not isinstance(value, (HostPort, type)):
            values[f.name] = _applied(old, value, key, fixed=fixed, restart=marked)
        else:
            values[f.name] = old if marked and key not in fixed else value
    return replace(new, **values)


def changed_keys(old: Config, new: Config) -> tuple[str, ...]:
    """Dotted keys whose values differ between two configurations."""
    return tuple(k for (k, a, _), (_, b, _) in zip(iter_keys(old), iter_keys(new), strict=True) if a != b)


def applies_at_next_start(key: str) -> bool:
    """True for keys a running daemon does not pick up on a reload: those the schema marks ``restart`` (the only
    rule; a table marked so marks all its keys)."""
    return any(k == key and meta.get("restart") for k, _, meta in iter_keys(Config.default()))
