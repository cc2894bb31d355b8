"""Reloading the configuration (SIGHUP, ``systemctl reload``): the new file or the old one, and what changed.

A reload never leaves the daemon without a configuration: a file with errors keeps the old settings and says
why, and keys that only a restart can apply (listen addresses, socket and state paths) are named.
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
    changed keys that only take effect after a restart (listen addresses, socket and state paths).
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
    restart = tuple(k for k in changed if _needs_restart(k))
    return ReloadResult(new, None, changed, restart)


def changed_keys(old: Config, new: Config) -> tuple[str, ...]:
    """Dotted keys whose values differ between two configurations."""
    return tuple(k for (k, a, _), (_, b, _) in zip(iter_keys(old), iter_keys(new), strict=True) if a != b)


def _needs_restart(key: str) -> bool:
    return any(k == key and meta.get("restart") for k, _, meta in iter_keys(Config.default()))


def applies_at_next_start(key: str) -> bool:
    """True for keys a running daemon does not pick up on a reload: those the schema marks ``restart`` (listen
    addresses, socket and state paths), and the ones its components read only at start: telemetry's (but the
    sweep interval), and MQTT's and DCGM's (the publisher, its outbox and the scraper are set up at start;
    ``[detect]`` thresholds, by contrast, apply at once)."""
    if _needs_restart(key):
        return True
    return key in ("sampling.retention_s", "sampling.gpm", "sampling.stall_s") or key.startswith(("dcgm.", "mqtt."))
