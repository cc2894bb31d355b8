"""The Slurm part of flexmigd is built with what it needs through its constructor and starts without blocking the
event loop.

* The one runner of the journal's ``slurm_reregister`` actions is the Slurm part's router
  (``SlurmAgents.run_action``), handed to the actuator's constructor by ``wire()``: the executor has it from the
  moment it is built, so the journal's reconciliation at the actuator's start (before the Slurm component starts)
  finds it; nothing registers a runner later.
* The layout choice reads slurmd's version through the async command runner: a slurmd that takes seconds to answer
  (or never does) leaves the event loop free, and one past ``[slurm] command_timeout_s`` is killed and read as "no
  version". The old code ran ``slurmd -V`` as a blocking subprocess in a synchronous start hook.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from flexmig.act.executor import outside_runners
from flexmig.config import SlurmConfig
from flexmig.daemon import Daemon
from flexmig.service.slurm_layout import read_layout_inputs
from flexmig.slurm.change import KIND
from support.configs import every_part_on

VERSION = "slurm 24.11.5"


def _fake_slurmd(bin_dir: Path, delay_s: float) -> None:
    """A ``slurmd`` that answers ``-V`` after ``delay_s`` seconds, as a slow or wedged one would."""
    bin_dir.mkdir()
    script = bin_dir / "slurmd"
    pid = bin_dir / "slurmd.pid"
    script.write_text(f"#!/bin/sh\necho $$ > {pid}\nsleep {delay_s}\necho '{VERSION}'\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


async def _read_while_probing(cfg: SlurmConfig) -> tuple[tuple[str, int, str], float]:
    """``read_layout_inputs`` while a probe ticks every 10 ms on the same loop; its answer and the probe's longest
    gap between two ticks."""
    loop = asyncio.get_running_loop()
    longest = 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal longest
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = loop.time()
            longest, last = max(longest, now - last), now

    task = asyncio.create_task(probe())
    try:
        answer = await read_layout_inputs(cfg, "n1")
    finally:
        done.set()
        await task
    return answer, longest


def test_the_slurm_parts_router_is_the_one_runner_of_its_actions_from_construction(tmp_path: Path) -> None:
    d = tmp_path / "state"
    d.mkdir()
    daemon = Daemon(every_part_on(d), sim_spec="h200", sim_state=d / "sim.json", hostname="node-1")
    slurm = daemon.components.slurm
    assert slurm is not None
    # A bound method compares equal to the same method of the same object: the router's, and nothing else.
    assert dict(daemon.components.actuator.runners) == {KIND: slurm.rounds.run_action}


def test_a_runner_for_a_kind_of_the_executors_own_is_refused() -> None:
    async def runner(_run: object) -> None:
        return None

    with pytest.raises(ValueError, match="'migrate' is the executor's own"):
        outside_runners({KIND: runner, "migrate": runner})
    assert dict(outside_runners({KIND: runner})) == {KIND: runner}


@pytest.mark.integration
def test_a_slow_slurmd_does_not_block_the_event_loop(tmp_path: Path) -> None:
    _fake_slurmd(tmp_path / "bin", delay_s=3.0)
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=n1-gpu0-0-1g18gb State=FUTURE\n", encoding="utf-8")
    cfg = SlurmConfig(enabled=True, bin_dir=tmp_path / "bin", conf=conf, command_timeout_s=30.0)
    (version, declared, where), longest = asyncio.run(_read_while_probing(cfg))
    assert (version, declared, where) == (VERSION, 1, str(conf))
    # slurmd took 3 s; a blocking read would have stopped the probe for all of them.
    assert longest < 1.0, f"the event loop was blocked for {longest:.2f} s"


@pytest.mark.integration
def test_a_slurmd_that_does_not_answer_is_killed_at_the_command_timeout(tmp_path: Path) -> None:
    _fake_slurmd(tmp_path / "bin", delay_s=600.0)
    cfg = SlurmConfig(enabled=True, bin_dir=tmp_path / "bin", conf=tmp_path / "missing.conf", command_timeout_s=1.0)
    (version, declared, _), longest = asyncio.run(_read_while_probing(cfg))
    assert (version, declared) == ("", 0), "no version, no slurm.conf: auto then refuses with its one line"
    assert longest < 1.0
    pid = int((tmp_path / "bin" / "slurmd.pid").read_text())
    assert not Path(f"/proc/{pid}").exists(), "the wedged slurmd was killed (and reaped)"
