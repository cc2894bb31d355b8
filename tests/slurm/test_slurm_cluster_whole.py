"""Two whole-node hosts under one slurmctld (``flexmig slurm testbed --hosts 2 --layout node``): the mode that moves
running hook jobs, and the one the site-wide ``max_closed_nodes`` is about.

On one machine the hosts' slurmds need ports of their own, and a whole host's dynamic node takes its own ``Port=``
only from Slurm 23.11, so this module runs under ``make slurm-newer`` (24.11) and skips on 22.05. A hook job
checkpointed by a layout change on host 1 is requeued and resumes on host 2 from the shared checkpoint tree at its
acknowledged step + 1, exactly once; with ``max_closed_nodes = 1`` two hosts that both want to close for the same
waiting job never hold two flexmig reservations at once.
"""

from __future__ import annotations

import time

import pytest

from support.slurm import per_gpu_capable, skip_reason, slurm_version
from support.slurm_cluster import SlurmCluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
    pytest.mark.skipif(
        not per_gpu_capable(),
        reason=f"whole-node hosts on one machine need a dynamic node's own Port= (Slurm 23.11+; {slurm_version()})",
    ),
]

SLEEP = '#!/bin/sh\necho "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def test_a_hook_job_checkpointed_by_a_change_on_host_1_resumes_on_host_2_once_at_the_next_step() -> None:
    """Host 2 is full (a 4g and a 3g job, not movable); the hook job runs on host 1's 3g beside its idle 4g; four 1g
    jobs make host 1 change its layout, which checkpoints and requeues the hook job. Held for the change, it is kept
    off host 1 (``ExcNodeList``, as an administrator would) and host 2's 3g is freed: it resumes there."""
    with SlurmCluster("h200:4g.71gb@0+3g.71gb@4", hosts=2, layout="node") as c:
        h1, h2 = c.node(0), c.node(1)
        keepers = [c.sbatch("-w", h2, f"--gres=gpu:{p}:1", script=SLEEP) for p in ("4g.71gb", "3g.71gb")]
        for j in keepers:
            c.wait_state(j, "RUNNING")
        log = c.paths.jobs / "hook.jsonl"
        hook = c.hook_job("--gres=gpu:3g.71gb:1", log=log)
        assert c.wait_state(hook, "RUNNING").nodes == (h1,)
        c.wait("the hook job stepping", lambda: any(x["event"] == "step" for x in c.hook_lines(log)))
        small = [c.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP) for _ in range(4)]
        c.wait("the hook job checkpointed", lambda: any(x["event"] == "checkpoint" for x in c.hook_lines(log)),
               timeout_s=90)  # fmt: skip
        c.wait("the requeued hook job kept off host 1", lambda: _exclude(c, hook, h1), timeout_s=30)
        for j in small:
            c.wait_state(j, "RUNNING", timeout_s=90)
        c.scancel(keepers[1])  # host 2's 3g is free: the hook job's place
        c.wait("the hook job resumed", lambda: sum(x["event"] == "start" for x in c.hook_lines(log)) >= 2, timeout_s=90)
        job = c.wait_state(hook, "RUNNING")
        assert job.nodes == (h2,), job
        lines = c.hook_lines(log)
        starts = [x for x in lines if x["event"] == "start"]
        (ckpt,) = [x for x in lines if x["event"] == "checkpoint"]
        assert len(starts) == 2 and starts[1]["step"] == ckpt["step"] + 1, lines
        assert starts[0]["visible"] != starts[1]["visible"], starts  # another host's MIG device
        assert job.restart_count == 1, job
        assert any(c.paths.checkpoints.rglob("*")), "the checkpoint was not in the shared tree"


def _exclude(c: SlurmCluster, job: int, node: str) -> bool:
    """``scontrol update`` the pending job ``job`` to exclude ``node``; False while Slurm refuses (it runs)."""
    try:
        c.scontrol("update", f"jobid={job}", f"excnodelist={node}")
    except AssertionError:
        return False
    return True


def test_max_closed_nodes_holds_across_two_hosts_that_both_want_to_close() -> None:
    keys = "max_closed_nodes = 1\nmax_wait_s = 0\n"
    with SlurmCluster("h200:4g.71gb@0+3g.71gb@4", hosts=2, layout="node", slurm_keys=keys) as c:
        for host in range(2):
            c.wait_state(c.sbatch("-w", c.node(host), "--time=5", "--gres=gpu:3g.71gb:1", script=SLEEP), "RUNNING")
        big = c.sbatch("--time=5", "--gres=gpu:7g.141gb:1", script=SLEEP)  # fits either host once it is re-carved
        c.wait_state(big, "PENDING")
        most = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            mine = [r for r in c.scontrol("show", "reservation").split("\n\n") if "ReservationName=flexmig-" in r]
            most = max(most, len(mine))
            logs = c.log(0) + c.log(1)
            if "change committed" in logs and "site limit" in logs:
                break
            time.sleep(0.2)
        logs = c.log(0) + c.log(1)
        assert "change committed" in logs and "site limit" in logs, logs[-3000:]
        assert most == 1, most
