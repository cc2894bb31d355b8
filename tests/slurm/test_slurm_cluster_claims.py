"""Hosts of one cluster do not carve for the same waiting job (:mod:`flexmig.slurm.cluster_claims`): two idle hosts
of two 3g instances each under one slurmctld (``flexmig slurm testbed --hosts 2``, the testbed's default layout for
the Slurm under test; ``make slurm-newer`` runs this module on 24.11), three waiting 1g jobs of ordinary users.

Before the cluster's assignment both hosts' flexmigds carved for every waiting job (three 1g instances on each, six in
all); now each job is carved for on one host only: exactly three 1g instances in the whole cluster, every job running
on its own. A job assigned to a host whose flexmigd is down does not starve: the other host carves for it once it has
waited so assigned for the bound.
"""

from __future__ import annotations

import signal
import time

import pytest

from flexmig.mig.nodespec import parse_node_spec
from flexmig.plan.carving import Waiting
from flexmig.slurm.cluster_claims import FREE_AFTER_MIN_S, assign, cluster_hosts
from flexmig.slurm.settings import instance_node, slot_node
from support.slurm import JOB_USERS, skip_reason, slurm_version
from support.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SPEC = "h200:3g.71gb@0+3g.71gb@4"
SLEEP = '#!/bin/sh\necho "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def _node_of(c: SlurmCluster, host: int, gpu: int, start: int, profile: str) -> str:
    node = c.node(host)
    return slot_node(node, gpu, start, profile) if c.layout.static_nodes else instance_node(node, gpu, start)


def _settled(c: SlurmCluster) -> bool:
    """Every MIG instance of every host has its node registered and answering, and no other node of flexmig's is
    listed: no carving is under way anywhere."""
    listed = {n.name for n in c.slurm_nodes() if n.responding}
    ours = {name for h in range(c.hosts) for name in c.testbed.node_names(h)}
    made = {_node_of(c, h, *i) for h in range(c.hosts) for i in c.instances(h)}
    return made == listed & ours


def test_two_idle_hosts_carve_three_1g_instances_in_all_for_three_waiting_1g_jobs() -> None:
    with SlurmCluster(SPEC, hosts=2, interval_s=5.0) as c:  # stopped between rounds, most likely
        users = [JOB_USERS[k % len(JOB_USERS)] for k in range(3)]
        jobs = [c.testbed.sbatch("--hold", "--gres=gpu:1g.18gb:1", script=SLEEP, user=u) for u in users]
        paused = [p for p in c.procs if p is not None]
        for proc in paused:  # both hosts' next rounds read the same queue: three jobs waiting at once
            proc.send_signal(signal.SIGSTOP)
        try:
            c.scontrol("release", ",".join(map(str, jobs)))
            released = [c.job(k) for k in jobs]
            assert all(j is not None and j.pending and "Held" not in j.reason for j in released), released
        finally:
            for proc in paused:
                proc.send_signal(signal.SIGCONT)
        released_at = time.monotonic()
        ran = [c.wait_state(j, "RUNNING", timeout_s=120) for j in jobs]
        took = time.monotonic() - released_at
        c.wait("every host's carving finished (each instance's node registered)", lambda: _settled(c), timeout_s=60)
        made = {h: c.instances(h) for h in range(c.hosts)}
        small = {h: [i for i in made[h] if i[2] == "1g.18gb"] for h in made}
        assert sum(len(v) for v in small.values()) == 3, made  # one instance per job in the whole cluster
        nodes = [j.nodes[0] for j in ran]
        assert len(set(nodes)) == 3, ran  # every job on its own instance node
        for job, node in zip(ran, nodes, strict=True):
            host = c.host_of(node)
            assert host is not None and node in {_node_of(c, host, *i) for i in small[host]}, (job, made)
            assert job.user in users and job.user != "root", job
        by_host = [len(small[h]) for h in sorted(small)]
        print(f"\ncluster claims: 1g instances by host {by_host}, all three running {took:.1f} s after their release "
              f"({slurm_version()})")  # fmt: skip


def test_a_job_assigned_to_a_host_whose_flexmigd_is_down_is_carved_for_by_another_after_the_bound() -> None:
    """The host a waiting job is assigned to cannot carve (its flexmigd was SIGKILLed; its nodes still answer, so the
    view still offers its room): the other host leaves the job to it at first (its log says so), and once the job has
    waited so assigned for the bound (``FREE_AFTER_MIN_S``) carves for it itself, so the job runs there."""
    model = parse_node_spec(SPEC).model
    with SlurmCluster(SPEC, hosts=2) as c:
        job = c.sbatch("--hold", "--gres=gpu:1g.18gb:1", script=SLEEP)
        hosts = cluster_hosts(c.slurm_nodes(), model, reserved=())
        assert sorted(hosts) == sorted(c.node(h) for h in range(2)), hosts
        owner_name = assign([Waiting(f"slurm-{job}", "1g.18gb")], hosts, model, partitions={})[f"slurm-{job}"]
        owner = next(h for h in range(2) if c.node(h) == owner_name)
        other = 1 - owner
        c.kill_flexmigd(owner)
        c.scontrol("release", str(job))
        released_at = time.monotonic()
        deferred = f"slurm-{job} left out: host {owner_name} carves for it (the cluster's assignment)"
        c.wait(f"host {c.node(other)} leaves the job to {owner_name}", lambda: deferred in c.log(other))
        ran = c.wait_state(job, "RUNNING", timeout_s=FREE_AFTER_MIN_S + 90)
        took = time.monotonic() - released_at
        assert ran.nodes and c.host_of(ran.nodes[0]) == other, ran
        assert not [i for i in c.instances(owner) if i[2] == "1g.18gb"], c.instances(owner)
        print(f"\ncluster claims: a job left to a host whose flexmigd is down ran on the other {took:.1f} s after "
              f"its release ({slurm_version()})")  # fmt: skip
