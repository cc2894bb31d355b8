"""A job that asks for several MIG devices on one host (``sbatch --gres=gpu:1g.18gb:2``) under the default layout, on
real Slurm daemons, as an ordinary user: it should run with two distinct MIG UUIDs in ``CUDA_VISIBLE_DEVICES``.

Partly built (docs/slurm-node.md, "Jobs that want several MIG devices on one host"): the pool node's pure decisions
(:mod:`flexmig.slurm.pool`) and its static slurm.conf lines, which real slurmctld accepts so that such a job pends
instead of being refused (the second test). flexmigd does not register pool nodes yet, so the testbed writes no pool
lines by default and the first test is marked xfail(strict=True): it turns into a failure the day it passes.
"""

from __future__ import annotations

import pytest

from support.slurm import SlurmDaemon, skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

PRINT = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 60\n'


@pytest.mark.xfail(
    strict=True,
    reason="flexmigd registers no pool node yet (no agent serves several instances, no journalled move of instances "
    "from their nodes to a pool node), so the testbed writes no pool lines by default and sbatch refuses the job: "
    "each instance node has one device",
)
def test_a_job_asking_two_1g_devices_on_one_host_runs_with_two_distinct_mig_uuids() -> None:
    with SlurmDaemon("h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, static_nodes=True, default_layout=True) as d:
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)  # as the rig's ordinary user
        running = d.wait_state(job, "RUNNING", timeout_s=30)
        assert len(running.nodes) == 1, running
        out = d.wait("the job printed its devices", lambda: d.output(job).strip(), timeout_s=30)
        uuids = out.split(",")
        assert len(uuids) == 2 and len(set(uuids)) == 2 and all(u.startswith("MIG-") for u in uuids), out


def test_with_the_pool_lines_a_two_device_job_pends_and_one_device_jobs_stay_on_instance_nodes() -> None:
    """Step 1 of the pool node's design, on real slurmctld: slurm.conf's State=FUTURE pool lines
    (:func:`flexmig.slurm.pool.pool_lines`) are accepted, a job asking for two 1g devices is queued (without them,
    sbatch refuses it), and a one-device job still runs on an instance node (the pool nodes' high Weight=)."""
    with SlurmDaemon(
        "h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, static_nodes=True, default_layout=True, start=False
    ) as d:
        d.testbed.pool_nodes = True
        d.start()
        conf = d.paths.slurm_conf.read_text()
        assert "NodeName=fm-node-gpu0-x2-1g18gb " in conf and "Gres=gpu:1g.18gb:2 Weight=1000 State=FUTURE" in conf
        pair = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)
        one = d.testbed.sbatch("--gres=gpu:3g.71gb:1", script=PRINT)
        running = d.wait_state(one, "RUNNING", timeout_s=30)
        assert running.nodes in (("fm-node-gpu0-0-3g71gb",), ("fm-node-gpu0-4-3g71gb",)), running
        waiting = d.job(pair)
        assert waiting is not None and waiting.state == "PENDING", waiting
