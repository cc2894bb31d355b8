"""Every background task's death is loud: the daemon stops with one line naming the task (exit status 1), or, for a
task that is safe to run again, restarts it with a counted, logged restart. Never "Task exception was never
retrieved", never a task that just stops while the daemon pretends all is well.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from flexmig.act.events import ActEvent
from flexmig.act.procs import LaunchRequest, SubprocessLauncher
from flexmig.act.records import AckPlacement, Slot
from flexmig.act.supervisor import RankHandle, Supervisor
from flexmig.config import Config, ControlConfig, SamplingConfig
from flexmig.daemon import Daemon
from flexmig.errors import BackgroundTaskError
from flexmig.tasks import spawn
from support.daemon import LOOPBACK_ANY, scrape, values

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONFIG = Config(sampling=SamplingConfig(interval_s=0.05), control=ControlConfig(enabled=False))


def daemon_with(name: str, loop: Callable[[], Awaitable[None]], *, restart: bool = False) -> Daemon:
    daemon = Daemon(CONFIG, sim_spec="h200", sim_workload=False, metrics_addr=LOOPBACK_ANY)
    daemon.restart_backoff_s = (0.05, 0.2)

    async def run() -> None:
        await loop()

    daemon.add_loop(name, run, restart=restart)
    return daemon


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
