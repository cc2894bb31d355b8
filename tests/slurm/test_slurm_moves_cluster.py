"""A move across hosts, for real: two simulated hosts of one H200 each under one slurmctld (``flexmig slurm testbed
--hosts 2``, the testbed's default layout for the Slurm under test; ``make slurm-newer`` runs it on 24.11). On host
A a long 1g hook job of an ordinary user runs alone; host B runs a long 3g job that did not opt in, with room for a
1g beside it; a 7g job arrives. Host A has no room for the hook job outside the 7g's region, so before flexmigd
counted other hosts' room (:func:`flexmig.slurm.moving.other_hosts`) nothing moved and the 7g waited for the hook
job's end; now host A moves it, Slurm restarts it on host B, where it resumes right after its acknowledged step, and
the 7g starts on host A."""

from __future__ import annotations

import urllib.request

import pytest

from support.flexmigd import sample
from support.slurm import skip_reason
from support.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def _movable(c: SlurmCluster, host: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_ports[host]}/metrics", timeout=5) as r:
        return sample(r.read().decode(), "flexmig_slurm_movable_jobs")


def test_a_hook_job_with_no_room_on_its_host_is_moved_and_restarts_on_the_other_host() -> None:
    with SlurmCluster("h200:7g.141gb@0", hosts=2) as c:
        log = c.paths.jobs / "hook.jsonl"
        hook = c.hook_job("--time=30", "--gres=gpu:1g.18gb:1", log=log)
        (node,) = c.wait_state(hook, "RUNNING").nodes
        a = c.host_of(node)
        assert a is not None, node
        b = 1 - a
        # a 3g that did not opt in on host B: the cluster's assignment may put the first one beside the hook job on
        # host A (free slices there); a second one then no longer fits on A, and the first is cancelled
        stays = c.sbatch("--time=30", "--gres=gpu:3g.71gb:1", script=SLEEP)
        if c.host_of(c.wait_state(stays, "RUNNING").nodes[0]) == a:
            beside = stays
            stays = c.sbatch("--time=30", "--gres=gpu:3g.71gb:1", script=SLEEP)
            assert c.host_of(c.wait_state(stays, "RUNNING").nodes[0]) == b
            c.scancel(beside)  # host A: the hook job alone
            c.wait_state(beside, "CANCELLED")
        c.wait("the hook job movable on host A", lambda: _movable(c, a) == 1.0, timeout_s=60)
        big = c.sbatch("--time=5", "--gres=gpu:7g.141gb:1", script=SLEEP)
        ran = c.wait_state(big, "RUNNING", timeout_s=180)
        assert c.host_of(ran.nodes[0]) == a, ran.nodes
        again = c.wait_state(hook, "RUNNING", timeout_s=120)
        assert again.restart_count == 1, again
        assert c.host_of(again.nodes[0]) == b, again.nodes  # restarted on the other host

        def resumed() -> list[dict[str, object]] | None:
            lines = c.hook_lines(log)
            return lines if sum(x["event"] == "start" for x in lines) >= 2 else None

        lines = c.wait("the moved job resumed", resumed, timeout_s=60)
        starts = [x for x in lines if x["event"] == "start"]
        ckpts = [x for x in lines if x["event"] == "checkpoint"]
        assert len(starts) == 2 and len(ckpts) == 1, lines  # resumed once
        assert starts[1]["step"] == ckpts[0]["step"] + 1  # right after its acknowledged step
        rec = c.job(stays)
        assert rec is not None and rec.state == "RUNNING" and rec.restart_count == 0, rec  # never moved
        assert "moving running hook job(s) to make room" in c.log(a)
