"""The MQTT publisher: retained status and state, and events that are never lost while the broker is away.

Topics under ``<prefix>/<node>/`` (prefix ``flexmig/v1`` by default):

* ``status``: retained ``online`` once connected; ``offline`` retained as the last will (the broker publishes it
  when the connection dies without a goodbye: a crash, a SIGKILL, a cable) and published on a clean shutdown;
* ``state``: retained JSON of the node's GPUs, layouts and fragmentation (``mqtt.state``), latest only;
* ``events/<kind>``: each event at QoS 1 (``mqtt.events``).

Delivery: :meth:`MqttPublisher.emit` writes the event to the SQLite outbox before anything else and returns; the
:meth:`MqttPublisher.run` loop publishes the outbox in order and deletes an event only once the broker has
acknowledged it (aiomqtt's QoS 1 publish returns after the PUBACK). When the broker is unreachable, refuses the
login or drops the connection, ``run`` reconnects with exponential backoff and jitter, logging one clear line per
kind of failure (repeated identical failures are counted, not logged, for ``log_repeat_s``); the caller's loops
go on and the outbox keeps every event. A malformed broker address is logged once and publishing stays off
until :meth:`MqttPublisher.resume` brings usable settings (``flexmigd`` does on a reload that fixes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiomqtt

from flexmig.config import HostPort
from flexmig.errors import ConfigError, OutboxError
from flexmig.mqtt.broker import (
    ConnectionFailure,
    ConnectionSettings,
    check_node_topics,
    client_arguments,
    connection_fields,
    reconnect_forever,
    refused_login,
)
from flexmig.mqtt.cancellation import honour_cancel
from flexmig.mqtt.droplog import DropLog
from flexmig.mqtt.events import Event
from flexmig.mqtt.outbox import Outbox

if TYPE_CHECKING:
    from flexmig.config import MqttConfig

__all__ = ["MqttPublisher", "PublisherSettings", "PublisherStats", "topic_for"]

log = logging.getLogger(__name__)


def topic_for(prefix: str, node: str, leaf: str) -> str:
    """``<prefix>/<node>/<leaf>``."""
    return f"{prefix}/{node}/{leaf}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PublisherSettings(ConnectionSettings):
    """Where and how to publish (the login and retry fields are :class:`ConnectionSettings`'). ``broker`` is
    ``host:port`` text, parsed when ``run`` starts so that a bad one is logged and does not stop the daemon;
    :meth:`from_config` builds these from the daemon's ``[mqtt]`` table."""

    node: str
    broker: str = "127.0.0.1:1883"
    topic_prefix: str = "flexmig/v1"
    client_id: str = ""
    """Empty: ``flexmig-<node>``, stable across restarts so the broker sees one client per node."""
    publish_timeout_s: float = 10.0
    log_repeat_s: float = 900.0
    """A failure of the same kind is logged again at most this often (with the count of those not logged)."""

    def __post_init__(self) -> None:
        check_node_topics(self.node, self.topic_prefix)
        ConnectionSettings.__post_init__(self)

    @property
    def identifier(self) -> str:
        """The MQTT client ID."""
        return self.client_id or f"flexmig-{self.node}"

    @classmethod
    def from_config(cls, cfg: MqttConfig, node: str, trusted_uids: Collection[int] | None = None) -> PublisherSettings:
        """Settings from the daemon's validated ``[mqtt]`` configuration."""
        return cls(
            node=node,
            broker=str(cfg.broker),
            topic_prefix=cfg.topic_prefix,
            client_id=cfg.client_id,
            **connection_fields(cfg, trusted_uids),
        )


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """Counters for the Prometheus exporter and ``flexmig status``."""

    connected: bool
    queued: int
    """Events waiting in the outbox (and in memory if the outbox could not be written)."""
    sent_total: int
    connect_failures_total: int
    dropped_total: int
    """Events the bounded outbox dropped (oldest first) because it was full."""
    last_error: str | None
    unsaved_dropped_total: int = 0
    """Events dropped from memory: the disk refused them and the in-memory buffer (``max_unsaved``) was full."""
    outbox_corruptions_total: int = 0
    """Times the outbox file was found corrupt, moved aside and replaced (:mod:`flexmig.mqtt.outbox`)."""
    outbox_lost_total: int = 0
    """Events lost with the unreadable pages of corrupt outbox files."""


class _FailureLog:
    """One log line per kind of failure, then silence (counted) until the kind changes or time passes."""

    def __init__(self, logger: logging.Logger, repeat_s: float, clock: Callable[[], float]) -> None:
        self._log = logger
        self._repeat_s = repeat_s
        self._clock = clock
        self._key: str | None = None
        self._at = 0.0
        self._suppressed = 0

    def failure(self, key: str, message: str, level: int = logging.WARNING) -> None:
        now = self._clock()
        if key == self._key and now - self._at < self._repeat_s:
            self._suppressed += 1
            return
        if key == self._key and self._suppressed:
            message += f" ({self._suppressed} more since {self._repeat_s:g} s ago)"
        self._log.log(level, "%s", message)
        self._key, self._at, self._suppressed = key, now, 0

    def reset(self) -> None:
        """Forget the last failure (a success came between): the next failure is logged at once."""
        self._key, self._suppressed = None, 0


class MqttPublisher:
    """Publishes status, state and events for one node. Create it, start ``run()`` as a task, call ``emit`` and
    ``set_state`` from the same event loop; cancel the task to stop (it says ``offline`` first)."""

    def __init__(
        self,
        settings: PublisherSettings,
        outbox: Outbox,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
        max_unsaved: int = 100_000,
        off: str | None = None,
    ) -> None:
        """``off``: publishing starts off for this reason (already reported by the caller, e.g. a malformed
        ``mqtt.broker`` that flexmigd started with) until :meth:`resume` gives usable settings."""
        self.settings = settings
        self.outbox = outbox
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self._log = logger or log
        self._failures = _FailureLog(self._log, settings.log_repeat_s, clock)
        self._wake = asyncio.Event()
        self._unsaved: deque[Event] = deque()
        self._max_unsaved = max_unsaved
        self._unsaved_dropped = 0
        self._drops = DropLog(self._log)
        self._state: str | None = None
        self._state_sent: str | None = None
        self._connected = False
        self._sent = 0
        self._connect_failures = 0
        self._last_error: str | None = off
        self._off = off
        self._off_reported = off is not None
        self._resumed = asyncio.Event()
        self.outbox_retry_s = 1.0
        """How long the publisher waits before reading an outbox again that failed (a full or failing disk)."""
        self.status_topic = topic_for(settings.topic_prefix, settings.node, "status")
        self.state_topic = topic_for(settings.topic_prefix, settings.node, "state")

    # ------------------------------------------------------------------------------------------ caller API
    def emit(self, event: Event) -> None:
        """Queue ``event``: stored in the outbox before this returns (kept in memory if the disk refuses; past
        ``max_unsaved`` such events the oldest of them is dropped, counted and logged)."""
        self._unsaved.append(event)
        self._save_unsaved()
        excess = len(self._unsaved) - self._max_unsaved
        if excess > 0:
            for _ in range(excess):
                self._unsaved.popleft()
            self._unsaved_dropped += excess
            self._drops.dropped(
                "unsaved",
                excess,
                f"MQTT events the outbox {self.outbox.path} could not store and memory could not keep either "
                f"(more than {self._max_unsaved} waiting)",
            )
        self._wake.set()

    def set_state(self, document: Mapping[str, Any]) -> None:
        """Replace the retained state; only the latest is published (serialised now, so later changes to
        ``document`` do not leak in)."""
        self._state = json.dumps(document, separators=(",", ":"), allow_nan=False)
        self._wake.set()

    @property
    def off(self) -> str | None:
        """Why publishing is off (no usable broker address), or None while it publishes or tries to."""
        return self._off

    def resume(self, settings: PublisherSettings) -> bool:
        """Publish with ``settings`` (a fixed broker address) if publishing is off; returns whether it was.

        A publisher that is on keeps its settings (``[mqtt]`` changes take effect at the next start)."""
        if self._off is None:
            return False
        self.settings = settings
        self._off = self._last_error = None
        self._off_reported = False
        self._resumed.set()
        return True

    async def wait_on(self) -> None:
        """Return once publishing is on (at once if it is): a broker address is there to connect to."""
        while self._off is not None:
            await self._resumed.wait()

    @property
    def connected(self) -> bool:
        """True while a session with the broker is up."""
        return self._connected

    def stats(self) -> PublisherStats:
        """Counters as of now."""
        return PublisherStats(
            connected=self._connected,
            queued=len(self.outbox) + len(self._unsaved),
            sent_total=self._sent,
            connect_failures_total=self._connect_failures,
            dropped_total=self.outbox.dropped,
            last_error=self._last_error,
            unsaved_dropped_total=self._unsaved_dropped,
            outbox_corruptions_total=self.outbox.corruptions,
            outbox_lost_total=self.outbox.lost,
        )

    def event_topic(self, kind: str) -> str:
        """The topic of events of ``kind``."""
        return topic_for(self.settings.topic_prefix, self.settings.node, f"events/{kind}")

    # ------------------------------------------------------------------------------------------ the loop
    async def run(self) -> None:
        """Publish until cancelled. Never raises for broker, network, TLS or credential trouble. While publishing
        is off (a malformed broker address) it waits for :meth:`resume`; :meth:`emit` still stores every event."""
        address = await self._address()

        def failed(failure: ConnectionFailure) -> None:
            self._connect_failures += 0 if failure.was_up else 1
            key, message = self._describe(failure.error, address, failure.was_up)
            self._last_error = message
            self._failures.failure(key, message)

        await reconnect_forever(self.settings, lambda connected: self._session(address, connected), failed, self._rng)

    async def _address(self) -> HostPort:
        """The broker's address, once there is a usable one (a malformed one is logged once, then waited out)."""
        while True:
            if self._off is None:
                broker = self.settings.broker
                try:
                    return HostPort.parse(broker)
                except ValueError as exc:
                    self._off = self._last_error = f"malformed broker address {broker!r}: {exc}"
            if not self._off_reported:
                self._off_reported = True
                self._log.error(
                    "MQTT publishing is off: %s; expected host:port. Events are kept in the outbox %s",
                    self._off,
                    self.outbox.path,
                )
            self._resumed.clear()
            await self._resumed.wait()

    async def _session(self, address: HostPort, connected: Callable[[], None]) -> None:
        s = self.settings
        client = aiomqtt.Client(
            **client_arguments(s, address, s.identifier),
            will=aiomqtt.Will(self.status_topic, "offline", qos=1, retain=True),
            clean_session=True,
        )
        async with client:
            self._connected = True
            connected()
            self._state_sent = None  # the broker may have restarted without our retained state
            self._failures.reset()
            queued = len(self.outbox) + len(self._unsaved)
            self._log.info("MQTT connected to %s as %s; %d event(s) queued", address, s.identifier, queued)
            try:
                honour_cancel()  # the connect's wait_for may have swallowed it
                await client.publish(self.status_topic, "online", qos=1, retain=True, timeout=s.publish_timeout_s)
                honour_cancel()
                # The watch runs in this task, not as a second child: on 3.11 a child that fails while its parent
                # waits in TaskGroup.__aexit__ leaves the parent's cancel request counted (no uncancel), and
                # honour_cancel() would then take a lost connection for a shutdown.
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(self._pump(client))
                    await self._watch(client)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await client.publish(self.status_topic, "offline", qos=1, retain=True, timeout=2.0)
                raise
            finally:
                self._connected = False

    @staticmethod
    async def _watch(client: aiomqtt.Client) -> None:
        """Raise as soon as the connection drops (aiomqtt ends message iteration with MqttError then)."""
        async for _ in client.messages:
            pass
        raise aiomqtt.MqttError("the broker closed the connection")

    async def _pump(self, client: aiomqtt.Client) -> None:
        timeout = self.settings.publish_timeout_s
        while True:
            self._wake.clear()
            self._save_unsaved()
            busy = False
            state = self._state
            if state is not None and state != self._state_sent:
                await client.publish(self.state_topic, state, qos=1, retain=True, timeout=timeout)
                self._state_sent = state
                busy = True
                honour_cancel()
            try:
                batch = self.outbox.peek(100)
                for item in batch:
                    await client.publish(self.event_topic(item.kind), item.body, qos=1, timeout=timeout)
                    self.outbox.delete(item.id)  # only now: the broker has acknowledged it
                    self._sent += 1
                    honour_cancel()  # after the delete: an acknowledged event is never sent again
            except OutboxError as exc:
                # The disk's trouble, not the broker's: the session stays up, and the outbox is tried again.
                self._failures.failure("outbox", f"{exc}; MQTT itself is fine; retrying in {self.outbox_retry_s:g} s")
                await asyncio.sleep(self.outbox_retry_s)
                continue
            if not busy and not batch:
                await self._wake.wait()

    # ------------------------------------------------------------------------------------------ helpers
    def _save_unsaved(self) -> None:
        while self._unsaved:
            try:
                self.outbox.put(self._unsaved[0])
            except OutboxError as exc:
                self._failures.failure(
                    "outbox", f"{exc}; keeping {len(self._unsaved)} event(s) in memory until it can be written"
                )
                return
            self._unsaved.popleft()

    def _describe(self, exc: BaseException, address: HostPort, was_up: bool) -> tuple[str, str]:
        """(kind of failure, one clear line naming the broker, the cause, and what happens next)."""
        s = self.settings
        queued = len(self.outbox) + len(self._unsaved)
        tail = (
            f"; retrying with backoff (at most {s.backoff_max_s:g} s apart); "
            f"{queued} event(s) wait in {self.outbox.path}"
        )
        text = str(exc) or type(exc).__name__
        if isinstance(exc, OutboxError):
            return "outbox", f"MQTT publishing paused by the outbox, not the broker: {text}"
        if refused_login(exc):
            who = f"user {s.username!r}" if s.username else "an anonymous client"
            return "auth", (
                f"MQTT broker {address} refused the login of {who} ({text}): check mqtt.username and "
                f"mqtt.password_file{tail}"
            )
        if isinstance(exc, ConfigError):
            return "config", f"MQTT cannot connect to {address}: {text}{tail}"
        lowered = text.lower()
        if "ssl" in lowered or "certificate" in lowered or isinstance(exc, ssl.SSLError):
            return "tls", f"MQTT TLS handshake with {address} failed: {text}{tail}"
        if was_up or "disconnect" in lowered or "closed" in lowered:
            return "lost", f"MQTT lost the connection to {address}: {text}{tail}"
        if "timed out" in lowered:
            return "timeout", f"MQTT broker {address} did not answer within {s.connect_timeout_s:g} s{tail}"
        return "unreachable", f"MQTT broker {address} is unreachable: {text}{tail}"
