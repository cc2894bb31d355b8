"""A job of two 1g devices on one node (``--gres=gpu:1g.18gb:2``) on a host of two GPUs, each with an idle 1g
instance and the rest of GPU 0 busy: the carving places both parts on GPU 1 (its idle 1g and one carved from its idle
3g), the pool node is made there and the job runs (:mod:`flexmig.slurm.pool_carving`). Before, each part counted one
of the two idle 1g instances, one a GPU, as its own: nothing was carved and the pool, whose instances share a GPU,
never formed. Real Slurm daemons, the rig's ordinary user; static instance nodes on 22.05, dynamic ones from 23.11
(``make slurm-newer``)."""

from __future__ import annotations

import pytest

from support.slurm import SlurmDaemon, skip_reason
from support.slurm_forms import NODE_FORMS

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
SLEEP = "#!/bin/sh\nsleep 600\n"
PRINT = '#!/bin/sh\necho "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\nsleep 60\n'
def instance(static: bool, gpu: int, start: int, profile: str) -> str:
    tag = profile.replace(".", "")
    return f"fm-node-gpu{gpu}-{start}-{tag}" if static else f"fm-node-gpu{gpu}-{start}"


@pytest.mark.parametrize("static", NODE_FORMS)
def test_a_two_device_job_gets_both_instances_on_the_one_gpu_with_room_and_runs(static: bool) -> None:
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        busy = [(0, 0, "3g.71gb"), (0, 4, "2g.35gb"), (1, 4, "2g.35gb")]
        for gpu, start, profile in busy:
            node = instance(static, gpu, start, profile)
            d.wait_state(d.testbed.sbatch("-w", node, f"--gres=gpu:{profile}:1", script=SLEEP), "RUNNING", 60)
        pair = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)
        running = d.wait_state(pair, "RUNNING", timeout_s=90)
        assert running.nodes == ("fm-node-gpu1-x2-1g18gb",), running  # GPU 1: its idle 1g and a carved one
        out = d.wait("the job printed its devices", lambda: d.output(pair).strip(), timeout_s=30)
        node, devices = out.split()
        assert node == "fm-node-gpu1-x2-1g18gb" and len(set(devices.split(","))) == 2, out
        assert d.slurm_node(instance(static, 0, 6, "1g.18gb")) is not None  # GPU 0's idle 1g left as it was
