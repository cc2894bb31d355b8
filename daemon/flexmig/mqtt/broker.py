"""Reaching the MQTT broker: what the publisher, the command listener and ``flexmig events`` share.

:class:`ConnectionSettings` declares, once, how a flexmig client logs in to its broker and how it retries; each
client's settings extend it with where to connect and its topics. :func:`client_arguments` turns them into the
:class:`aiomqtt.Client` keyword arguments (reading the password file and building the TLS context), so the three
clients log in the same way and say the same things when they cannot, and :func:`reconnect_forever` is their one
reconnect loop: backoff with jitter, a fresh count after a session that was up, and cancellation honoured even
where Python 3.11's ``asyncio.wait_for`` swallowed it.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import aiomqtt

from flexmig.config import HostPort
from flexmig.errors import ConfigError
from flexmig.mqtt.cancellation import honour_cancel
from flexmig.mqtt.events import NODE_NAME
from flexmig.security import read_secret_file

if TYPE_CHECKING:
    from flexmig.config import MqttConfig

__all__ = [
    "ConnectionFailure",
    "ConnectionSettings",
    "backoff_delay",
    "check_backoff",
    "check_node_topics",
    "check_tls_pair",
    "client_arguments",
    "connection_fields",
    "read_password",
    "reconnect_forever",
    "refused_login",
    "tls_context",
]

# MQTT 3.1.1 "bad user name or password" / "not authorised", and their MQTT 5 equivalents.
_AUTH_CODES = frozenset({4, 5, 134, 135})


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionSettings:
    """How a flexmig MQTT client logs in to its broker and retries: the fields every client shares, declared here
    once. Each client's settings (publisher, command listener, event follower) derive from this and add the broker
    address (each parses it its own way and says so in its own words), its client ID and its topics."""

    username: str | None = None
    password_file: Path | None = None
    """First line is the password; read (permissions checked) at every connection attempt, never logged."""
    tls: bool = False
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    trusted_uids: frozenset[int] | None = None
    """Owners the password file may have (None: root and the current user)."""

    def __post_init__(self) -> None:
        # Derived settings call this explicitly: zero-argument super() does not work in slotted dataclasses.
        check_tls_pair(self)
        check_backoff(self)


def connection_fields(cfg: MqttConfig, trusted_uids: Collection[int] | None = None) -> dict[str, Any]:
    """The :class:`ConnectionSettings` fields that the daemon's validated ``[mqtt]`` sets, as keyword arguments
    for any settings derived from it (the retry timing keeps its defaults: ``[mqtt]`` has no keys for it)."""
    return {
        "username": cfg.username,
        "password_file": cfg.password_file,
        "tls": cfg.tls,
        "tls_ca": cfg.tls_ca,
        "tls_cert": cfg.tls_cert,
        "tls_key": cfg.tls_key,
        "keepalive_s": cfg.keepalive_s,
        "trusted_uids": None if trusted_uids is None else frozenset(trusted_uids),
    }


def check_tls_pair(s: ConnectionSettings) -> None:
    """ConfigError unless ``tls_cert`` and ``tls_key`` are both given or both absent."""
    if (s.tls_cert is None) != (s.tls_key is None):
        raise ConfigError("MQTT TLS: tls_cert and tls_key go together")


def check_backoff(s: ConnectionSettings) -> None:
    """ConfigError unless ``0 < backoff_initial_s <= backoff_max_s``."""
    if not 0 < s.backoff_initial_s <= s.backoff_max_s:
        raise ConfigError("MQTT backoff: need 0 < backoff_initial_s <= backoff_max_s")


def check_node_topics(node: str, topic_prefix: str) -> None:
    """ConfigError unless ``node`` is one topic level and ``topic_prefix`` has no wildcards or empty levels."""
    if not NODE_NAME.fullmatch(node):
        raise ConfigError(f"MQTT node name {node!r} is not one topic level ([A-Za-z0-9][A-Za-z0-9._-]*)")
    if not all(NODE_NAME.fullmatch(level) for level in topic_prefix.split("/")):  # same alphabet as a node name
        raise ConfigError(f"MQTT topic prefix {topic_prefix!r}: levels must be [A-Za-z0-9._-], no wildcards")


def read_password(s: ConnectionSettings) -> str | None:
    """The password from ``password_file`` (permissions checked first), or None without one."""
    return read_secret_file(s.password_file, s.trusted_uids).reveal() if s.password_file else None


def tls_context(s: ConnectionSettings, what: str = "MQTT TLS files") -> ssl.SSLContext | None:
    """The client's TLS context (None without ``tls``); ConfigError ``<what> (<files>) cannot be used: ...``
    when the CA, certificate or key cannot be loaded."""
    if not s.tls:
        return None
    try:
        ctx = ssl.create_default_context(cafile=str(s.tls_ca) if s.tls_ca else None)
        if s.tls_cert is not None:
            ctx.load_cert_chain(s.tls_cert, s.tls_key)
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(str(p) for p in (s.tls_ca, s.tls_cert, s.tls_key) if p)
        raise ConfigError(f"{what} ({files}) cannot be used: {exc}") from exc
    return ctx


def client_arguments(
    s: ConnectionSettings,
    address: HostPort,
    identifier: str | None,
    *,
    tls_what: str = "MQTT TLS files",
) -> dict[str, Any]:
    """Keyword arguments for :class:`aiomqtt.Client` common to every flexmig client: address, client ID, login
    (the password file is read now), keepalive, connect timeout and TLS context, in that order of checking."""
    password = read_password(s)
    return {
        "hostname": address.host,
        "port": address.port,
        "identifier": identifier,
        "username": s.username,
        "password": password,
        "keepalive": s.keepalive_s,
        "timeout": s.connect_timeout_s,
        "tls_context": tls_context(s, tls_what),
    }


def refused_login(exc: BaseException) -> bool:
    """True when the broker refused the user name or password (or the client is not authorised)."""
    return isinstance(exc, aiomqtt.MqttCodeError) and getattr(exc.rc, "value", exc.rc) in _AUTH_CODES


def backoff_delay(failures: int, initial: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after ``failures`` consecutive failures: exponential from ``initial``, capped at ``cap``,
    with "equal jitter" (half fixed, half random) so a fleet of nodes does not reconnect in lockstep."""
    base = min(cap, initial * float(1 << min(max(0, failures - 1), 32)))
    return base / 2 + rng.uniform(0, base / 2)


@dataclass(frozen=True, slots=True)
class ConnectionFailure:
    """How one connection attempt or session ended, as :func:`reconnect_forever` tells its client."""

    error: BaseException
    """The cause (the first leaf when a task group raised several)."""
    was_up: bool
    """The session had connected (and subscribed) before it failed: a lost connection, not a failed attempt."""
    consecutive: int
    """Failures in a row, this one included; 1 after a session that was up."""


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def reconnect_forever(
    settings: ConnectionSettings,
    session: Callable[[Callable[[], None]], Awaitable[None]],
    on_failure: Callable[[ConnectionFailure], None],
    rng: random.Random,
    *,
    retry_on: tuple[type[Exception], ...] = (Exception,),
) -> NoReturn:
    """Run ``session(connected)`` again and again until cancelled, waiting :func:`backoff_delay` between tries.

    ``session`` connects, calls ``connected()`` once its connection is usable, and serves it until it ends; the
    backoff then starts again from ``backoff_initial_s``. An error in ``retry_on`` goes to ``on_failure`` (which
    logs it in the client's words) and is retried; any other error ends the loop. A cancellation that
    ``asyncio.wait_for`` swallowed (aiomqtt waits for CONNACK, SUBACK and PUBACK through it) ends it too, before
    the next attempt or wait, instead of keeping a TaskGroup's shutdown waiting forever.
    """
    failures = 0
    while True:
        honour_cancel()
        up = False

        def connected() -> None:
            nonlocal up
            up = True

        try:
            await session(connected)
        except asyncio.CancelledError:
            raise
        except retry_on as exc:  # whatever the network or the broker does, the client goes on
            failures = 1 if up else failures + 1
            on_failure(ConnectionFailure(_leaf(exc), up, failures))
        else:  # the session ended without an error: a failure only if it never got up
            failures = 0 if up else failures + 1
        honour_cancel()
        await asyncio.sleep(backoff_delay(failures, settings.backoff_initial_s, settings.backoff_max_s, rng))
