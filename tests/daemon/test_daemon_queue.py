"""A long queue costs submissions nothing (issue 19, point 9), in the real daemon run in-process on a simulated H200
whose one GPU instance runs a process of no registered job, so every submitted job waits:

* the queue is bounded (``jobs.max_pending``): past it a submission is refused, naming the limit and the key, and
  changes nothing; a job already waiting may be submitted again;
* a planning round works its plan out off the event loop and outside the action lock: a submission is answered
  while the planner is still at it (here a planner held up until the submission's answer came back).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexmig.act.client import ControlClient, ControlError
from flexmig.config import Config, parse_config
from flexmig.daemon import Daemon
from flexmig.plan import Planner
from flexmig.plan.types import NodeState, Plan
from flexmig.service import plan_now as plan_now_module
from support.daemon import running, sim_node
from support.flexmigd import short_base
from support.jobs import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SPEC = "h200:7g.141gb@0"
WAIT = 30.0


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base() as d:
        yield d


def config(base: Path, max_pending: int = 2) -> Config:
    return parse_config(
        f'mode = "act"\n[prometheus]\nenabled = false\n'
        f'[jobs]\nallowed_dirs = ["{base}"]\nmax_pending = {max_pending}\n'
        f'[control]\nsocket = "{base}/control.sock"\n'
        f'[state]\ndirectory = "{base}/state"\njournal = "{base}/state/journal.sqlite3"\n',
        "flexmig.toml",
    )


def spec(base: Path, name: str) -> Path:
    path = base / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nargv = ["{sys.executable}", "{ROOT}/examples/hook_minimal.py"]\nuser = "root"\n'
        f'working_dir = "{base}"\ncheckpoint_dir = "{base}/ckpt-{name}"\n'
        '[ranks]\nmin = 1\nmax = 1\nstart = 1\n[need]\nprofile = "1g.18gb"\n'
    )
    path.chmod(0o644)
    return path


def block_the_gpu(daemon: Daemon) -> None:
    """A process of no registered job on the only instance: the actuator neither uses nor destroys it."""
    node = sim_node(daemon)
    node.start_process(node.mig_uuids(0)[0])


async def submit(base: Path, name: str) -> Any:
    client = ControlClient(base / "control.sock", timeout_s=WAIT)
    return await asyncio.to_thread(client.call, "jobs.submit", path=str(spec(base, name)))


def test_past_jobs_max_pending_a_submission_is_refused_naming_the_key_and_changes_nothing(base: Path) -> None:
    async def scenario() -> None:
        async with running(SPEC, config(base)) as daemon:
            block_the_gpu(daemon)
            assert (await submit(base, "a"))["queued"]
            assert (await submit(base, "b"))["queued"]
            with pytest.raises(ControlError) as refused:
                await submit(base, "c")
            assert str(refused.value) == (
                "job c not queued: 2 jobs are already pending, the most jobs.max_pending allows (2); nothing was "
                "changed: submit it again once some have started, or raise jobs.max_pending"
            )
            assert (await submit(base, "a"))["queued"], "a job already waiting may be submitted again"
            act = daemon.components.actuator.runtime.act
            assert act is not None
            assert {rec.name: rec.state for rec in act.journal.jobs()} == {"a": "pending", "b": "pending"}

    asyncio.run(scenario())


def test_a_submission_is_answered_while_the_planner_works_out_its_plan(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []

    class HeldUp(Planner):
        """The planner, held up until the test lets it go (at most WAIT seconds, so that nothing hangs)."""

        def plan(self, state: NodeState, *, check: bool = True) -> Plan:
            entered.set()
            release.wait(WAIT)
            order.append("planned")
            return super().plan(state, check=check)

    monkeypatch.setattr(plan_now_module, "Planner", HeldUp)
    threading.Timer(WAIT, release.set).start()  # on code that plans on the event loop, this is what frees it

    async def scenario() -> None:
        async with running(SPEC, config(base, max_pending=10)) as daemon:
            block_the_gpu(daemon)
            assert (await submit(base, "first"))["queued"]  # wakes a planning round
            assert await asyncio.to_thread(entered.wait, WAIT), "a planning round began"
            answer = await submit(base, "second")
            order.append("answered")
            release.set()
            assert answer["queued"]

    try:
        asyncio.run(scenario())
    finally:
        release.set()
    assert order[:2] == ["answered", "planned"], "the submission waited for the planner"
