"""Before the command listener runs any command, it proves that the broker keeps strangers off its command topics.

MQTT carries no sender identity: whoever may publish on ``<prefix>/<node>/commands/<verb>`` commands the node. The
listener's own login proves nothing about the others', so on a broker that lets anonymous clients in with no ACL
any local user can stop a job. At every connection, after subscribing and before accepting a command, the listener
therefore tries what an intruder would:

* an **anonymous** client (no user name, no password, no client certificate) publishes a probe on every verb's
  topic: it must be refused at login (or at the TLS handshake), or each probe must be refused;
* an anonymous client does it again on **every other listener** of the broker, when the broker runs on this
  machine (:mod:`flexmig.mqtt.listeners`): with ``per_listener_settings true`` each listener has its own login rules
  and ACL, and a second listener that lets anonymous clients publish is as open a door as the first. Each is tried
  as an intruder would: plain MQTT, TLS without checking the broker's certificate, WebSockets (plain and TLS) on a
  TCP listener; a Unix socket as it is. A broker on another machine cannot be enumerated from here: one line says
  that only the listener flexmig uses was proven;
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
from flexmig.mqtt.listeners import Listener, broker_listeners

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
    _connected: bool = False
    other_listeners: list[Listener] | None = None
    """The broker's other listeners the check probed (None: the broker is not on this machine, so none could be
    seen)."""

    # ------------------------------------------------------------------------------------------ the listener
    def seen(self, topic: str, payload: bytes) -> bool:
        """A message arrived on ``topic``: True when it is one of this guard's probes (it got through, and the
        listening ends), False for anything else, a stranger's imitation of a probe included (the listener treats
        that as the command it claims to be, and refuses it like any other)."""
        if not payload.startswith(PROBE_MARK):
            return False
        who, _, token = payload[len(PROBE_MARK) :].decode("ascii", "replace").partition(" ")
        if token != self._token or (who not in ("anonymous", "account") and not who.startswith("anonymous@")):
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
        listeners = await asyncio.to_thread(broker_listeners, self.broker)
        self.other_listeners = None if listeners is None else [x for x in listeners if not self._is_ours(x)]
        for door in self.other_listeners or ():
            taken = await asyncio.to_thread(self._probe_door, door)
            self._open.extend((f"anonymous@{door}", topic) for topic in taken)
            if self._open:
                raise self._verdict()
        self._passed = True

    def _is_ours(self, door: Listener) -> bool:
        """The listener flexmig connects to (probed above, with its own TLS settings)."""
        return not door.path and door.port == self.broker.port

    def _probe_door(self, door: Listener) -> list[str]:
        """Probe another listener anonymously, over every transport an intruder could try there; the topics a
        probe was taken on. A transport the listener does not speak refuses the connection and the next is tried;
        a listener that answers none of them is closed to anonymous clients."""
        tries: tuple[tuple[str, bool], ...] = (("unix", False),) if door.path else (
            ("tcp", False), ("tcp", True), ("websockets", False), ("websockets", True)
        )  # fmt: skip
        for transport, tls in tries:
            try:
                taken = self._probe("anonymous", None, door=door, transport=transport, tls=tls)
            except _Inconclusive:
                continue  # it did not speak that: the next transport
            if taken or self._connected:
                return taken
        return []

    def _verdict(self) -> BrokerAclError:
        who, topic = self._open[0]
        if who.startswith("anonymous@"):
            door = who.partition("@")[2]
            why = (
                f"an anonymous client could publish to {topic} through the broker's other listener {door} (flexmig "
                f"uses {self.broker}): any local user could command this node there; give that listener "
                "allow_anonymous false or an ACL that keeps its clients off the command topics, or remove it"
            )
        elif who == "anonymous":
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

    def _probe(
        self, who: str, password: str | None, *, door: Listener | None = None, transport: str = "tcp", tls: bool = False
    ) -> list[str]:
        """Connect as ``who`` and publish a probe on every command topic; the topics the broker took it on. With
        ``door``, to that other listener over ``transport`` (an intruder's TLS checks no certificate)."""
        events: queue.Queue[tuple[str, Any, int]] = queue.Queue()
        self._connected = False
        client = self._client(who, password, events, door=door, transport=transport, tls=tls)
        where = str(door) if door is not None else str(self.broker)
        keepalive = max(5, int(self.timeout_s * 2))
        try:
            if door is None:
                client.connect(self.broker.host, self.broker.port, keepalive=keepalive)
            else:  # a Unix socket's path goes where the host does (paho's "unix" transport)
                client.connect(door.path or door.host, door.port or 1, keepalive=keepalive)
        except (OSError, ValueError) as exc:
            if who == "anonymous" and door is None and _tls_refused(exc):
                return []  # no certificate, no connection (require_certificate true): kept out
            raise _Inconclusive(f"the {who} probe could not connect to {where}: {exc}") from exc
        client.loop_start()
        try:
            kind, _, code = self._next(events, f"the {who} probe's connection to {where}")
            if kind != "connect" or code != 0:
                if door is not None and code not in _KEPT_OUT:
                    raise _Inconclusive(f"{where} did not take an MQTT {transport} connection (code {code})")
                if code in _KEPT_OUT or (kind == "disconnect" and who == "anonymous"):
                    return []  # refused at login: it can publish nothing
                raise _Inconclusive(f"the broker refused the {who} probe's connection (reason code {code})")
            self._connected = True
            return self._publish_probes(client, events, who if door is None else f"anonymous@{door}")
        finally:
            client.disconnect()
            client.loop_stop()

    def _client(
        self,
        who: str,
        password: str | None,
        events: queue.Queue[tuple[str, Any, int]],
        *,
        door: Listener | None,
        transport: str,
        tls: bool,
    ) -> paho.Client:
        """A paho client for one probe, its events put on ``events``."""
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"{self.identifier}-probe-{secrets.token_hex(4)}",
            protocol=paho.MQTTv5,
            transport=transport,  # type: ignore[arg-type]  # one of paho's three, chosen by the caller
        )
        client.connect_timeout = self.timeout_s
        client.on_connect = lambda _c, _u, _f, rc, _p: events.put(("connect", None, _code(rc)))
        client.on_publish = lambda _c, _u, mid, rc, _p: events.put(("publish", mid, _code(rc)))
        client.on_disconnect = lambda _c, _u, _f, rc, _p: events.put(("disconnect", None, _code(rc)))
        if who == "account":
            client.username_pw_set(self.settings.username, password)
        if door is not None:
            if tls:
                client.tls_set_context(_unverified())
        elif self.settings.tls:  # the same verification of the broker; a client certificate only for the account
            plain = ConnectionSettings(tls=True, tls_ca=self.settings.tls_ca)
            ctx = tls_context(self.settings if who == "account" else plain, "MQTT TLS files")
            if ctx is not None:
                client.tls_set_context(ctx)
        return client

    def _publish_probes(self, client: paho.Client, events: queue.Queue[tuple[str, Any, int]], who: str) -> list[str]:
        """Publish the probe on every command topic (QoS 1); the topics the broker acknowledged taking it on."""
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

    def _next(self, events: queue.Queue[tuple[str, Any, int]], what: str) -> tuple[str, Any, int]:
        try:
            return events.get(timeout=self.timeout_s)
        except queue.Empty:
            raise _Inconclusive(f"{what} did not come within {self.timeout_s:g} s") from None


def _code(rc: Any) -> int:
    """A paho reason code (or a plain int) as its number."""
    return int(getattr(rc, "value", rc))


def _unverified() -> ssl.SSLContext:
    """TLS as an intruder speaks it: no certificate of the broker checked, none of its own offered."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _tls_refused(exc: BaseException) -> bool:
    """The broker ended the TLS handshake of a client without a certificate."""
    return isinstance(exc, ssl.SSLError)


def command_topics(base: str, verbs: Iterable[str]) -> tuple[str, ...]:
    """``<base>/<verb>`` for each verb."""
    return tuple(f"{base}/{verb}" for verb in verbs)
