"""The MQTT publisher and the event follower stop when cancelled, whatever they are waiting for at that moment.

Python 3.11's ``asyncio.wait_for`` (aiomqtt waits for CONNACK and PUBACK through it) returns normally when the
awaited answer lands in the same loop turn as the cancellation, swallowing it; a publisher that then went on
would keep the daemon's TaskGroup, and so its shutdown, waiting forever (and ``flexmig events --timeout`` would
never return). Here the cancellation is made to land exactly there: a log handler on aiomqtt's logger cancels the
task when paho logs the broker's answer, in the same callback that wakes the waiting coroutine. A real mosquitto
answers; the bound is generous.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from flexmig.mqtt.events import EventFactory, EventKind
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings
from flexmig.mqtt.subscriber import SubscriberSettings, follow_events
from support.mosquitto import WAIT, Mosquitto, needs_mosquitto
from support.wait import until

pytestmark = [pytest.mark.integration, needs_mosquitto, pytest.mark.timeout(120)]

STOP_BOUND_S = 10.0
MQTT_LOGGER = "mqtt"  # aiomqtt's default logger, which paho logs every packet to


class CancelOnPacket(logging.Handler):
    """Cancels ``task`` when paho logs receiving the ``nth`` ``packet`` (``CONNACK``, ``PUBACK``)."""

    def __init__(self, packet: str, nth: int) -> None:
        super().__init__(logging.DEBUG)
        self.packet = packet
        self.nth = nth
        self.seen = 0
        self.task: asyncio.Task[None] | None = None
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        if not record.getMessage().startswith(f"Received {self.packet}"):
            return
        self.seen += 1
        if self.seen == self.nth and self.task is not None:
            self.fired = True
            self.task.cancel()


def stops_when_cancelled(start: Callable[[], Coroutine[Any, Any, None]], packet: str, nth: int) -> bool:
    """Run ``start()`` as a task, cancel it when paho logs the ``nth`` ``packet``: did it stop within the bound?"""
    hook = CancelOnPacket(packet, nth)
    logger = logging.getLogger(MQTT_LOGGER)
    old_level = logger.level
    logger.addHandler(hook)
    logger.setLevel(logging.DEBUG)

    async def scenario() -> bool:
        task = asyncio.create_task(start())
        hook.task = task
        try:
            await until(lambda: hook.fired, what=f"the {packet} to arrive")
            done, _ = await asyncio.wait({task}, timeout=STOP_BOUND_S)
            return task in done
        finally:
            if not task.done():  # the bug: stop it for good, so the test run does not hang
                task.cancel()
                await asyncio.wait({task}, timeout=WAIT)

    try:
        return asyncio.run(scenario())
    finally:
        logger.removeHandler(hook)
        logger.setLevel(old_level)


@pytest.mark.parametrize(
    ("packet", "nth"),
    [
        ("CONNACK", 1),  # while connecting
        ("PUBACK", 1),  # while publishing the retained "online"
        ("PUBACK", 4),  # while publishing the outbox
    ],
)
def test_a_cancelled_publisher_stops_even_when_the_broker_answers_in_the_same_loop_turn(
    broker: Mosquitto, tmp_path: Path, packet: str, nth: int
) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    settings = PublisherSettings(
        node="node-1", broker=broker.address, backoff_initial_s=0.05, backoff_max_s=0.5, connect_timeout_s=5
    )
    publisher = MqttPublisher(settings, outbox)
    factory = EventFactory("node-1")
    for i in range(20):
        publisher.emit(factory.make(EventKind.GPU_LOST, {"gpu": i, "uuid": None, "reason": f"gpu {i}"}))
    try:
        stopped = stops_when_cancelled(publisher.run, packet, nth)
    finally:
        outbox.close()
    assert stopped, f"the publisher was still running {STOP_BOUND_S} s after a cancellation at {packet} #{nth}"


@pytest.mark.parametrize(
    ("packet", "nth"),
    [
        ("CONNACK", 1),  # while connecting
        ("SUBACK", 1),  # while subscribing to the events
        ("SUBACK", 2),  # while subscribing to the status
    ],
)
def test_a_cancelled_event_follower_stops_even_when_the_broker_answers_in_the_same_loop_turn(
    broker: Mosquitto, packet: str, nth: int
) -> None:
    settings = SubscriberSettings(broker=broker.address, node="node-1", backoff_initial_s=0.05, backoff_max_s=0.5)
    stopped = stops_when_cancelled(
        lambda: follow_events(settings, lambda _event: None, on_status=lambda _node, _status: None), packet, nth
    )
    assert stopped, f"the event follower was still running {STOP_BOUND_S} s after a cancellation at {packet} #{nth}"
