"""sd_notify: the datagrams a Type=notify service sends, and a watchdog fed only while sampling is alive."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.sdnotify import (
    SYSTEMD_ENV_KEYS,
    Heartbeat,
    Notifier,
    NotifyReceiver,
    Watchdog,
    parse_message,
    watchdog_timeout_s,
)


def _abstract_name() -> str:
    return f"@flexmig-test-{uuid.uuid4().hex}"


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NotifyReceiver]:
    address = str(tmp_path / "notify.sock") if request.param == "path" else _abstract_name()
    with NotifyReceiver(address) as rx:
        yield rx


def test_no_notify_socket_makes_every_call_a_no_op() -> None:
    n = Notifier.from_env({})
    assert not n.enabled
    assert n.ready() is False
    assert n.status("x") is False
    assert n.watchdog() is False
    assert n.stopping() is False
    assert n.reloading() is False


@pytest.mark.integration
def test_ready_status_watchdog_stopping_arrive_on_path_and_abstract_sockets(receiver: NotifyReceiver) -> None:
    n = Notifier(receiver.env_value)
    assert n.ready("1 GPU, 3 instances")
    assert receiver.receive(5) == {"READY": "1", "STATUS": "1 GPU, 3 instances"}
    assert n.status("sweep 10")
    assert receiver.receive(5) == {"STATUS": "sweep 10"}
    assert n.watchdog()
    assert receiver.receive(5) == {"WATCHDOG": "1"}
    assert n.stopping()
    assert receiver.receive(5) == {"STOPPING": "1"}
    n.close()


@pytest.mark.integration
def test_reloading_carries_the_monotonic_clock_in_microseconds(receiver: NotifyReceiver) -> None:
    n = Notifier(receiver.env_value)
    assert n.reloading(monotonic_usec=123456)
    assert receiver.receive(5) == {"RELOADING": "1", "MONOTONIC_USEC": "123456"}
    assert n.reloading()
    msg = receiver.receive(5)
    assert msg is not None
    assert msg["RELOADING"] == "1"
    assert int(msg["MONOTONIC_USEC"]) > 0


@pytest.mark.integration
def test_a_newline_in_status_cannot_inject_another_assignment(receiver: NotifyReceiver) -> None:
    n = Notifier(receiver.env_value)
    n.status("gpu0 ok\nREADY=1\nMAINPID=1")
    assert receiver.receive(5) == {"STATUS": "gpu0 ok READY=1 MAINPID=1"}


def test_a_vanished_service_manager_is_reported_not_raised(tmp_path: Path) -> None:
    n = Notifier(str(tmp_path / "gone.sock"))
    assert n.enabled
    assert n.ready() is False


def test_unknown_socket_kinds_are_ignored() -> None:
    assert not Notifier("vsock:2:1234").enabled


def test_from_env_reads_the_socket_and_the_watchdog_timeout() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000", "PATH": "/bin"}
    n = Notifier.from_env(env)
    assert n.enabled
    assert n.watchdog_timeout_s == 30.0
    assert env["WATCHDOG_USEC"] == "30000000", "left in place by default, so later readers still see it"


def test_from_env_can_remove_the_systemd_variables_and_keeps_the_timeout() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid()), "PATH": "/bin"}
    n = Notifier.from_env(env, unset=True)
    assert env == {"PATH": "/bin"}
    assert n.enabled
    assert n.watchdog_timeout_s == 1.0
    assert set(SYSTEMD_ENV_KEYS) == {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}


def test_watchdog_timeout_comes_from_watchdog_usec() -> None:
    assert watchdog_timeout_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_timeout_s({}) is None


def test_watchdog_timeout_is_ignored_when_meant_for_another_process() -> None:
    env = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}
    assert watchdog_timeout_s(env, pid=4242) == 30.0
    assert watchdog_timeout_s(env, pid=4243) is None
    assert watchdog_timeout_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 30.0


@pytest.mark.parametrize("usec", ["", "0", "-5", "abc", "1e6", " 10"])
def test_malformed_watchdog_usec_means_no_watchdog(usec: str) -> None:
    assert watchdog_timeout_s({"WATCHDOG_USEC": usec}) is None


def test_parse_message_splits_assignments() -> None:
    assert parse_message(b"READY=1\nSTATUS=a=b\ngarbage") == {"READY": "1", "STATUS": "a=b"}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.integration
def test_watchdog_pings_only_while_the_heartbeat_is_fresh(receiver: NotifyReceiver) -> None:
    clock = _Clock()
    beat = Heartbeat(clock)
    wd = Watchdog(Notifier(receiver.env_value), beat, timeout_s=10.0, max_age_s=3.0, clock=clock)
    assert wd.interval_s == 5.0
    assert wd.tick() is False, "no sweep yet: no ping"
    beat.beat()
    clock.now += 3.0
    assert wd.tick() is True
    assert receiver.receive(5) == {"WATCHDOG": "1"}
    clock.now += 0.5  # 3.5 s since the last sweep: wedged
    assert wd.tick() is False
    assert wd.stalled
    assert receiver.receive(5) == {"STATUS": "sampling loop stalled for 4 s; watchdog not fed"}
    assert wd.tick() is False
    assert receiver.receive(0.2) is None, "stale: nothing more is sent, the stall is announced once"
    beat.beat()
    assert wd.tick() is True
    assert not wd.stalled
    assert receiver.receive(5) == {"WATCHDOG": "1"}
    assert wd.pings == 2


def test_watchdog_without_timeout_does_not_run() -> None:
    wd = Watchdog(Notifier("/nonexistent"), Heartbeat(), timeout_s=None, max_age_s=1.0)
    asyncio.run(asyncio.wait_for(wd.run(), 5))
    assert wd.ticks == 0


# A tiny service: inventory, READY, a sampling loop that wedges once the watchdog has been fed, STOPPING.
_SERVICE = textwrap.dedent(
    """
    import asyncio
    from flexmig.sdnotify import Heartbeat, Notifier, Watchdog, watchdog_timeout_s

    async def main():
        notifier = Notifier.from_env(unset=True)
        assert watchdog_timeout_s() is None  # removed from the environment, kept by the notifier
        beat = Heartbeat()
        wd = Watchdog(notifier, beat, timeout_s=notifier.watchdog_timeout_s, max_age_s=0.5)
        notifier.ready("inventory: 2 GPUs")
        wedge = asyncio.Event()

        async def sampling():
            sweeps = 0
            while not wedge.is_set():
                beat.beat()
                sweeps += 1
                if sweeps % 5 == 0:
                    notifier.status(f"sweep {sweeps}")
                if wd.pings >= 3:
                    notifier.status("test: wedging the sampling loop")
                    wedge.set()
                await asyncio.sleep(0.02)
            await asyncio.Event().wait()  # a hung NVML call

        async def stop_when_stalled():
            while not wd.stalled:
                await asyncio.sleep(0.02)
            start = wd.ticks
            while wd.ticks < start + 4:
                await asyncio.sleep(0.02)
            notifier.stopping("bye")

        tasks = [asyncio.create_task(sampling()), asyncio.create_task(wd.run())]
        await asyncio.wait_for(stop_when_stalled(), 60)
        for t in tasks:
            t.cancel()

    asyncio.run(main())
    """
)


@pytest.mark.integration
def test_service_under_notify_socket_sends_ready_status_watchdog_and_stops_feeding_when_wedged(
    receiver: NotifyReceiver,
) -> None:
    env = dict(os.environ, NOTIFY_SOCKET=receiver.env_value, WATCHDOG_USEC="200000")
    proc = subprocess.Popen([sys.executable, "-c", _SERVICE], env=env)
    messages: list[dict[str, str]] = []
    deadline = time.monotonic() + 60
    try:
        while not messages or "STOPPING" not in messages[-1]:
            msg = receiver.receive(max(0.0, deadline - time.monotonic()))
            assert msg is not None, f"no STOPPING within 60 s; got {messages[-20:]}"
            messages.append(msg)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert messages[0] == {"READY": "1", "STATUS": "inventory: 2 GPUs"}
    statuses = [m["STATUS"] for m in messages if "STATUS" in m and "READY" not in m]
    assert "sweep 5" in statuses
    wedged = next(i for i, m in enumerate(messages) if m.get("STATUS") == "test: wedging the sampling loop")
    stalled = next(i for i, m in enumerate(messages) if m.get("STATUS", "").startswith("sampling loop stalled"))
    assert sum(1 for m in messages[:wedged] if m == {"WATCHDOG": "1"}) >= 3
    assert wedged < stalled
    assert all(m != {"WATCHDOG": "1"} for m in messages[stalled:]), "no WATCHDOG=1 once the loop is wedged"
    assert messages[-1] == {"STOPPING": "1", "STATUS": "bye"}


@pytest.mark.integration
def test_receiving_with_no_time_left_returns_none(receiver: NotifyReceiver) -> None:
    assert receiver.receive(0) is None
    assert receiver.receive(-1) is None
