"""A wall clock set back (or forward) never changes how long the daemon waits: durations are monotonic.

The real daemon in this process, in mode act on a simulated node, with its wall clock injected (never the machine's
clock): a job runs, the wall clock is set back an hour, and the planner still counts the job as moved moments ago
(it used to count it as moved an hour from now, and so froze its settling for that hour, saying nothing), and says
once that the wall clock jumped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import sys
import time
from pathlib import Path

import pytest

from flexmig.config import Config, ControlConfig, JobsConfig, SamplingConfig, StateConfig
from flexmig.daemon import Daemon
from support.daemon import LOOPBACK_ANY, started
from support.hostile import base_dir
from support.jobs import ROOT, kill_ranks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class SetWall:
    """The machine's wall clock plus an offset a test sets (what ``date -s`` would do, to this daemon alone)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def test_a_wall_clock_set_back_an_hour_neither_stretches_the_settling_time_nor_goes_unsaid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wall = SetWall()

    async def scenario(base: Path) -> None:
        config = Config(
            mode="act",
            sampling=SamplingConfig(interval_s=0.1),
            jobs=JobsConfig(allowed_dirs=(base,)),
            state=StateConfig(directory=base / "state", journal=base / "state" / "journal.sqlite3"),
            control=ControlConfig(socket=base / "control.sock"),
        )
        daemon = Daemon(config, sim_spec="h200", sim_workload=False, metrics_addr=LOOPBACK_ANY, wall=wall)
        async with started(daemon):
            actuator = daemon.components.actuator.runtime
            spec = base / "job.toml"
            spec.write_text(
                f'name = "steady"\nargv = ["{sys.executable}", "{ROOT}/examples/hook_minimal.py"]\n'
                f'user = "{pwd.getpwuid(os.geteuid()).pw_name}"\nworking_dir = "{base}"\n'
                f'checkpoint_dir = "{base}/ckpt"\n[need]\nprofile = "1g.18gb"\n'
            )
            spec.chmod(0o644)
            request = {"op": "jobs.submit", "args": {"path": str(spec)}}
            answer = await actuator.dispatch(json.dumps(request).encode())
            assert answer["ok"], answer
            before = (await actuator.plan_now(source="test")).document
            wall.offset = -3600.0
            after = (await actuator.plan_now(source="test")).document
            for doc in (before, after):
                (job,) = doc["running"]
                moved_ago = doc["now_s"] - job["last_moved_s"]
                assert 0 <= moved_ago < 60, f"the job counts as moved {moved_ago:.0f} s ago"
            assert after["now_s"] < before["now_s"] - 3000, "the planner's timestamps are the wall clock's"

    with base_dir("fm-wall-") as base, caplog.at_level(logging.WARNING):
        try:
            asyncio.run(scenario(base))
        finally:
            kill_ranks(base / "state" / "journal.sqlite3", base=base)
    lines = [r.getMessage() for r in caplog.records if "wall clock was set back" in r.getMessage()]
    assert len(lines) == 1 and "3600 s" in lines[0], lines
