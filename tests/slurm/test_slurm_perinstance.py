"""``[slurm] node_per_instance``: one dynamic node per MIG instance, against real Slurm daemons and flexmigd as a
subprocess.

On Slurm 23.11 and later (``make slurm-newer`` runs this module against 24.11): every instance is its own node,
``fm-node-gpu<K>-<S>``; a job needing a profile no instance has gets one carved from idle instances (their nodes
retired, a new node registered) while a job on another instance of the same GPU runs on untouched, its node never
drained and its slurmd never restarted. On Slurm 22.05 (the normal suite) flexmigd refuses the mode with one line
and registers nothing.
"""

from __future__ import annotations

import time

import pytest

from support.flexmigd import sample
from support.slurm import SlurmDaemon, per_gpu_capable, skip_reason, slurm_version

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 600\n'
NEWER = f"one dynamic node per MIG instance needs Slurm 23.11+ ({slurm_version()})"


def _pid(d: SlurmDaemon, node: str) -> int | None:
    path = d.paths.slurmd_pid(node)
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_a_profile_no_instance_has_is_carved_from_idle_instances_while_a_busy_one_runs_on() -> None:
    with SlurmDaemon("h200:3g.71gb@0+3g.71gb@4", node_per_instance=True) as d:
        busy, idle = "fm-node-gpu0-0", "fm-node-gpu0-4"
        assert d.slurm_node(busy).gpu_counts() == {"3g.71gb": 1}
        assert d.slurm_node(idle).gpu_counts() == {"3g.71gb": 1}
        assert d.slurm_node(d.node) is None  # no node for the whole host
        first = d.testbed.sbatch("-w", busy, "--gres=gpu:3g.71gb:1", script=SLEEP)
        running = d.wait_state(first, "RUNNING")
        assert running.nodes == (busy,), running
        d.wait("flexmig saw the job run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 1.0)
        pid = _pid(d, busy)
        registered = d.slurm_node(busy).slurmd_start_s
        assert pid is not None

        seen: list[str] = []

        def started() -> bool:
            node = d.slurm_node(busy)  # the busy instance's node, at every look while its sibling is carved
            seen.append("absent" if node is None else f"{node.state}{'+drain' if node.drained else ''}")
            job = d.job(second)
            return job is not None and job.state == "RUNNING"

        submitted = time.monotonic()
        second = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        d.wait(f"job {second} running on a carved 1g.18gb", started, timeout_s=90)
        took = time.monotonic() - submitted
        print(f"\nnode_per_instance: submit to running on a carved instance: {took:.1f} s ({slurm_version()})")

        job = d.job(second)
        assert job is not None and len(job.nodes) == 1, job
        carved = job.nodes[0]
        assert carved.startswith("fm-node-gpu0-") and carved != busy, carved
        assert d.slurm_node(carved).gpu_counts() == {"1g.18gb": 1}
        assert d.slurm_node(idle) is None or d.slurm_node(idle).gpu_counts() != {"3g.71gb": 1}
        node = d.slurm_node(busy)
        assert node.gpu_counts() == {"3g.71gb": 1} and not node.drained, node
        assert all(s in ("allocated", "mixed") for s in seen), seen  # never drained, never absent
        assert _pid(d, busy) == pid and node.slurmd_start_s == registered  # its slurmd never restarted
        again = d.job(first)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        gres = d.paths.gres_conf.read_text()
        assert f"# BEGIN flexmig node={busy}" in gres and f"# BEGIN flexmig node={carved}" in gres
        assert f"# BEGIN flexmig node={idle}" not in gres or carved == idle
        line = d.wait(f"job {second}'s first line", lambda: d.output(second) if "\n" in d.output(second) else None)
        assert line.strip().startswith("MIG-"), line  # the TaskProlog read the carved node's own map


@pytest.mark.skipif(per_gpu_capable(), reason=f"Slurm {slurm_version()} takes node_per_instance")
def test_before_slurm_23_11_node_per_instance_is_refused_with_one_line() -> None:
    with SlurmDaemon("h200:7g.141gb@0", node_per_instance=True, wait_registered=False) as d:
        line = d.wait("the refusal", lambda: next(
            (x for x in d.log().splitlines() if "node_per_instance needs Slurm 23.11 or later" in x), None
        ))  # fmt: skip
        assert "nothing was changed" in line, line
        assert d.slurm_node("fm-node-gpu0-0") is None and d.slurm_node(d.node) is None
