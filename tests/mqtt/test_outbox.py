"""The persistent outbox: what goes in stays until acknowledged, across reopening and crashes."""

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from flexmig.errors import OutboxError
from flexmig.mqtt.events import EventFactory, EventKind
from flexmig.mqtt.outbox import Outbox


@pytest.fixture
def fac() -> EventFactory:
    ids = (f"e{n:04d}" for n in itertools.count())
    return EventFactory("n1", clock=lambda: 1.0, new_id=lambda: next(ids))


def test_events_come_out_in_the_order_they_went_in(tmp_path: Path, fac: EventFactory) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    for _ in range(5):
        box.put(fac.make(EventKind.GPU_LOST, {"gpu": 0}))
    assert [s.id for s in box.peek(3)] == ["e0000", "e0001", "e0002"]
    assert len(box) == 5


def test_an_event_stays_until_it_is_deleted(tmp_path: Path, fac: EventFactory) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    e = fac.make(EventKind.GPU_LOST, {"gpu": 0})
    box.put(e)
    assert box.peek()[0].body == e.to_json()
    box.delete(e.id)
    assert box.peek() == [] and len(box) == 0


def test_storing_the_same_event_twice_keeps_one(tmp_path: Path, fac: EventFactory) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    e = fac.make(EventKind.GPU_LOST, {"gpu": 0})
    box.put(e)
    box.put(e)
    assert len(box) == 1 and box.ids() == [e.id]


def test_events_survive_reopening(tmp_path: Path, fac: EventFactory) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.put(fac.make(EventKind.GPU_LOST, {"gpu": 0}))
    box.close()
    again = Outbox(tmp_path / "o.sqlite")
    assert again.ids() == ["e0000"] and len(again) == 1


def test_the_outbox_uses_write_ahead_logging(tmp_path: Path) -> None:
    Outbox(tmp_path / "o.sqlite")
    with sqlite3.connect(tmp_path / "o.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_full_outbox_drops_the_oldest_and_counts_them(tmp_path: Path, fac: EventFactory) -> None:
    size = len(fac.make(EventKind.GPU_LOST, {"gpu": 0}).to_json().encode())  # every event here has this size
    box = Outbox(tmp_path / "o.sqlite", max_bytes=3 * size)
    for _ in range(5):
        box.put(fac.make(EventKind.GPU_LOST, {"gpu": 0}))
    assert box.ids() == ["e0003", "e0004", "e0005"]
    assert box.dropped == 2 and len(box) == 3 and box.size_bytes == 3 * size


def test_the_outbox_bound_counts_bytes_of_events(tmp_path: Path, fac: EventFactory) -> None:
    box = Outbox(tmp_path / "o.sqlite", max_bytes=4000)
    for n in range(20):
        box.put(fac.make(EventKind.GPU_LOST, {"gpu": 0, "pad": "x" * (50 * n)}))
    assert 0 < box.size_bytes <= 4000 and box.dropped > 0
    kept = box.peek(limit=-1)
    assert sum(len(s.body.encode()) for s in kept) == box.size_bytes
    assert [s.id for s in kept][-1] == "e0019"  # the newest stays, the oldest went
    box.close()
    again = Outbox(tmp_path / "o.sqlite", max_bytes=4000)
    assert again.size_bytes == box.size_bytes and len(again) == len(kept)


def test_drops_of_a_full_outbox_are_logged_at_most_once_a_minute(
    tmp_path: Path, fac: EventFactory, caplog: pytest.LogCaptureFixture
) -> None:
    size = len(fac.make(EventKind.GPU_LOST, {"gpu": 0}).to_json().encode())
    box = Outbox(tmp_path / "o.sqlite", max_bytes=2 * size)
    with caplog.at_level("WARNING"):
        for _ in range(50):
            box.put(fac.make(EventKind.GPU_LOST, {"gpu": 0}))
    lines = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
    assert box.dropped == 48
    assert len(lines) == 1 and "mqtt.outbox_max_bytes" in lines[0] and str(tmp_path / "o.sqlite") in lines[0]


def test_an_outbox_that_cannot_be_opened_names_its_file(tmp_path: Path) -> None:
    with pytest.raises(OutboxError, match=str(tmp_path / "missing")):
        Outbox(tmp_path / "missing" / "o.sqlite")


@pytest.mark.integration
def test_an_event_put_before_a_sigkill_is_there_afterwards(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite"
    code = f"""
import os, signal, sys
from flexmig.mqtt.events import EventFactory, EventKind
from flexmig.mqtt.outbox import Outbox
box = Outbox({str(path)!r})
e = EventFactory("n1").make(EventKind.GPU_LOST, {{"gpu": 0}})
box.put(e)
print(e.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert Outbox(path).ids() == [proc.stdout.strip()]
    assert os.path.exists(path)
