"""Nothing is dropped in silence: every bounded buffer counts what it drops, says so in a rate-limited log line,
and the daemon exports the counts (``flexmig_events_dropped_total{reason}``,
``flexmig_mqtt_command_results_dropped_total``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from flexmig.config import parse_config
from flexmig.mqtt.events import EventFactory, EventKind
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings
from support.actuator import LiveNode
from support.commands import Operator, RunningListener, password_file
from support.daemon import running, scrape
from support.mosquitto import WAIT, Brokers, needs_mosquitto


def factory() -> EventFactory:
    ids = (f"e{n:04d}" for n in itertools.count())
    return EventFactory("node-1", clock=lambda: 1.0, new_id=lambda: next(ids))


def full_disk(box: Outbox) -> None:
    """Make every later write of ``box`` fail as a full disk does (SQLITE_FULL), its file untouched otherwise."""
    pages = box._db.execute("PRAGMA page_count").fetchone()[0]
    box._db.execute(f"PRAGMA max_page_count = {pages}")


def test_events_the_disk_refuses_wait_in_memory_and_beyond_the_bound_are_dropped_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = Outbox(tmp_path / "outbox.sqlite3")
    pub = MqttPublisher(PublisherSettings(node="node-1"), box, max_unsaved=5)
    fac = factory()
    for _ in range(3):
        pub.emit(fac.make(EventKind.GPU_LOST, {"gpu": 0}))
    full_disk(box)
    with caplog.at_level(logging.WARNING):
        for _ in range(40):
            pub.emit(fac.make(EventKind.GPU_LOST, {"gpu": 0, "pad": "x" * 5000}))
    stats = pub.stats()
    assert stats.unsaved_dropped_total == 35 and stats.queued == 3 + 5
    lines = [r.getMessage() for r in caplog.records if "could not store" in r.getMessage()]
    assert len(lines) == 1 and str(box.path) in lines[0] and "more than 5 waiting" in lines[0]


@pytest.mark.integration
@needs_mosquitto
@pytest.mark.timeout(240)
def test_command_results_the_broker_cannot_take_are_dropped_beyond_the_bound_counted_and_logged_once(
    tmp_path: Path, mosquitto: Brokers
) -> None:
    broker = mosquitto(secured=True)
    release = asyncio.Event()
    started: list[str] = []

    async def plan_now(args: Mapping[str, Any]) -> dict[str, Any]:
        started.append("plan")
        await release.wait()
        return {"planned": True}

    with LiveNode("h200") as node:

        async def add() -> None:
            node.control.add("plan", plan_now)

        node.call(add())
        listener = RunningListener(node, broker, password_file(tmp_path), max_unsent_results=5)
        operator = Operator(broker)
        try:
            listener.wait_connected()
            for n in range(17):  # one runs (and waits), sixteen wait in the queue
                operator.send("plan-now", {"id": f"p{n}"})
            deadline = time.monotonic() + WAIT
            while not started or listener.listener.stats().pending < 16:
                assert time.monotonic() < deadline, "the commands to be queued"
                time.sleep(0.01)
            operator.close()
            broker.stop()  # the results now have nowhere to go

            async def finish() -> None:
                release.set()
                async with asyncio.timeout(WAIT):
                    while listener.listener.stats().pending or len(started) < 17:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)

            node.call(finish())
            stats = listener.listener.stats()
            assert stats.completed == 17 and stats.results_dropped == 12  # 17 results, 5 kept for the broker
            lines = [x for x in listener.log.lines if "command results not sent" in x]
            assert len(lines) == 1 and "more than 5 waiting" in lines[0] and "oldest dropped" in lines[0]
        finally:
            listener.stop()


@pytest.mark.integration
def test_the_daemon_exports_every_drop_counter(tmp_path: Path) -> None:
    cfg = parse_config(
        f'[mqtt]\nenabled = true\nbroker = "127.0.0.1:9"\noutbox = "{tmp_path}/outbox.sqlite3"\n', "flexmig.toml"
    )

    async def go() -> dict[str, list[tuple[dict[str, str], float]]]:
        async with running("h200x1", cfg) as daemon:
            return await scrape(daemon)

    series = asyncio.run(go())
    reasons = {labels["reason"]: value for labels, value in series["flexmig_events_dropped_total"]}
    assert reasons == {"outbox_full": 0.0, "outbox_unwritable": 0.0, "outbox_corrupt": 0.0}
    assert [v for _, v in series["flexmig_outbox_corruptions_total"]] == [0.0]
