"""A crash of flexmig in the middle of a Slurm re-registration is finished at the next start: the node is neither
left drained nor unregistered, no job stays held, no instance is unknown to Slurm, and the hook job resumes once.

The crash is the actuator dying right after the chosen step's journal commit (before the step ran, or after it
ran): everything in memory is dropped, the journal and the simulated driver's state file stay, as after a SIGKILL;
Slurm's daemons keep running, as they would. The next start reconciles the journal, as flexmigd does.
"""

from __future__ import annotations

import asyncio

import pytest

from flexmig.act.journal import StepEvent
from support.slurm import SlurmRig, skip_reason
from support.wait import until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


class Crash(BaseException):
    """Stands for SIGKILL: nothing catches it, nothing after it runs."""


@pytest.mark.parametrize(
    "at",
    [
        "close:intent",
        "hold:done",
        "await_idle:done",
        "drain:done",
        "stop_slurmd:done",
        "unreserve:done",
        "recheck:done",
        "destroy:intent",
        "create:done",
        "register:intent",
        "attributes:intent",
        "release:intent",
    ],
)
def test_a_crash_mid_reregistration_is_finished_at_the_next_start(at: str) -> None:
    step, phase = at.split(":")
    armed = {"on": False}

    def on_step(ev: StepEvent) -> None:
        if armed["on"] and ev.action_kind == "slurm_reregister" and ev.phase == phase and ev.step.startswith(step):
            armed["on"] = False
            raise Crash(at)

    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4", on_step=on_step) as rig:
            hook = rig.hook_job("--gres=gpu:3g.71gb:1")
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _steps(rig, hook), what="the hook job steps", not_yet=(Exception,))
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(2)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            armed["on"] = True
            with pytest.raises(Crash):
                await rig.change()
            await rig.close_flexmig()
            summary = await rig.open_flexmig()
            assert summary["plans"], summary
            assert all(a["outcome"] == "completed" for p in summary["plans"] for a in p["actions"]), summary
            read = await rig.agent.read()
            assert read.in_sync, (read.registered_as, read.expected)
            assert read.node is not None and not read.node.drained, read.node
            assert read.mine is None  # flexmig's reservation is gone: the node is open
            for j in small:
                await rig.wait_state(j, "RUNNING")
            job = await rig.wait_state(hook, "RUNNING")
            assert job.restart_count == 1
            await until(lambda: _started_twice(rig, hook), what="the hook job resumed", not_yet=(Exception,))
            log = rig.hook_log(hook)
            starts = [e for e in log if e["event"] == "start"]
            ckpts = [e for e in log if e["event"] == "checkpoint"]
            assert len(starts) == 2 and len(ckpts) == 1, log
            assert starts[1]["step"] == ckpts[0]["step"] + 1

    asyncio.run(scenario())


async def _steps(rig: SlurmRig, job: int) -> bool:
    return sum(1 for e in rig.hook_log(job) if e["event"] == "step") >= 3


async def _started_twice(rig: SlurmRig, job: int) -> bool:
    return sum(1 for e in rig.hook_log(job) if e["event"] == "start") >= 2


@pytest.mark.parametrize("problem", ["writable by all", "AutoDetect=nvml"])
def test_a_gres_conf_flexmig_cannot_use_is_refused_before_anything_is_stopped(problem: str) -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            hook = rig.hook_job("--gres=gpu:3g.71gb:1")
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _steps(rig, hook), what="the hook job steps", not_yet=(Exception,))
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(2)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            conf = rig.paths.gres_conf
            before = conf.read_text()
            if problem == "AutoDetect=nvml":
                conf.write_text(before + "AutoDetect=nvml\n")  # a stray line, as a site's template might leave
            else:
                conf.chmod(0o666)  # someone made it writable by everyone
            pid = (rig.paths.slurmd_pid(rig.node)).read_text()
            actions = len(rig.act.journal.recent_actions())
            for _ in range(3):
                rnd = await rig.agent.round("act")
                assert rnd.result is None and rnd.note.startswith("refused: ") and str(conf) in rnd.note, rnd.note
                assert ("AutoDetect" in rnd.note) == (problem == "AutoDetect=nvml"), rnd.note
            assert len(rig.act.journal.recent_actions()) == actions  # no failed action each round
            assert (
                rig.paths.slurmd_pid(rig.node)
            ).read_text() == pid and await rig.agent.slurmd.running()  # never stopped
            job = await rig.job(hook)
            assert job is not None and job.state == "RUNNING" and job.restart_count == 0  # nobody was asked
            conf.write_text(before)
            conf.chmod(0o644)
            again = await rig.change()
            assert again.result is not None and again.result.ok, again
            assert (await rig.agent.read()).in_sync
            await until(lambda: _started_twice(rig, hook), what="the hook job resumed", not_yet=(Exception,))
            for j in small:
                await rig.wait_state(j, "RUNNING")

    asyncio.run(scenario())


def test_a_node_the_full_node_table_cannot_take_is_refused_naming_max_node_count_until_there_is_room() -> None:
    """slurmctld refuses a dynamic node beyond ``MaxNodeCount`` ("node table is full"), FUTURE placeholders
    counted: flexmig says so in one line instead of starting slurmd and waiting ``register_timeout_s`` for a
    registration that cannot come, every round."""

    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0", register=False) as rig:
            limit = int(rig.run("scontrol", "show", "config").split("MaxNodeCount", 1)[1].split("=", 1)[1].split()[0])
            fillers = [f"fill{k}" for k in range(limit - 1)]  # with the testbed's FUTURE placeholder: full
            for name in fillers:
                rig.run("scontrol", "create", f"nodename={name}", "state=future", "cpus=1")
            actions = len(rig.act.journal.recent_actions())
            for _ in range(2):
                rnd = await rig.agent.round("act")
                assert rnd.result is None and rnd.note.startswith("refused: "), rnd.note
                assert f"MaxNodeCount is {limit}" in rnd.note and f"holds {limit} nodes" in rnd.note, rnd.note
                assert rig.node in rnd.note, rnd.note
            assert len(rig.act.journal.recent_actions()) == actions  # no failed action, no slurmd started
            assert not await rig.agent.slurmd.running()
            rig.run("scontrol", "delete", f"nodename={fillers[-1]}")  # the administrator makes room
            rnd = await rig.agent.round("act")
            assert rnd.result is not None and rnd.result.ok, rnd
            read = await rig.agent.read()
            assert read.in_sync and read.node is not None, read.node
            assert await rig.agent.client.node_records() == limit, "the node counts in the table, as do fillers"

    asyncio.run(scenario())
