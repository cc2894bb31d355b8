"""One mode, read where it matters: the executor and whoever shares its RuntimeMode see a switch at once, and those
that listen hear each change once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from flexmig.act.mode import RuntimeMode
from flexmig.config import Mode
from support.simact import SimActuator


def test_a_switch_is_heard_once_with_the_mode_before_and_after() -> None:
    mode = RuntimeMode("advise")
    heard: list[tuple[Mode, Mode]] = []
    mode.on_change(lambda old, new: heard.append((old, new)))
    assert mode.set("act") == "advise"
    assert mode.set("act") == "act"  # no change, nothing heard
    mode.set("observe")
    assert heard == [("advise", "act"), ("act", "observe")]
    assert mode.value == "observe"


def test_the_executor_reads_the_shared_mode(tmp_path: Path) -> None:
    mode = RuntimeMode("observe")

    async def scenario() -> None:
        async with SimActuator(tmp_path, "h200", mode=mode) as rig:
            seen = [rig.act.executor.mode]
            mode.set("act")
            seen.append(rig.act.executor.mode)
            assert seen == ["observe", "act"], "no copy to sync: the executor holds the daemon's RuntimeMode"
            rig.act.set_mode("advise")  # a reload through the actuator changes the one object
            assert mode.value == "advise"

    asyncio.run(scenario())
