"""A corrupt page in the outbox is a storage fault: the file is moved aside, what reads is salvaged, delivery goes on.

The page is really corrupted: a leaf page of the outbox table in the middle of the file is overwritten on disk.
Found at open (``quick_check``) or in the middle of delivery, the outbox renames the file to
``outbox.sqlite3.corrupt-<time>`` (kept for inspection), salvages every event on the pages that still read,
says so once in one error line, counts it, and goes on with a fresh file. Against a real mosquitto the events
before and after the damaged page are delivered, as are new ones, and the publisher never blames the broker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
import struct
from pathlib import Path

import pytest

from flexmig.mqtt.events import Event, EventFactory, EventKind
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings
from flexmig.mqtt.subscriber import SubscriberSettings, follow_events
from flexmig.storage import quick_check
from support.mosquitto import Brokers, cancel, needs_mosquitto
from support.wait import until

pytestmark = pytest.mark.fault

N_EVENTS = 300


def factory() -> EventFactory:
    ids = (f"e{n:04d}" for n in itertools.count())
    return EventFactory("node-1", clock=lambda: 1.0, new_id=lambda: next(ids))


def fill(box: Outbox, fac: EventFactory, n: int = N_EVENTS) -> list[str]:
    out = []
    for i in range(n):
        e = fac.make(EventKind.GPU_LOST, {"gpu": i % 8, "pad": "x" * 200})
        box.put(e)
        out.append(e.id)
    return out


def leaf_pages(path: Path) -> tuple[int, list[int]]:
    """The page size and the leaf pages of the outbox table, in key order (its root is an interior page)."""
    with sqlite3.connect(path) as db:
        page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
        root = int(db.execute("SELECT rootpage FROM sqlite_master WHERE name='outbox' AND type='table'").fetchone()[0])
    data = path.read_bytes()
    page = data[(root - 1) * page_size : root * page_size]
    assert page[0] == 0x05, "the outbox table's root is an interior page once it spans several leaves"
    (cells,) = struct.unpack(">H", page[3:5])
    (rightmost,) = struct.unpack(">I", page[8:12])
    children = []
    for i in range(cells):
        (at,) = struct.unpack(">H", page[12 + 2 * i : 14 + 2 * i])
        (child,) = struct.unpack(">I", page[at : at + 4])
        children.append(child)
    children.append(rightmost)
    for child in children:
        assert data[(child - 1) * page_size] == 0x0D, "each child is a leaf"
    return page_size, children


def corrupt_a_middle_leaf(path: Path) -> int:
    """Overwrite a leaf page in the middle of the outbox table with garbage, on disk; returns its number."""
    page_size, leaves = leaf_pages(path)
    assert len(leaves) >= 5
    victim = leaves[len(leaves) // 2]
    with path.open("r+b") as f:
        f.seek((victim - 1) * page_size)
        f.write(bytes([0xFF]) + bytes(range(256)) * (page_size // 256 - 1) + bytes(255))
    return victim


def lost_block(before: list[str], after: list[str]) -> list[str]:
    """The events missing from ``after``: one contiguous run of ``before`` (one page), order otherwise kept."""
    missing = [i for i in before if i not in set(after)]
    assert missing, "something was lost with the page"
    first = before.index(missing[0])
    assert before[first : first + len(missing)] == missing, "the lost events are one contiguous run"
    assert [i for i in before if i in set(after)] == [i for i in after if i in set(before)], "order kept"
    return missing


def test_a_corrupt_page_found_at_open_is_quarantined_and_the_readable_events_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "outbox.sqlite3"
    box = Outbox(path)
    ids = fill(box, factory())
    box.close()
    corrupt_a_middle_leaf(path)

    with caplog.at_level(logging.ERROR):
        again = Outbox(path, wall=lambda: 1_700_000_000.0)

    kept = again.ids()
    lost = lost_block(ids, kept)
    assert len(kept) + len(lost) == N_EVENTS and 0 < len(lost) < 40  # one page of ~4 KiB
    assert again.corruptions == 1 and again.lost == len(lost)
    (moved,) = again.quarantined
    assert moved == tmp_path / "outbox.sqlite3.corrupt-20231114T221320Z" and moved.exists()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1
    assert f"outbox {path} is corrupt" in lines[0] and str(moved) in lines[0]
    assert f"{len(kept)} event(s) salvaged" in lines[0] and "not the broker's" in lines[0]
    with sqlite3.connect(path) as db:
        assert quick_check(db) == []
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    e = EventFactory("node-1", new_id=lambda: "fresh").make(EventKind.GPU_LOST, {"gpu": 1})
    again.put(e)
    assert again.ids()[-1] == e.id and len(again) == len(kept) + 1


def test_a_page_that_goes_bad_while_the_outbox_is_open_is_recovered_on_the_next_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "outbox.sqlite3"
    box = Outbox(path)
    fac = factory()
    ids = fill(box, fac)
    break_under(box, path)

    with caplog.at_level(logging.ERROR):
        kept = box.ids()  # reads through the damaged page

    lost = lost_block(ids, kept)
    assert box.corruptions == 1 and box.lost == len(lost) and len(box) == len(kept)
    assert len([r for r in caplog.records if "is corrupt" in r.getMessage()]) == 1
    e = fac.make(EventKind.GPU_LOST, {"gpu": 2})
    box.put(e)
    box.delete(kept[0])
    assert box.ids() == [*kept[1:], e.id]


def break_under(box: Outbox, path: Path) -> None:
    """Damage a page of ``box``'s file while ``box`` keeps it open: its pages are in the main file (checkpoint), a
    leaf is overwritten, and a write by another connection makes ``box`` drop its cached pages and read again."""
    with sqlite3.connect(path) as other:
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    corrupt_a_middle_leaf(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("INSERT INTO outbox (id, kind, created, body) VALUES ('bump', 'gpu_lost', 0, '{}')")
        other.execute("DELETE FROM outbox WHERE id = 'bump'")
    finally:
        other.close()


@pytest.mark.integration
@needs_mosquitto
def test_delivery_goes_on_past_a_corrupt_page_and_the_broker_is_not_blamed(
    tmp_path: Path, mosquitto: Brokers, caplog: pytest.LogCaptureFixture
) -> None:
    broker = mosquitto()
    path = tmp_path / "outbox.sqlite3"

    async def scenario() -> tuple[list[str], list[str], list[str], MqttPublisher]:
        box = Outbox(path)
        fac = factory()
        before = fill(box, fac)  # waiting when the daemon starts, as after a broker outage
        break_under(box, path)  # and a page of them goes bad
        received: list[Event] = []
        subscribed = asyncio.Event()
        sub = asyncio.create_task(
            follow_events(
                SubscriberSettings(broker=broker.address, node="node-1", backoff_initial_s=0.05, backoff_max_s=0.5),
                received.append,
                on_connected=subscribed.set,
            )
        )
        await until(subscribed.is_set, what="the subscriber's subscription")  # before anything is published
        pub = MqttPublisher(
            PublisherSettings(node="node-1", broker=broker.address, backoff_initial_s=0.05, backoff_max_s=0.5), box
        )
        runner = asyncio.create_task(pub.run())
        await until(lambda: box.corruptions == 1, what="the publisher to reach the damaged page")
        after = []
        for _ in range(20):
            e = fac.make(EventKind.GPU_LOST, {"gpu": 0, "after": True})
            pub.emit(e)
            after.append(e.id)
        await until(lambda: len(box) == 0, what="the outbox to drain")
        await until(lambda: after[-1] in {e.id for e in received}, what="the last event at the subscriber")
        assert not runner.done()
        await cancel(runner, sub)
        box.close()
        return before, after, [e.id for e in received], pub

    with caplog.at_level(logging.INFO):
        before, after, got, pub = asyncio.run(scenario())

    lost = lost_block(before, got)
    assert [i for i in got if i in set(before)] == [i for i in before if i not in set(lost)]
    assert got[-len(after) :] == after
    stats = pub.stats()
    assert stats.connect_failures_total == 0 and stats.connected is False
    assert stats.outbox_corruptions_total == 1 and stats.outbox_lost_total == len(lost)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "MQTT lost the connection" in m or "unreachable" in m]
    assert len([m for m in messages if "is corrupt" in m]) == 1
    assert sum("MQTT connected" in m for m in messages) == 1, "one session from start to end"
