"""Every background task's death is loud: the daemon stops with one line naming the task (exit status 1), or, for a
task that is safe to run again, restarts it with a counted, logged restart. Never "Task exception was never
retrieved", never a task that just stops while the daemon pretends all is well.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from flexmig.act.events import ActEvent
from flexmig.act.procs import LaunchRequest, SubprocessLauncher
from flexmig.act.records import AckPlacement, Slot
from flexmig.act.supervisor import RankHandle, Supervisor
from flexmig.config import Config, ControlConfig, HostPort, MqttConfig, SamplingConfig
from flexmig.daemon import Daemon
from flexmig.errors import BackgroundTaskError
from flexmig.mqtt.events import EventFactory, EventKind
from flexmig.tasks import spawn
from flexmig.wiring.component import Loop, idle
from support.daemon import LOOPBACK_ANY, scrape, values
from support.wait import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONFIG = Config(sampling=SamplingConfig(interval_s=0.05), control=ControlConfig(enabled=False))


def daemon_with(name: str, loop: Callable[[], Awaitable[None]], *, restart: bool = False) -> Daemon:
    daemon = Daemon(CONFIG, sim_spec="h200", sim_workload=False, metrics_addr=LOOPBACK_ANY)
    daemon.restart_backoff_s = (0.05, 0.2)

    async def run() -> None:
        await loop()

    daemon.add(Loop(name, run, restart=restart))
    return daemon


class Hooks(Loop):
    """A component whose start and close are the test's (its loop waits to be cancelled)."""

    def __init__(
        self,
        name: str,
        start: Callable[[], Awaitable[None]] | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(name, idle)
        self._start, self._close = start, close

    async def start(self) -> None:
        if self._start is not None:
            await self._start()

    async def close(self) -> None:
        if self._close is not None:
            await self._close()


async def run_until_stopped(daemon: Daemon, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        await daemon.run(asyncio.Event())  # nothing sets this stop: only a task's death ends the run


def test_a_loop_that_raises_stops_the_daemon_with_one_line_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        await asyncio.sleep(0.2)
        raise RuntimeError("the planner's bug")

    daemon = daemon_with("planner", broken)
    with caplog.at_level(logging.INFO), pytest.raises(BackgroundTaskError) as err:
        asyncio.run(run_until_stopped(daemon))
    assert str(err.value) == "background task 'planner' died: RuntimeError: the planner's bug"
    lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in lines][:1] == ["background task 'planner' died: RuntimeError: the planner's bug"]
    assert "stopping" in caplog.text, "the daemon stopped in order (stop hooks, loops cancelled, NVML closed)"


def test_a_detached_task_that_dies_stops_the_daemon_too(caplog: pytest.LogCaptureFixture) -> None:
    async def spawner() -> None:
        async def rank_watcher() -> None:
            await asyncio.sleep(0.1)
            raise OSError(24, "Too many open files")

        spawn(rank_watcher(), name="rank-train-0")
        await asyncio.Event().wait()

    daemon = daemon_with("actuator", spawner)
    with caplog.at_level(logging.INFO), pytest.raises(BackgroundTaskError, match="'rank-train-0' died: OSError"):
        asyncio.run(run_until_stopped(daemon))
    gc.collect()
    assert "never retrieved" not in caplog.text
    assert "Traceback" not in caplog.text, "an OS error is one line; a traceback is for bugs"


def test_a_restartable_loop_is_restarted_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[float] = []

    async def flaky() -> None:
        runs.append(time.monotonic())
        if len(runs) <= 2:
            raise ConnectionError("broker went away")
        await asyncio.Event().wait()

    daemon = daemon_with("mqtt", flaky, restart=True)

    async def scenario() -> list[float]:
        stop = asyncio.Event()
        task = asyncio.create_task(daemon.run(stop))
        await daemon.started()
        async with asyncio.timeout(20):
            while len(runs) < 3:  # noqa: ASYNC110 - the loop under test counts its runs in a list
                await asyncio.sleep(0.02)
        got = values(await scrape(daemon), "flexmig_task_restarts_total", task="mqtt")
        stop.set()
        await task
        return got

    with caplog.at_level(logging.INFO):
        restarts = asyncio.run(scenario())
    assert restarts == [2.0]
    assert caplog.text.count("background task 'mqtt' failed (ConnectionError: broker went away); restart") == 2


def test_a_loop_that_keeps_failing_is_given_up_on_and_stops_the_daemon() -> None:
    async def always() -> None:
        raise ConnectionError("no")

    daemon = daemon_with("dcgm", always, restart=True)
    with pytest.raises(BackgroundTaskError, match=r"'dcgm' died: ConnectionError: no \(after 5 restarts"):
        asyncio.run(run_until_stopped(daemon))


class ExplodingSink:
    def emit(self, event: ActEvent) -> None:
        if event.kind == "job_exited":
            raise RuntimeError("event sink bug")


def test_a_rank_watcher_that_dies_is_reported_to_the_loop_not_left_unretrieved(tmp_path: Path) -> None:
    contexts: list[dict[str, object]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: contexts.append(ctx))

        async def offload(fn: Callable[[], object]) -> object:
            return fn()

        sup = Supervisor(
            launcher=SubprocessLauncher(),
            devices=None,  # type: ignore[arg-type]  # no MIG device: the rank's place has no UUID
            offload=offload,  # type: ignore[arg-type]
            logs_dir=tmp_path,
            events=ExplodingSink(),
            acks=AckPlacement(tmp_path),
        )
        req = LaunchRequest(argv=("/usr/bin/true",), env={}, cwd=tmp_path, log_path=tmp_path / "r.log")
        proc = await sup.launcher.launch(req)
        sup._watch("train", RankHandle(0, Slot(0, 0, "1g.18gb", ""), proc, 1))
        async with asyncio.timeout(20):
            while not contexts:  # noqa: ASYNC110
                await asyncio.sleep(0.02)

    asyncio.run(scenario())
    (ctx,) = contexts
    assert ctx["message"] == "background task 'rank-train-0' died"
    assert isinstance(ctx["exception"], RuntimeError)


# ------------------------------------------------------------------------------- teardown never depends on a start


def test_a_loop_stopped_before_its_first_step_still_runs_its_finally() -> None:
    """A stop asked right after start-up (a SIGTERM just after "up") must not cancel a loop before it began: its
    ``finally`` is where it lets go of what it holds."""
    closed: list[str] = []

    async def holder() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            closed.append("holder")

    daemon = daemon_with("holder", holder)
    stop = asyncio.Event()

    async def stop_at_once() -> None:
        stop.set()  # the last start hook: the loops are made after it, and cancelled at once

    daemon.add(Hooks("stopper", start=stop_at_once))
    asyncio.run(asyncio.wait_for(daemon.run(stop), 60))
    assert closed == ["holder"]


def test_components_close_after_the_loops_in_reverse_order_whether_or_not_a_loop_ran() -> None:
    order: list[str] = []

    async def loop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append("loop")

    def hook(name: str) -> Callable[[], Awaitable[None]]:
        async def close() -> None:
            order.append(name)

        return close

    daemon = daemon_with("loop", loop)
    daemon.add(Hooks("first", close=hook("first in the list")))
    daemon.add(Hooks("second", close=hook("second in the list")))
    stop = asyncio.Event()

    async def stop_at_once() -> None:
        stop.set()

    daemon.add(Hooks("stopper", start=stop_at_once))
    asyncio.run(asyncio.wait_for(daemon.run(stop), 60))
    assert order == ["loop", "second in the list", "first in the list"]


def test_components_close_when_start_up_fails_and_a_failing_one_does_not_stop_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed: list[str] = []

    async def never() -> None:
        raise AssertionError("no loop runs when start-up fails")

    async def broken_start() -> None:
        raise OSError(28, "No space left on device")

    async def close_ok() -> None:
        closed.append("ok")

    async def close_broken() -> None:
        raise RuntimeError("close bug")

    daemon = daemon_with("never", never)
    daemon.add(Hooks("ok", close=close_ok))
    daemon.add(Hooks("broken", start=broken_start, close=close_broken))
    with caplog.at_level(logging.INFO), pytest.raises(OSError, match="No space left"):
        asyncio.run(asyncio.wait_for(daemon.run(asyncio.Event()), 60))
    assert closed == ["ok"]
    assert "close of component 'broken' failed" in caplog.text and "close bug" in caplog.text


def test_the_actuator_stopped_right_after_start_up_closes_its_journal_and_removes_its_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flake this fixes: SIGTERM just after "up" left a simulated node's private directory behind."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where a simulated daemon makes its private directory
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    daemon = Daemon(
        Config(sampling=SamplingConfig(interval_s=0.05)), sim_spec="h200", sim_workload=False, metrics_addr=LOOPBACK_ANY
    )  # a free port: the default one may be another test's or another daemon's on this machine
    stop = asyncio.Event()

    async def stop_at_once() -> None:
        stop.set()

    daemon.add(Hooks("stopper", start=stop_at_once))  # after the actuator's start: its socket and journal are open
    asyncio.run(asyncio.wait_for(daemon.run(stop), 60))
    paths = daemon.components.actuator.runtime.paths
    assert paths is not None and paths.private is not None and paths.private.parent == tmp_path
    assert not paths.private.exists(), "a clean stop removes the simulated node's private directory"
    assert daemon.components.actuator.runtime.act is None, "the journal is closed"


def test_a_restarted_mqtt_loop_still_has_its_outbox(tmp_path: Path) -> None:
    """The outbox belongs to the component, not to one run of its loop: a restart after a failure publishes from the
    same, open outbox (it used to be closed by the failed run's ``finally``)."""
    outbox = tmp_path / "state" / "outbox.sqlite3"
    outbox.parent.mkdir(mode=0o700)
    config = Config(
        sampling=SamplingConfig(interval_s=0.05),
        control=ControlConfig(enabled=False),
        mqtt=MqttConfig(enabled=True, broker=HostPort("127.0.0.1", free_port()), outbox=outbox),  # nobody listens there
    )
    daemon = Daemon(config, sim_spec="h200", sim_workload=False, metrics_addr=LOOPBACK_ANY)
    daemon.restart_backoff_s = (0.05, 0.2)
    mqtt = daemon.components.mqtt
    assert mqtt is not None
    runs: list[int] = []
    real_start = mqtt.start

    async def start_with_a_failing_publisher() -> None:
        await real_start()  # the publisher exists from the component's start on
        real_run = mqtt.publisher.run

        async def fails_once() -> None:
            runs.append(1)
            if len(runs) == 1:
                raise RuntimeError("publisher bug")
            await real_run()

        mqtt.publisher.run = fails_once  # type: ignore[method-assign]

    mqtt.start = start_with_a_failing_publisher  # type: ignore[method-assign]

    async def scenario() -> tuple[list[float], list[str]]:
        stop = asyncio.Event()
        task = asyncio.create_task(daemon.run(stop))
        await daemon.started()
        async with asyncio.timeout(20):
            while len(runs) < 2:  # noqa: ASYNC110 - the loop under test counts its runs in a list
                await asyncio.sleep(0.02)
        event = EventFactory("node-1").make(EventKind.INSTANCE_CREATED, {"gpu": 0})
        mqtt.findings.emit(event)
        stored = [event.id] if event.id in mqtt.outbox.ids() else []
        got = values(await scrape(daemon), "flexmig_task_restarts_total", task="mqtt")
        stop.set()
        await task
        return got, stored

    restarts, stored = asyncio.run(scenario())
    assert restarts == [1.0] and stored, "the restarted loop's outbox took the event"
