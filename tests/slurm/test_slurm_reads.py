"""How often flexmigd asks slurmctld for its queue, against real Slurm daemons: on a busy cluster sdiag's job
counters move every second, and without a bound every node's flexmigd would then read every job (``squeue
--json``), every node and every reservation each ``probe_s``. ``[slurm] cluster_reads_per_s`` spaces those reads
by the cluster's GPU hosts; the node still serves a new job, a read later."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from flexmig.slurm.sitecheck import slurm_version as parse_version
from support.flexmigd import sample
from support.slurm import SlurmDaemon, skip_reason, slurm_version
from support.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\nsleep 600\n'


def test_reads_of_a_moving_queue_are_spaced_by_the_cluster_budget_and_a_new_job_is_still_served() -> None:
    # one GPU host at 0.2 reads a second for the cluster: a read every 5 s (to 7.5 s, spread at random)
    with SlurmDaemon("h200:7g.141gb@0", interval_s=3600, slurm_keys="cluster_reads_per_s = 0.2\n") as d:
        said = "this node reads the queue when it moved at most every 5.0 s (GPU hosts in the cluster: 1,"
        d.wait("the spacing is logged", lambda: said in d.log())
        before = d.job_reads()
        started = time.monotonic()
        for _ in range(40):  # the load: another user's submissions, about three a second, for about 12 s
            d.testbed.sbatch("--hold", script=SLEEP)
            time.sleep(0.3)  # pacing the load, not waiting for anything
        took = time.monotonic() - started
        reads = d.job_reads() - before
        # a read each probe_s (1 s) while the counters move would be about 12; spaced: at most one per 5 s
        assert 1 <= reads <= took / 5.0 + 1, (reads, took)
        text = d.metrics()  # what an administrator sums over the fleet
        assert sample(text, "flexmig_slurm_queue_read_spacing_seconds") == 5.0
        assert (sample(text, "flexmig_slurm_queue_reads_total") or 0) >= reads
        assert 0 < (sample(text, "flexmig_slurm_queue_read_seconds") or 0) < 5
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        d.wait_state(job, "RUNNING", timeout_s=60)  # carved and served, a spaced read later
        assert d.slurm_node().gpu_counts().get("1g.18gb", 0) >= 1


def test_the_timed_read_waits_for_the_cluster_budget_too() -> None:
    """On 1,000 hosts the timed read every ``interval_s`` alone was 100 reads a second: it now waits for the spacing
    as the reads a moving queue asks for do. One host at 0.2 reads a second for the cluster, ``interval_s`` 1: a read
    every 5 s (to 7.5 s), not every second."""
    with SlurmDaemon("h200:7g.141gb@0", interval_s=1, slurm_keys="cluster_reads_per_s = 0.2\n") as d:
        said = "this node reads the queue when it moved at most every 5.0 s"
        d.wait("the spacing is logged", lambda: said in d.log())
        before = d.job_reads()
        started = time.monotonic()
        d.wait("three timed reads", lambda: d.job_reads() - before >= 3, timeout_s=60)
        took = time.monotonic() - started
        # the first and the third are two spacings (at least 5 s each) apart; every interval_s: about 2 s
        assert took >= 9.5, took


def test_every_host_counts_the_clusters_hosts_by_their_node_names() -> None:
    """Two hosts, each with its flexmigd, at 0.5 reads a second for the cluster: each reads at most every 4 s (2
    hosts / 0.5). A dynamic node (24.11) takes the address its slurmd registered from, 127.0.0.1 for both testbed
    hosts, so counting by address saw one host and read every 2 s."""
    with SlurmCluster("h200:7g.141gb@0", hosts=2, slurm_keys="cluster_reads_per_s = 0.5\n") as c:
        said = "this node reads the queue when it moved at most every 4.0 s (GPU hosts in the cluster: 2,"
        for host in range(2):
            c.wait(f"host {host + 1} counting both hosts", functools.partial(_logged, c, host, said))


def _logged(c: SlurmCluster, host: int, said: str) -> bool:
    return said in c.log(host)


def test_the_queue_read_leaves_out_finished_jobs_where_slurm_can() -> None:
    """flexmig decides on waiting and running jobs only; the finished ones slurmctld keeps for ``MinJobAge`` (300 s
    by default, most of a busy cluster's queue) are left out of its read from 23.02 on, where ``squeue --json``
    takes a state filter (22.05 prints them anyway)."""
    with SlurmDaemon("h200:7g.141gb@0") as d:
        done = d.testbed.sbatch("--gres=gpu:7g.141gb:1", script="#!/bin/sh\ntrue\n")
        d.wait_state(done, "COMPLETED", timeout_s=60)
        waiting = d.testbed.sbatch("--hold", script=SLEEP)
        mine = {j.job_id: j.state for j in asyncio.run(d.client().jobs())}
        every = {j.job_id: j.state for j in asyncio.run(d.client().jobs(finished=True))}
        assert every.get(done) == "COMPLETED" and every.get(waiting) == "PENDING", every
        assert mine.get(waiting) == "PENDING", mine
        if (parse_version(slurm_version()) or (0, 0, 0)) >= (23, 2, 0):
            assert done not in mine, mine
        else:  # 22.05: the filter is ignored
            assert mine.get(done) == "COMPLETED", mine
