"""SIGKILL of flexmigd in the middle of making a pool node: the two 1g instances' own nodes have left Slurm and the
pool node's slurmd is being started (held at a gate before it). The restarted flexmigd replays its journal and
finishes (or undoes, then makes again) the pool: the two-device job runs on the pool node with two distinct MIG
devices, and the pool's instances have no node of their own meanwhile. Real Slurm daemons, static instance nodes
(22.05.8; 24.11.5 through ``make slurm-newer``), the rig's ordinary user."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from support.slurm import SlurmDaemon, skip_reason, slurm_version
from support.slurmd_gate import slurmd_gate

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SPEC = "h200:3g.71gb@0+3g.71gb@4"
POOL = "fm-node-gpu0-x2-1g18gb"
PRINT = '#!/bin/sh\necho "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\nsleep 60\n'


def test_flexmigd_killed_mid_pool_finishes_it_at_restart_and_the_job_runs_on_the_pool(tmp_path: Path) -> None:
    gate, prefix = slurmd_gate(tmp_path, "*-x2-*")
    d = SlurmDaemon(SPEC, node_per_instance=True, static_nodes=True, default_layout=True, start=False)
    d.testbed.hook_prefix = prefix
    with d:
        d.start()
        (gate / "armed").touch()
        pair = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)
        d.wait("the pool node's slurmd being started", (gate / "reached").exists, timeout_s=90)
        log = d.log()
        starts = [s for s in range(7) if f"fm-node-gpu0-{s}-1g18gb" in log]
        assert len(starts) >= 2, log[-3000:]
        proc = d.proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        d.proc = None
        (gate / "open").touch()
        job = d.job(pair)
        assert job is not None and job.state == "PENDING", job  # its pool was not there yet
        d.wait_registered = False  # the spec's first nodes are carved away: the job's start is what is waited for
        d.start_flexmigd()
        running = d.wait_state(pair, "RUNNING", timeout_s=90)
        assert running.nodes == (POOL,), running
        out = d.wait("the job printed its devices", lambda: d.output(pair).strip(), timeout_s=30)
        node, devices = out.split()
        assert node == POOL and len(set(devices.split(","))) == 2, out
        pooled = [s for s in starts if d.slurm_node(f"fm-node-gpu0-{s}-1g18gb") is None]
        assert len(pooled) >= 2, (starts, [d.slurm_node(f"fm-node-gpu0-{s}-1g18gb") for s in starts])
        finished = re.search(r"[1-9][0-9]* unfinished plan\(s\) run to their end", d.log())
        assert finished is not None, d.log()[-3000:]  # the journal finished the pool
        print(f"\npool cut by SIGKILL finished after the restart ({slurm_version()})")
