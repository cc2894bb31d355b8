"""Reloading the configuration (SIGHUP, ``systemctl reload``): the new file or the old one, and what changed.

A reload never leaves the daemon without a configuration: a file with errors keeps the old settings and says
why, and keys that only a restart can apply (the schema marks them ``restart``) are named.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from flexmig.config.load import DEFAULT_CONFIG_PATH, load_config
from flexmig.config.schema import Config, iter_keys
from flexmig.errors import ConfigError

__all__ = ["ReloadResult", "applies_at_next_start", "changed_keys", "reload_config"]


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


def changed_keys(old: Config, new: Config) -> tuple[str, ...]:
    """Dotted keys whose values differ between two configurations."""
    return tuple(k for (k, a, _), (_, b, _) in zip(iter_keys(old), iter_keys(new), strict=True) if a != b)


def applies_at_next_start(key: str) -> bool:
    """True for keys a running daemon does not pick up on a reload: those the schema marks ``restart`` (the only
    rule; a table marked so marks all its keys)."""
    return any(k == key and meta.get("restart") for k, _, meta in iter_keys(Config.default()))
