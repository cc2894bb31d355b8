"""Before the command listener runs any command, it proves that the broker keeps strangers off its command topics.

MQTT carries no sender identity: whoever may publish on ``<prefix>/<node>/commands/<verb>`` commands the node. The
listener's own login proves nothing about the others', so on a broker that lets anonymous clients in with no ACL
any local user can stop a job. At every connection, after subscribing and before accepting a command, the listener
therefore tries what an intruder would:

* an **anonymous** client (no user name, no password, no client certificate) publishes a probe on every verb's
  topic: it must be refused at login (or at the TLS handshake), or each probe must be refused;
* a client logged in with **the node's own account** does the same: a node reads its commands and writes their
  results, it never sends itself commands, so a broker that lets it has no ACL that separates who commands from who
  is commanded (mosquitto with a password file but no ``acl_file`` lets every account publish everywhere).

The broker's own word decides: MQTT 5 acknowledges each QoS 1 publish with a reason code, "not authorized" (135)
when its ACL refuses it (mosquitto since 1.6, and every MQTT 5 broker; the listener speaks MQTT 5 already), success
(0, or 16 "no matching subscribers") when it took it. A probe taken means the topic is open; a client disconnected
for its publish was refused. Refused probes reach no one. A taken one would reach the listener's own subscription
too (its payload starts with :data:`PROBE_MARK` and a fresh random token), and one that arrives there at any time,
whatever the broker answered, ends the listening all the same.

What this cannot prove is what the other accounts may do (flexmig does not have their passwords): granting
``commands/+`` only to operators stays the ACL's job (docs/mqtt.md, "The broker ACL").
"""

from __future__ import annotations

import asyncio
import queue
import secrets
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from flexmig.config import HostPort
from flexmig.errors import BrokerAclError, ConfigError
from flexmig.mqtt.broker import ConnectionSettings, read_password, tls_context

__all__ = ["PROBE_MARK", "CommandGuard", "command_topics"]

PROBE_MARK = b"flexmig-acl-probe "
"""Every probe payload starts with this (then who sent it and a token); the listener hands such messages here."""

_TAKEN = frozenset({0, 16})  # MQTT 5 PUBACK: success, no matching subscribers
_KEPT_OUT = frozenset({4, 5, 134, 135, 138})  # CONNACK: bad user name or password, not authorised, banned


class _Inconclusive(ConfigError):
    """The check could not finish (the broker went away or did not answer); the listener's session is tried again
    (with backoff, logged as a connection failure)."""


@dataclass
class CommandGuard:
    """One connection's check of the command topics ``topics`` (``<base>/<verb>`` for every verb) on ``broker``:
    :meth:`check` runs the probes, :meth:`seen` takes every probe message the listener receives, :meth:`watch`
    waits for one that should not have come."""

    settings: ConnectionSettings
    broker: HostPort
    identifier: str
    topics: tuple[str, ...]
    timeout_s: float = 10.0
    _token: str = field(default_factory=lambda: secrets.token_hex(16))
    _open: list[tuple[str, str]] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _passed: bool = False

    # ------------------------------------------------------------------------------------------ the listener
    def seen(self, topic: str, payload: bytes) -> bool:
        """A message arrived on ``topic``: True when it is one of this guard's probes (it got through, and the
        listening ends), False for anything else, a stranger's imitation of a probe included (the listener treats
        that as the command it claims to be, and refuses it like any other)."""
        if not payload.startswith(PROBE_MARK):
            return False
        who, _, token = payload[len(PROBE_MARK) :].decode("ascii", "replace").partition(" ")
        if token != self._token or who not in ("anonymous", "account"):
            return False
        self._open.append((who, topic))
        self._arrived.set()
        return True

    @property
    def passed(self) -> bool:
        """The check finished and found the command topics closed to the probes (and none arrived since)."""
        return self._passed and not self._open

    async def watch(self) -> None:
        """After :meth:`check` passed: return only by raising BrokerAclError, if a probe still arrives."""
        await self._arrived.wait()
        raise self._verdict()

    # ------------------------------------------------------------------------------------------ probing
    async def check(self) -> None:
        """Probe as an anonymous client, then as the node's own account. Raises BrokerAclError naming who
        could publish where, _Inconclusive when the broker gave no answer to judge by."""
        password = read_password(self.settings)
        for who in ("anonymous", "account"):
            # paho's blocking client, on a thread of its own: aiomqtt does not pass the acknowledgements' codes on.
            taken = await asyncio.to_thread(self._probe, who, password if who == "account" else None)
            self._open.extend((who, topic) for topic in taken)
            if self._open:
                raise self._verdict()
        self._passed = True

    def _verdict(self) -> BrokerAclError:
        who, topic = self._open[0]
        if who == "anonymous":
            why = (
                f"an anonymous client could publish to {topic}: any local user could command this node; set "
                "allow_anonymous false, or give anonymous clients no write access in the ACL"
            )
        else:
            why = (
                f"the node's own account {self.settings.username!r} could publish to {topic}: the broker applies no "
                "ACL that keeps command topics to operators (with the documented acl_file a node only reads them)"
            )
        return BrokerAclError(
            f"MQTT commands refused: {why}; commands stay off until the broker refuses that (the ACL in "
            "docs/mqtt.md, 'The broker ACL') and flexmigd is restarted"
        )

    def _probe(self, who: str, password: str | None) -> list[str]:
        """Connect as ``who`` and publish a probe on every command topic; the topics the broker took it on."""
        events: queue.Queue[tuple[str, Any, int]] = queue.Queue()
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"{self.identifier}-probe-{secrets.token_hex(4)}",
            protocol=paho.MQTTv5,
        )
        client.connect_timeout = self.timeout_s
        client.on_connect = lambda _c, _u, _f, rc, _p: events.put(("connect", None, _code(rc)))
        client.on_publish = lambda _c, _u, mid, rc, _p: events.put(("publish", mid, _code(rc)))
        client.on_disconnect = lambda _c, _u, _f, rc, _p: events.put(("disconnect", None, _code(rc)))
        if who == "account":
            client.username_pw_set(self.settings.username, password)
        if self.settings.tls:  # the same verification of the broker; a client certificate only for the account
            plain = ConnectionSettings(tls=True, tls_ca=self.settings.tls_ca)
            ctx = tls_context(self.settings if who == "account" else plain, "MQTT TLS files")
            if ctx is not None:
                client.tls_set_context(ctx)
        try:
            client.connect(self.broker.host, self.broker.port, keepalive=max(5, int(self.timeout_s * 2)))
        except OSError as exc:
            if who == "anonymous" and _tls_refused(exc):
                return []  # no certificate, no connection (require_certificate true): kept out
            raise _Inconclusive(f"the {who} probe could not connect to {self.broker}: {exc}") from exc
        client.loop_start()
        try:
            kind, _, code = self._next(events, f"the {who} probe's connection")
            if kind != "connect" or code != 0:
                if code in _KEPT_OUT or (kind == "disconnect" and who == "anonymous"):
                    return []  # refused at login: it can publish nothing
                raise _Inconclusive(f"the broker refused the {who} probe's connection (reason code {code})")
            payload = PROBE_MARK + f"{who} {self._token}".encode()
            mids = {client.publish(topic, payload, qos=1).mid: topic for topic in self.topics}
            taken: list[str] = []
            while mids:
                kind, mid, code = self._next(events, f"the broker's answer to the {who} probe")
                if kind == "disconnect":
                    return taken  # dropped for publishing where it may not: those probes were refused
                if kind == "publish" and mid in mids:
                    topic = mids.pop(mid)
                    if code in _TAKEN:
                        taken.append(topic)
            return taken
        finally:
            client.disconnect()
            client.loop_stop()

    def _next(self, events: queue.Queue[tuple[str, Any, int]], what: str) -> tuple[str, Any, int]:
        try:
            return events.get(timeout=self.timeout_s)
        except queue.Empty:
            raise _Inconclusive(f"{what} did not come within {self.timeout_s:g} s") from None


def _code(rc: Any) -> int:
    """A paho reason code (or a plain int) as its number."""
    return int(getattr(rc, "value", rc))


def _tls_refused(exc: BaseException) -> bool:
    """The broker ended the TLS handshake of a client without a certificate."""
    return isinstance(exc, ssl.SSLError)


def command_topics(base: str, verbs: Iterable[str]) -> tuple[str, ...]:
    """``<base>/<verb>`` for each verb."""
    return tuple(f"{base}/{verb}" for verb in verbs)
