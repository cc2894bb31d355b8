"""Reaching and logging in to the MQTT broker: what the publisher, the command listener and ``flexmig events`` share.

:class:`BrokerConnection` is the broker part of ``[mqtt]``; the functions read the password file, build the TLS
context and the common :class:`aiomqtt.Client` keyword arguments from any settings with the same field names
(:class:`BrokerLogin`), so the three clients log in the same way and say the same things when they cannot.
"""

from __future__ import annotations

import ssl
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flexmig.config import HostPort
from flexmig.errors import ConfigError
from flexmig.security import read_secret_file

if TYPE_CHECKING:
    from flexmig.config import MqttConfig

__all__ = ["BrokerConnection", "BrokerLogin", "check_tls_pair", "client_arguments", "read_password", "tls_context"]


class BrokerLogin(Protocol):
    """The login fields a broker client needs (read-only; frozen dataclasses with these fields match)."""

    @property
    def username(self) -> str | None: ...
    @property
    def password_file(self) -> Path | None: ...
    @property
    def tls(self) -> bool: ...
    @property
    def tls_ca(self) -> Path | None: ...
    @property
    def tls_cert(self) -> Path | None: ...
    @property
    def tls_key(self) -> Path | None: ...
    @property
    def keepalive_s(self) -> int: ...
    @property
    def trusted_uids(self) -> frozenset[int] | None: ...


@dataclass(frozen=True, slots=True)
class BrokerConnection:
    """Where the broker is and how to log in to it: the part of ``[mqtt]`` every flexmig MQTT client shares."""

    broker: HostPort
    username: str | None = None
    password_file: Path | None = None
    """First line is the password; read (permissions checked) at every connection attempt, never logged."""
    tls: bool = False
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    keepalive_s: int = 30
    trusted_uids: frozenset[int] | None = None
    """Owners the password file may have (None: root and the current user)."""

    def __post_init__(self) -> None:
        check_tls_pair(self)

    @classmethod
    def from_config(cls, cfg: MqttConfig, trusted_uids: Collection[int] | None = None) -> BrokerConnection:
        """The broker part of the daemon's validated ``[mqtt]`` configuration."""
        return cls(
            broker=cfg.broker,
            username=cfg.username,
            password_file=cfg.password_file,
            tls=cfg.tls,
            tls_ca=cfg.tls_ca,
            tls_cert=cfg.tls_cert,
            tls_key=cfg.tls_key,
            keepalive_s=cfg.keepalive_s,
            trusted_uids=None if trusted_uids is None else frozenset(trusted_uids),
        )

    def login_fields(self) -> dict[str, Any]:
        """Every field but ``broker``, as keyword arguments for a settings class with the same field names."""
        return {
            "username": self.username,
            "password_file": self.password_file,
            "tls": self.tls,
            "tls_ca": self.tls_ca,
            "tls_cert": self.tls_cert,
            "tls_key": self.tls_key,
            "keepalive_s": self.keepalive_s,
            "trusted_uids": self.trusted_uids,
        }


def check_tls_pair(s: BrokerLogin) -> None:
    """ConfigError unless ``tls_cert`` and ``tls_key`` are both given or both absent."""
    if (s.tls_cert is None) != (s.tls_key is None):
        raise ConfigError("MQTT TLS: tls_cert and tls_key go together")


def read_password(s: BrokerLogin) -> str | None:
    """The password from ``password_file`` (permissions checked first), or None without one."""
    return read_secret_file(s.password_file, s.trusted_uids).reveal() if s.password_file else None


def tls_context(s: BrokerLogin, what: str = "MQTT TLS files") -> ssl.SSLContext | None:
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
    s: BrokerLogin,
    address: HostPort,
    identifier: str | None,
    timeout: float,
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
        "timeout": timeout,
        "tls_context": tls_context(s, tls_what),
    }
