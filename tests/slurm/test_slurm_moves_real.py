"""Moves of running hook jobs under one Slurm node per MIG instance, for real: two long 1g hook jobs of an ordinary
user on two GPUs, one on each, and a 7g job arrives. flexmigd moves exactly one of them (checkpoint, requeue,
its instance node retired, release), the job resumes right after its acknowledged step on the other GPU, and the 7g
job starts on the GPU it emptied. Real slurmctld and slurmd (22.05: static instance nodes; ``make slurm-newer``
runs it against 24.11, with dynamic instance nodes too), flexmigd as a subprocess, ``examples/hook_minimal.py`` as
the hook jobs."""

from __future__ import annotations

import json

import pytest

from support.flexmigd import sample
from support.slurm import SlurmDaemon, hook_command, per_gpu_capable, skip_reason, slurm_version

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 600\n'
NEWER = f"one dynamic node per MIG instance needs Slurm 23.11+ ({slurm_version()})"


@pytest.mark.parametrize(
    "static",
    [True, pytest.param(False, marks=pytest.mark.skipif(not per_gpu_capable(), reason=NEWER))],
    ids=["static", "dynamic"],
)
def test_two_long_1g_hook_jobs_on_two_gpus_a_7g_arrives_one_is_moved_and_resumes_and_the_7g_starts(
    static: bool,
) -> None:
    with SlurmDaemon("h200x2:1g.18gb@6", node_per_instance=True, static_nodes=static) as d:
        logs = {}
        hooks = []
        for gpu in (0, 1):
            log = d.paths.jobs / f"hook-{gpu}.jsonl"
            script = f"#!/bin/sh\nexec {hook_command(log, '--step-time', '0.02')}\n"
            job = d.testbed.sbatch(
                "--requeue", "--comment=flexmig:hook", "--time=30", "--gres=gpu:1g.18gb:1", script=script
            )  # fmt: skip (no -w: a requeued job keeps its node list, and its node is gone after the move)
            hooks.append(job)
            logs[job] = log
        on = sorted(d.wait_state(job, "RUNNING").nodes for job in hooks)
        suffix = "-1g18gb" if static else ""
        assert on == [(f"fm-node-gpu0-6{suffix}",), (f"fm-node-gpu1-6{suffix}",)], on  # one on each GPU
        d.wait(  # the testbed's hook_settle_s is 5 s: flexmig counts them as movable from then on
            "both hook jobs movable", lambda: sample(d.metrics(), "flexmig_slurm_movable_jobs") == 2.0, timeout_s=60
        )
        big = d.testbed.sbatch("--gres=gpu:7g.141gb:1", "--time=5", script=SLEEP)
        ran = d.wait_state(big, "RUNNING", timeout_s=120)
        if ran.start_s is not None:  # the figure docs/slurm-node.md quotes (pytest -s shows it)
            print(f"the 7g job started {ran.start_s - ran.submit_s:.0f} s after its submission")
        (node,) = ran.nodes
        moved = [j for j in hooks if (rec := d.job(j)) is not None and rec.restart_count > 0]
        assert len(moved) == 1, [d.job(j) for j in hooks]  # one, not both
        (mover,) = moved
        (stayer,) = [j for j in hooks if j != mover]
        rec = d.job(stayer)
        assert rec is not None and rec.state == "RUNNING" and rec.restart_count == 0, rec
        d.wait_state(mover, "RUNNING", timeout_s=60)

        def resumed() -> list[dict[str, object]] | None:
            lines = [json.loads(x) for x in logs[mover].read_text().splitlines() if x.strip()]
            return lines if sum(x["event"] == "start" for x in lines) >= 2 else None

        lines = d.wait("the moved job resumed", resumed, timeout_s=60)
        starts = [x for x in lines if x["event"] == "start"]
        ckpts = [x for x in lines if x["event"] == "checkpoint"]
        assert len(starts) == 2 and len(ckpts) == 1, lines  # resumed once
        assert starts[1]["step"] == ckpts[0]["step"] + 1  # right after its acknowledged step
        assert str(starts[1]["visible"]).startswith("MIG-")
        again = d.job(mover)
        assert again is not None and again.restart_count == 1, again
        gpu_of_mover = again.nodes[0].split("-")[2]
        assert node.startswith("fm-node-gpu") and node.split("-")[2] != gpu_of_mover, (node, again.nodes)
        assert "moving running hook job(s) to make room" in d.log()


def test_with_max_moves_per_job_0_no_hook_job_is_moved_and_the_7g_waits() -> None:
    with SlurmDaemon(
        "h200x2:1g.18gb@6", node_per_instance=True, static_nodes=True, slurm_keys="max_moves_per_job = 0\n"
    ) as d:
        hooks = []
        for gpu in (0, 1):
            script = f"#!/bin/sh\nexec {hook_command(d.paths.jobs / f'hook-{gpu}.jsonl', '--step-time', '0.02')}\n"
            hooks.append(d.testbed.sbatch("--requeue", "--comment=flexmig:hook", "--time=30",
                                          "--gres=gpu:1g.18gb:1", script=script))  # fmt: skip
        for job in hooks:
            d.wait_state(job, "RUNNING")
        d.wait("both hook jobs movable", lambda: sample(d.metrics(), "flexmig_slurm_movable_jobs") == 2.0, 60)
        big = d.testbed.sbatch("--gres=gpu:7g.141gb:1", "--time=5", script=SLEEP)
        d.wait("the 7g job's region held", lambda: "holds 7g.141gb" in d.log(), timeout_s=60)
        for job in hooks:
            rec = d.job(job)
            assert rec is not None and rec.state == "RUNNING" and rec.restart_count == 0, rec
        rec = d.job(big)
        assert rec is not None and rec.state == "PENDING", rec
        assert "moving running hook job" not in d.log()


def test_a_hook_job_that_ignores_its_signal_is_asked_once_and_runs_on() -> None:
    with SlurmDaemon(
        "h200x2:1g.18gb@6", node_per_instance=True, static_nodes=True, slurm_keys="ack_timeout_s = 3.0\n"
    ) as d:
        noted = d.paths.jobs / "deaf-signals"
        deaf_script = (  # opted in, hook set up by the TaskProlog, but never acknowledges
            f"#!/bin/sh\ntrap 'echo USR1 >> {noted}' USR1\n"
            'end=$(( $(date +%s) + 600 ))\nwhile [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done\n'
        )
        deaf = d.testbed.sbatch("--requeue", "--comment=flexmig:hook", "--time=30", "--gres=gpu:1g.18gb:1",
                                script=deaf_script)  # fmt: skip
        plain = d.testbed.sbatch("--time=30", "--gres=gpu:1g.18gb:1", script=SLEEP)
        on = sorted(d.wait_state(job, "RUNNING").nodes for job in (deaf, plain))
        assert on == [("fm-node-gpu0-6-1g18gb",), ("fm-node-gpu1-6-1g18gb",)], on
        d.wait("the hook job movable", lambda: sample(d.metrics(), "flexmig_slurm_movable_jobs") == 1.0, 60)
        big = d.testbed.sbatch("--gres=gpu:7g.141gb:1", "--time=5", script=SLEEP)
        d.wait("the move cancelled", lambda: "action_cancelled" in d.log(), timeout_s=60)
        reads = sample(d.metrics(), "flexmig_slurm_queue_reads_total") or 0.0
        d.wait("three more rounds", lambda: (sample(d.metrics(), "flexmig_slurm_queue_reads_total") or 0) >= reads + 3)
        assert noted.read_text().splitlines() == ["USR1"]  # asked once, never again
        for job in (deaf, plain):
            rec = d.job(job)
            assert rec is not None and rec.state == "RUNNING" and rec.restart_count == 0, rec
        rec = d.job(big)
        assert rec is not None and rec.state == "PENDING", rec
