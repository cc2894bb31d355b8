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
from flexmig.slurm.squeue import SlurmJob
from support.slurm import SlurmRig, skip_reason
from support.wait import until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


class Crash(BaseException):
    """Stands for SIGKILL: nothing catches it, nothing after it runs."""


@pytest.mark.parametrize(
    "at",
    [
        "drain:intent",
        "hold:done",
        "await_idle:done",
        "stop_slurmd:done",
        "destroy:intent",
        "create:done",
        "register:intent",
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
                await rig.agent.round("act")
            await rig.close_flexmig()
            summary = await rig.open_flexmig()
            assert summary["plans"], summary
            assert all(a["outcome"] == "completed" for p in summary["plans"] for a in p["actions"]), summary
            read = await rig.agent.read()
            assert read.in_sync, (read.registered_as, read.expected)
            assert read.node is not None and not read.node.drained, read.node
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


def test_a_gres_conf_flexmig_may_not_write_fails_the_change_naming_it_and_holds_no_job() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            hook = rig.hook_job("--gres=gpu:3g.71gb:1")
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _steps(rig, hook), what="the hook job steps", not_yet=(Exception,))
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(2)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            rig.paths.gres_conf.chmod(0o666)  # someone made it writable by everyone
            rnd = await rig.agent.round("act")
            assert rnd.result is not None and not rnd.result.ok
            (failed,) = rnd.result.results
            assert failed.error is not None and str(rig.paths.gres_conf) in failed.error, failed
            assert "jobs held for the change are released" in failed.error
            job = await until(lambda: _not_held(rig, hook), what="the hook job released", not_yet=(Exception,))
            assert job.restart_count == 1, job
            rig.paths.gres_conf.chmod(0o644)
            again = await rig.agent.round("act")
            assert again.result is not None and again.result.ok, again
            assert (await rig.agent.read()).in_sync
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _started_twice(rig, hook), what="the hook job resumed", not_yet=(Exception,))
            for j in small:
                await rig.wait_state(j, "RUNNING")

    asyncio.run(scenario())


async def _not_held(rig: SlurmRig, job: int) -> SlurmJob | None:
    j = await rig.job(job)
    return j if j is not None and not j.reason.startswith("JobHeld") and j.restart_count >= 1 else None
