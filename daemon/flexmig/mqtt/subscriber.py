"""Following a node's events over MQTT: what ``flexmig events`` runs, usable by any Python consumer.

Subscribes to ``<prefix>/<node>/events/#`` (``node`` may be ``+`` for every node) at QoS 1, parses each event,
drops redeliveries by event ID, and reconnects with backoff when the broker goes away (the reconnect loop the
publisher and the command listener use, :func:`flexmig.mqtt.broker.reconnect_forever`). With a ``client_id`` the
session is persistent (``clean_session=False``): the broker queues events published while this subscriber is
disconnected and delivers them when it comes back, so a consumer with a stable ID misses nothing.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import aiomqtt

from flexmig.config import HostPort
from flexmig.errors import ConfigError
from flexmig.mqtt.broker import (
    ConnectionFailure,
    ConnectionSettings,
    check_backoff,
    client_arguments,
    reconnect_forever,
)
from flexmig.mqtt.cancellation import honour_cancel
from flexmig.mqtt.events import NODE_NAME, Deduplicator, Event

__all__ = ["SubscriberSettings", "follow_events"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriberSettings(ConnectionSettings):
    """Where to listen (the login and retry fields are :class:`ConnectionSettings`'). ``node`` is one node name
    or ``+`` for all. Someone usually watches a follower: it retries sooner and at most 30 s apart, and its
    keepalive is longer, than the daemon's clients."""

    broker: str = "127.0.0.1:1883"
    node: str = "+"
    topic_prefix: str = "flexmig/v1"
    client_id: str | None = None
    keepalive_s: int = 60
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        # Not the daemon's tls_cert/tls_key pairing rule: ``flexmig events --tls-cert`` alone may name one PEM file
        # that holds the key too (ssl reads the key from the certificate file when no key file is given).
        check_backoff(self)

    def address(self) -> HostPort:
        """The broker address; ConfigError names the bad text."""
        try:
            return HostPort.parse(self.broker)
        except ValueError as exc:
            raise ConfigError(f"--broker {self.broker!r}: {exc}") from None

    def topics(self) -> tuple[str, str]:
        """(events filter, status filter)."""
        if self.node != "+" and not NODE_NAME.fullmatch(self.node):
            raise ConfigError(f"--node {self.node!r}: a node name or + (letters, digits, '.', '_', '-')")
        base = f"{self.topic_prefix}/{self.node}"
        return f"{base}/events/#", f"{base}/status"


async def follow_events(
    settings: SubscriberSettings,
    on_event: Callable[[Event], None],
    *,
    on_status: Callable[[str, str], None] | None = None,
    on_problem: Callable[[str], None] | None = None,
    on_connected: Callable[[], None] | None = None,
    dedupe: Deduplicator | None = None,
    rng: random.Random | None = None,
) -> None:
    """Call ``on_event`` once per new event until cancelled; ``on_status(node, "online"|"offline")`` on status
    messages; ``on_problem(text)`` for malformed messages and connection trouble (then it reconnects);
    ``on_connected()`` each time a session is up and subscribed."""
    address = settings.address()
    events_filter, status_filter = settings.topics()
    seen = dedupe or Deduplicator()
    jitter = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
    problem = on_problem or (lambda _text: None)

    async def session(connected: Callable[[], None]) -> None:
        client = aiomqtt.Client(
            **client_arguments(settings, address, settings.client_id),
            clean_session=settings.client_id is None,
        )
        async with client:
            honour_cancel()  # the connect's wait_for may have swallowed it
            await client.subscribe(events_filter, qos=1)
            honour_cancel()
            if on_status is not None:
                await client.subscribe(status_filter, qos=1)
                honour_cancel()
            connected()
            if on_connected is not None:
                on_connected()
            async for message in client.messages:
                topic = message.topic.value
                payload = message.payload if isinstance(message.payload, bytes | str) else b""
                if on_status is not None and message.topic.matches(status_filter):
                    text = payload.decode(errors="replace") if isinstance(payload, bytes) else payload
                    on_status(topic.split("/")[-2], text)
                    continue
                try:
                    event = Event.from_json(payload)
                except ValueError as exc:
                    problem(f"ignored a malformed event on {topic}: {exc}")
                    continue
                if seen.first_time(event.id):
                    on_event(event)

    def failed(failure: ConnectionFailure) -> None:
        if failure.consecutive == 1:  # once per outage: the next line comes after a session that was up
            problem(f"MQTT broker {address}: {failure.error}; reconnecting")

    await reconnect_forever(
        settings, session, failed, jitter, retry_on=(aiomqtt.MqttError, OSError, ConfigError, ssl.SSLError)
    )
