"""flexmig as Slurm's node agent, against a real Slurm 22.05 (munged, slurmctld, slurmd) on a simulated MIG node."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from flexmig.slurm.change import encode_change, planned_delete_crashes
from flexmig.slurm.hookcheck import hook_problem
from support.hostile import HOSTILE, SYSTEM_PYTHON
from support.slurm import SlurmRig, skip_reason
from support.wait import until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def test_three_pending_1g_jobs_on_a_7g_node_run_each_on_its_own_mig_device() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            jobs = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(3)]
            for j in jobs:
                pending = await rig.wait_state(j, "PENDING")
                assert pending.reason in ("ReqNodeNotAvail", "Resources", "None", "Priority")
            rnd = await rig.agent.round("act")
            assert rnd.verdict is not None and rnd.verdict.go, rnd.verdict
            assert rnd.result is not None and rnd.result.ok, rnd
            # the node is deleted after a backfill cycle began past its drain only where Slurm crashes otherwise
            version = (await rig.agent.client.config()).get("SLURM_VERSION", "")
            waited = "backfill" in [name for r in rnd.result.results for name, _ in r.steps]
            assert waited == planned_delete_crashes(str(version)), (version, rnd.result)
            for j in jobs:
                await rig.wait_state(j, "RUNNING")
            seen = [
                await until(_visible(rig, j), what=f"job {j} wrote its devices", not_yet=(Exception,)) for j in jobs
            ]
            assert all(v.startswith("MIG-") and "," not in v for v in seen), seen
            assert len(set(seen)) == 3, seen
            read = await rig.agent.read()
            assert read.in_sync, (read.registered_as, read.expected)
            assert read.registered_as.get("1g.18gb", 0) >= 3

    asyncio.run(scenario())


def _visible(rig: SlurmRig, job: int) -> Callable[[], Awaitable[str]]:
    async def probe() -> str:
        return rig.visible(job)

    return probe


def test_a_requeue_hook_job_is_checkpointed_requeued_and_resumes_once_at_its_acknowledged_step() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            hook = rig.hook_job("--gres=gpu:3g.71gb:1")
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _steps(rig, hook, 5), what="the hook job steps", not_yet=(Exception,))
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(4)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            rnd = await rig.change()
            assert rnd.verdict is not None and rnd.verdict.go, rnd.verdict
            assert rnd.result is not None and rnd.result.ok, rnd
            for j in small:
                await rig.wait_state(j, "RUNNING")
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _starts(rig, hook, 2), what="the hook job resumed", not_yet=(Exception,))
            log = rig.hook_log(hook)
            starts = [e for e in log if e["event"] == "start"]
            ckpts = [e for e in log if e["event"] == "checkpoint"]
            assert len(starts) == 2 and len(ckpts) == 1, log
            assert starts[0]["resume"] is None
            assert starts[1]["step"] == ckpts[0]["step"] + 1  # resumes right after the acknowledged step
            assert starts[1]["visible"].startswith("MIG-")
            job = await rig.job(hook)
            assert job is not None and job.restart_count == 1
            kinds = [k for k, d in rig.slurm_events if d.get("slurm_job") == hook]
            assert kinds == ["slurm_job_signalled", "slurm_job_requeued", "slurm_job_released"]
            assert (await rig.agent.read()).in_sync

    asyncio.run(scenario())


def test_a_job_without_the_hook_is_never_signalled_the_drain_waits_for_it() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            plain = rig.sleeper("--gres=gpu:3g.71gb:1", "--time=1", "--requeue", seconds=6)
            hook = rig.hook_job("--gres=gpu:4g.71gb:1")
            await rig.wait_state(plain, "RUNNING")
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _steps(rig, hook, 3), what="the hook job steps", not_yet=(Exception,))
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(2)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            rnd = await rig.change()  # committed while the plain job ran, carried out once it ended
            assert rnd.result is not None and rnd.result.ok, rnd
            done = await rig.job(plain)
            assert done is not None and done.state == "COMPLETED" and done.restart_count == 0, done
            assert not rig.signalled(plain)
            assert [k for k, d in rig.slurm_events if d.get("slurm_job") == plain] == []
            assert ("slurm_job_requeued", hook) in [(k, d.get("slurm_job")) for k, d in rig.slurm_events], (
                rnd.result,
                rig.hook_log(hook),
            )
            for j in small:
                await rig.wait_state(j, "RUNNING")

    asyncio.run(scenario())


def test_a_job_that_starts_after_an_idle_nodes_change_was_decided_cancels_it_at_once_and_runs_on() -> None:
    # Slurm starts a job in the seconds between flexmig's look at the idle node and the change's close: the change
    # is cancelled as soon as it sees the job, not after the idle timeout with the node closed all along.
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            small = rig.sleeper("--gres=gpu:1g.18gb:1")
            await rig.wait_state(small, "PENDING")
            read = await rig.agent.read()
            plan, verdict = rig.agent.plan(read)
            assert verdict.go and not read.demand.running, verdict  # an idle node changes at once
            late = rig.sleeper("--gres=gpu:3g.71gb:1", "--time=5")  # fits today's layout: Slurm starts it
            await rig.wait_state(late, "RUNNING")
            action = encode_change(rig.node, plan, (), verdict.reason, 0.0)
            res = await rig.agent.executor.execute_encoded([action], "slurm", (verdict.reason,))
            (done,) = res.results
            assert done.outcome == "cancelled", done
            assert f"Slurm job(s) {late} started on node {rig.node} after the change was decided" in (done.error or "")
            assert "the change is cancelled, the node reopened" in (done.error or ""), done.error
            job = await rig.job(late)
            assert job is not None and job.state == "RUNNING" and job.restart_count == 0, job
            assert not any(r.name.startswith("flexmig-") for r in await rig.agent.client.reservations())
            node = (await rig.agent.read()).node
            assert node is not None and not node.drained, node
            assert node.gpu_counts() == {"4g.71gb": 1, "3g.71gb": 1}, node  # nothing was changed

    asyncio.run(scenario())


def test_no_drain_for_jobs_that_never_end_by_themselves() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            plain = rig.sleeper("--gres=gpu:3g.71gb:1")
            await rig.wait_state(plain, "RUNNING")
            small = rig.sleeper("--gres=gpu:1g.18gb:1")
            await rig.wait_state(small, "PENDING")
            rnd = await rig.agent.round("act")
            assert rnd.verdict is not None and not rnd.verdict.go, rnd.verdict
            assert "not worth" in rnd.verdict.reason
            assert not any(r.name.startswith("flexmig-") for r in await rig.agent.client.reservations())
            assert rnd.result is None
            node = (await rig.agent.read()).node
            assert node is not None and not node.drained

    asyncio.run(scenario())


async def _steps(rig: SlurmRig, job: int, n: int) -> bool:
    return sum(1 for e in rig.hook_log(job) if e["event"] == "step") >= n


async def _starts(rig: SlurmRig, job: int, n: int) -> bool:
    return sum(1 for e in rig.hook_log(job) if e["event"] == "start") >= n


async def _hook_on(rig: SlurmRig, job_id: int) -> bool:
    """Whether the job's TaskProlog has set up its checkpoint hook (its marker read as flexmigd reads it)."""
    job = await rig.job(job_id)
    return job is not None and hook_problem(str(rig.paths.checkpoints / "{user}" / "{job_id}"), job) is None


def test_observe_reads_slurm_only_and_advise_plans_without_changing_anything() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            jobs = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(2)]
            for j in jobs:
                await rig.wait_state(j, "PENDING")
            seen = await rig.agent.round("observe")
            assert seen.read is not None and len(seen.read.demand.pending) == 2
            assert seen.verdict is None and seen.result is None
            advised = await rig.agent.round("advise")
            assert advised.verdict is not None and advised.verdict.go and advised.result is None
            read = await rig.agent.read()
            assert read.registered_as == {"7g.141gb": 1} and read.node is not None and not read.node.drained
            for x in jobs:
                job = await rig.job(x)
                assert job is not None and job.pending, job

    asyncio.run(scenario())


def test_a_hook_job_whose_acknowledgement_has_a_5000_digit_step_cancels_the_move_and_leaves_the_node_usable() -> None:
    """A Slurm job's user writes an acknowledgement no decoder should take: the move is cancelled with one line, the
    agent carries on, the job runs on and is not requeued, and the node is not left drained (``_validate`` raised
    ValueError: "internal error", and in the issue's report the node stayed drained for good)."""

    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            payload = rig.base / "payload.json"
            payload.write_bytes(b'{"step": ' + b"9" * 5000 + b', "checkpoint": "x"}')
            payload.chmod(0o644)
            script = f"#!/bin/sh\nexec {SYSTEM_PYTHON} {HOSTILE} ack-bytes {payload}\n"
            hook = rig.sbatch("--requeue", "--comment=flexmig:hook", "--gres=gpu:3g.71gb:1", script=script)
            await rig.wait_state(hook, "RUNNING")
            # RUNNING is Slurm's word; the hook is on only once the job's TaskProlog has left its marker (under load
            # that comes later, and a round before it sees a job that cannot be moved and asks it nothing)
            await until(lambda: _hook_on(rig, hook), what="the hook job's TaskProlog marker")
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(4)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            rnd = await rig.change()
            assert rnd.result is not None and not rnd.result.ok, rnd
            errors = " ".join(a.error or "" for a in rnd.result.results)
            assert "more than 20 digits" in errors and "move cancelled" in errors, errors
            job = await rig.job(hook)
            assert job is not None and job.state == "RUNNING" and job.restart_count == 0, job
            node = (await rig.agent.read()).node
            assert node is not None and not node.drained, node

    asyncio.run(scenario())
