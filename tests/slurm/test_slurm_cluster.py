"""A cluster, not a node: two simulated hosts under one slurmctld and munged, each with its own flexmigd, simulated
GPUs and slurmds (``flexmig slurm testbed --hosts 2``), in the testbed's default layout for the Slurm under test
(static instance nodes on 22.05, dynamic instance nodes from 23.11; ``make slurm-newer`` runs this module on 24.11).

A two-node job runs one rank per host, each on its own host's MIG device (torch DDP over gloo, and an ordinary user's
job); ``scontrol reconfigure`` and a slurmctld restart in the middle of a mix lose no job and leave no node of
flexmig's hidden for long; SIGKILL of one host's flexmigd in the middle of a carving leaves the other host carving and
its own jobs running, and its restart finishes the carving. Kept cheap: one GPU a host.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from flexmig.slurm.testbed import free_port
from support.slurm import JOB_USERS, skip_reason, slurm_version
from support.slurm_cluster import SlurmCluster
from support.slurmd_gate import slurmd_gate

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\nsleep 600\n'

DDP = """
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=rank, world_size=world)
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
for _ in range(20):
    loss = model(torch.randn(8, 4, generator=gen)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
out = {"rank": rank, "world": world, "node": os.environ["SLURMD_NODENAME"],
       "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
       "params": [p.detach().flatten().tolist() for p in model.parameters()]}
with open(os.path.join(sys.argv[2], f"ddp-{os.environ['SLURM_JOB_ID']}-{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def _device_of(c: SlurmCluster, node: str) -> str:
    """The MIG UUID of instance node ``node`` as its host's flexmigd mapped it (the GRES map its TaskProlog reads),
    checked to be a device of that host's simulated GPUs."""
    doc = json.loads(c.testbed.paths.gres_map(node).read_text())
    (device,) = doc["devices"]
    host = c.host_of(node)
    assert host is not None, node
    assert device["uuid"] in (c.testbed.host_paths(host).flexmig / "sim.json").read_text(), (node, device)
    return str(device["uuid"])


def _outputs(c: SlurmCluster, job: int) -> list[str]:
    path = c.paths.jobs / f"job-{job}.out"
    return path.read_text().splitlines() if path.exists() else []


def test_a_two_node_job_runs_one_rank_per_host_each_on_its_own_hosts_mig_device() -> None:
    with SlurmCluster("h200:7g.141gb@0", hosts=2) as c:
        nodes = [c.first_nodes(h)[0] for h in range(2)]
        devices = {n: _device_of(c, n) for n in nodes}
        assert len(set(devices.values())) == 2, devices  # every host its own UUIDs, as on a real cluster
        # an ordinary user's job of two nodes: one task a host, each task its host's MIG device
        both = "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:7g.141gb:1"
        user_job = c.sbatch(*both, script='#!/bin/sh\nsrun sh -c \'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\'\n')
        c.wait_state(user_job, "COMPLETED")
        seen = dict(line.split() for line in _outputs(c, user_job))
        assert seen == devices, (seen, devices)
        # torch DDP over gloo, one rank a host (as root: torch lies in a Python only root may run on this machine)
        script = c.paths.jobs / "ddp.py"
        script.write_text(DDP)
        script.chmod(0o644)
        srun = f"srun {sys.executable} {script} {free_port()} {c.paths.jobs}"
        run = f"#!/bin/sh\nexport GLOO_SOCKET_IFNAME=lo\nexec {srun}\n"
        ddp = c.testbed.sbatch(*both, script=run, user="root")
        c.wait_state(ddp, "COMPLETED", timeout_s=120)
        ranks = [json.loads((c.paths.jobs / f"ddp-{ddp}-{r}.json").read_text()) for r in range(2)]
        assert {r["node"]: r["visible"] for r in ranks} == devices, ranks
        assert all(r["world"] == 2 for r in ranks)
        assert ranks[0]["params"] == ranks[1]["params"]  # DDP kept both ranks' models the same
        assert JOB_USERS[0] != "root"




def test_sigkill_of_one_hosts_flexmigd_mid_carving_leaves_the_other_host_working_and_its_restart_finishes(
    tmp_path: Path,
) -> None:
    """Host 1's flexmigd is killed in the middle of a carving (3g -> 1g: the idle 3g destroyed, the 1g made, its
    slurmd being started); host 2's jobs run on and its nodes answer; host 1's running 3g job runs on; restarted,
    host 1's flexmigd finishes the carving and the waiting 1g job runs there."""
    gate, prefix = slurmd_gate(tmp_path, "fm-h1-*")
    with SlurmCluster("h200:3g.71gb@0+3g.71gb@4", hosts=2, hook_prefix=prefix) as c:
        h1, h2 = c.first_nodes(0), c.first_nodes(1)
        busy = c.sbatch("-w", h1[0], "--gres=gpu:3g.71gb:1", script=SLEEP)
        others = [c.sbatch("-w", n, "--gres=gpu:3g.71gb:1", script=SLEEP) for n in h2]  # host 2: no room for a 1g
        for j in (busy, *others):
            c.wait_state(j, "RUNNING")
        (gate / "armed").touch()  # from now on, a slurmd of host 1 started is the carving's
        small = c.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        c.wait("host 1 mid-carving (its 1g node's slurmd being started)", (gate / "reached").exists, timeout_s=90)
        c.kill_flexmigd(0)
        (gate / "open").touch()
        c.wait("host 2's nodes still respond", lambda: all(c.responding(n) for n in h2))
        for j in (busy, *others):
            job = c.job(j)
            assert job is not None and job.state == "RUNNING", job
        c.start_flexmigd(0, wait=False)
        job = c.wait_state(small, "RUNNING", timeout_s=90)
        assert job.nodes and c.host_of(job.nodes[0]) == 0, job
        ran = c.job(busy)
        assert ran is not None and ran.state == "RUNNING" and ran.restart_count == 0, ran
        print(f"\ncluster: a carving cut by SIGKILL finished after the restart ({slurm_version()})")


def test_a_reconfigure_and_a_slurmctld_restart_mid_mix_lose_no_job_and_hide_no_node_for_long() -> None:
    with SlurmCluster("h200:3g.71gb@0+3g.71gb@4", hosts=2) as c:
        jobs = [c.sbatch("--gres=gpu:3g.71gb:1", script=SLEEP) for _ in range(2)]
        jobs += [c.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP) for _ in range(2)]
        for j in jobs:
            c.wait_state(j, "RUNNING", timeout_s=90)
        placed = {j: c.job(j).nodes for j in jobs}  # type: ignore[union-attr]
        c.scontrol("reconfigure")
        c.stop_ctld()
        c.start_ctld()
        late = c.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)

        def every_node_back() -> bool:
            up = {n.name for n in c.slurm_nodes() if n.responding}
            return all(set(placed[j]) <= up for j in jobs)

        restarted = time.monotonic()
        c.wait("every node of a running job registered again", every_node_back, timeout_s=60)
        took = time.monotonic() - restarted
        print(f"\ncluster: nodes back {took:.1f} s after slurmctld's restart ({slurm_version()})")
        for j in jobs:
            job = c.job(j)
            assert job is not None and job.state == "RUNNING" and job.restart_count == 0, job
            assert job.nodes == placed[j], (job, placed[j])
        c.wait_state(late, "RUNNING", timeout_s=90)
        assert not any(n.drained for n in c.slurm_nodes() if "flexmig" in n.reason), c.slurm_nodes()
