"""Following a node's events over MQTT: what ``flexmig events`` runs, usable by any Python consumer.

Subscribes to ``<prefix>/<node>/events/#`` (``node`` may be ``+`` for every node) at QoS 1, parses each event,
drops redeliveries by event ID, and reconnects with backoff when the broker goes away. With a ``client_id`` the
session is persistent (``clean_session=False``): the broker queues events published while this subscriber is
disconnected and delivers them when it comes back, so a consumer with a stable ID misses nothing.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiomqtt

from flexmig.config import HostPort
from flexmig.errors import ConfigError
from flexmig.export.broker import client_arguments
from flexmig.export.events import NODE_NAME, Deduplicator, Event
from flexmig.export.mqtt import backoff_delay

__all__ = ["SubscriberSettings", "follow_events"]


@dataclass(frozen=True, slots=True)
class SubscriberSettings:
    """Where to listen. ``node`` is one node name or ``+`` for all."""

    broker: str = "127.0.0.1:1883"
    node: str = "+"
    topic_prefix: str = "flexmig/v1"
    client_id: str | None = None
    username: str | None = None
    password_file: Path | None = None
    tls: bool = False
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    keepalive_s: int = 60
    trusted_uids: frozenset[int] | None = None
    """Owners the password file may have (None: root and the current user)."""
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    connect_timeout_s: float = 10.0

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
    dedupe: Deduplicator | None = None,
    rng: random.Random | None = None,
) -> None:
    """Call ``on_event`` once per new event until cancelled; ``on_status(node, "online"|"offline")`` on status
    messages; ``on_problem(text)`` for malformed messages and connection trouble (then it reconnects)."""
    address = settings.address()
    events_filter, status_filter = settings.topics()
    seen = dedupe or Deduplicator()
    jitter = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
    problem = on_problem or (lambda _text: None)
    failures = 0
    while True:
        try:
            client = aiomqtt.Client(
                **client_arguments(settings, address, settings.client_id, settings.connect_timeout_s),
                clean_session=settings.client_id is None,
            )
            async with client:
                await client.subscribe(events_filter, qos=1)
                if on_status is not None:
                    await client.subscribe(status_filter, qos=1)
                failures = 0
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
        except asyncio.CancelledError:
            raise
        except (aiomqtt.MqttError, OSError, ConfigError, ssl.SSLError) as exc:
            failures += 1
            if failures == 1:
                problem(f"MQTT broker {address}: {exc}; reconnecting")
        await asyncio.sleep(backoff_delay(failures, settings.backoff_initial_s, settings.backoff_max_s, jitter))
