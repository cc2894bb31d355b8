"""A job that asks for several MIG devices on one host (``sbatch --gres=gpu:1g.18gb:2``) under the default layout, on
real Slurm daemons, as an ordinary user: it should run with two distinct MIG UUIDs in ``CUDA_VISIBLE_DEVICES``.

Not built yet (docs/slurm-node.md, "Jobs that want several MIG devices on one host", has the design: a pool node
registered on demand with the instances set aside for the job). Today each instance node has one device, so Slurm
refuses the job at submission on a host of static instance nodes (no node could ever hold two) and no node ever
offers it two devices: the test is marked xfail(strict=True) and turns into a failure the day it passes.
"""

from __future__ import annotations

import pytest

from support.slurm import SlurmDaemon, skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

PRINT = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 60\n'


@pytest.mark.xfail(
    strict=True,
    reason="several MIG devices on one host under the per-instance layout: designed (a pool node registered on "
    "demand, docs/slurm-node.md), not built; each instance node has one device",
)
def test_a_job_asking_two_1g_devices_on_one_host_runs_with_two_distinct_mig_uuids() -> None:
    with SlurmDaemon("h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, static_nodes=True, default_layout=True) as d:
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)  # as the rig's ordinary user
        running = d.wait_state(job, "RUNNING", timeout_s=30)
        assert len(running.nodes) == 1, running
        out = d.wait("the job printed its devices", lambda: d.output(job).strip(), timeout_s=30)
        uuids = out.split(",")
        assert len(uuids) == 2 and len(set(uuids)) == 2 and all(u.startswith("MIG-") for u in uuids), out
