"""A job of several MIG devices on one host (``--gres=gpu:1g.18gb:2``, a pool node's: :mod:`flexmig.slurm.pool_nodes`)
on a cluster of two hosts under one slurmctld (``flexmig slurm testbed --hosts 2``, the testbed's default layout for
the Slurm under test; ``make slurm-newer`` runs this module on 24.11): one host alone carves and makes a pool node for
it (:mod:`flexmig.slurm.cluster_claims`), and the job runs there as an ordinary user.

Before the assignment counted such a job, it was in every host's queue: both hosts carved two 1g instances for it
and made (or tried to make) a pool node, one of which idled until it was given back.
"""

from __future__ import annotations

import signal
import time

import pytest

from support.slurm import JOB_USERS, skip_reason, slurm_version
from support.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SPEC = "h200:3g.71gb@0+3g.71gb@4"
PRINT = '#!/bin/sh\necho "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def test_one_host_alone_makes_the_pool_node_for_a_two_device_job_and_the_job_runs_there() -> None:
    with SlurmCluster(SPEC, hosts=2, interval_s=5.0) as c:  # stopped between rounds, most likely
        before = [c.instances(h) for h in range(c.hosts)]
        user = JOB_USERS[0]
        pair = c.testbed.sbatch("--hold", "--gres=gpu:1g.18gb:2", script=PRINT, user=user)
        paused = [p for p in c.procs if p is not None]
        for proc in paused:  # both hosts' next rounds read the same queue: the job waiting, both hosts able to serve
            proc.send_signal(signal.SIGSTOP)
        try:
            c.scontrol("release", str(pair))
            released = c.job(pair)
            assert released is not None and released.pending and "Held" not in released.reason, released
        finally:
            for proc in paused:
                proc.send_signal(signal.SIGCONT)
        released_at = time.monotonic()
        ran = c.wait_state(pair, "RUNNING", timeout_s=120)
        took = time.monotonic() - released_at
        (pool,) = ran.nodes
        host = c.host_of(pool)
        assert host is not None and pool == f"{c.node(host)}-gpu0-x2-1g18gb", ran
        assert ran.user == user != "root", ran
        other = 1 - host
        out = c.paths.jobs / f"job-{pair}.out"
        c.wait("the job printed its devices", lambda: out.exists() and out.read_text().strip(), timeout_s=30)
        name, devices = out.read_text().split()
        assert name == pool and len(set(devices.split(","))) == 2, out.read_text()
        assert c.instances(other) == before[other], (before, c.instances(other))  # nothing carved there
        assert "pool node" not in c.log(other), c.log(other)[-3000:]
        small = [i for i in c.instances(host) if i[2] == "1g.18gb"]
        assert len(small) == 2 and len({i[0] for i in small}) == 1, c.instances(host)  # two 1g of one GPU
        assert not any(n.name.startswith(f"{c.node(other)}-gpu0-x") for n in c.slurm_nodes()), c.slurm_nodes()
        print(f"\ncluster pool: {pool} on host {host + 1} alone, the job running {took:.1f} s after its release "
              f"({slurm_version()})")  # fmt: skip
