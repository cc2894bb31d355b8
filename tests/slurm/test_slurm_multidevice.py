"""A job that asks for several MIG devices on one host (``sbatch --gres=gpu:1g.18gb:2``) under the default layout
(one Slurm node per MIG instance), on real Slurm daemons, as an ordinary user: it runs on a pool node over two 1g
instances (:mod:`flexmig.slurm.pool_nodes`) with two distinct MIG UUIDs in ``CUDA_VISIBLE_DEVICES``, and the pool
node is given back after it. Static instance nodes on any Slurm from 22.05 (slurm.conf's State=FUTURE pool lines),
dynamic ones from 23.11 (``make slurm-newer``; skipped on an older Slurm).
"""

from __future__ import annotations

import functools
import re
import subprocess

import pytest

from support.slurm import SlurmDaemon, skip_reason
from support.slurm_forms import NODE_FORMS

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SPEC = "h200:3g.71gb@0+3g.71gb@4"
POOL = "fm-node-gpu0-x2-1g18gb"
def instance(static: bool, start: int) -> str:
    """The instance node of the 1g.18gb instance at ``start`` of GPU 0 (static or dynamic)."""
    return f"fm-node-gpu0-{start}-1g18gb" if static else f"fm-node-gpu0-{start}"


PRINT = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 60\n'


@pytest.mark.parametrize("static", NODE_FORMS)
def test_a_job_asking_two_1g_devices_on_one_host_runs_with_two_distinct_mig_uuids(static: bool) -> None:
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)  # as the rig's ordinary user
        running = d.wait_state(job, "RUNNING", timeout_s=30)
        assert running.nodes == (POOL,), running  # the pool node over two 1g instances
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


@pytest.mark.parametrize("static", NODE_FORMS)
def test_the_pool_node_is_given_back_after_the_job_and_its_instances_serve_one_device_jobs_again(static: bool) -> None:
    """Step 4: once the two-device job has ended, the pool node leaves Slurm (back to FUTURE) and its two MIG
    instances, kept, get their own instance nodes again: two one-device jobs run there on the very same devices."""
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        pool = POOL
        pair = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script='#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 2\n')
        assert d.wait_state(pair, "RUNNING", timeout_s=30).nodes == (pool,)
        d.wait_state(pair, "COMPLETED", timeout_s=30)
        lent = set(d.output(pair).strip().split(","))
        assert len(lent) == 2, lent
        d.wait("the pool node left Slurm", lambda: d.slurm_node(pool) is None, timeout_s=30)
        starts = pool_starts(d)
        for start in starts:  # at the next round
            d.wait(f"instance {start}'s own node back", functools.partial(d.responding, instance(static, start)))
        ones = [d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=PRINT) for _ in range(2)]
        nodes = {d.wait_state(job, "RUNNING", timeout_s=30).nodes[0] for job in ones}
        assert nodes == {instance(static, start) for start in starts}, nodes
        seen = {printed(d, job) for job in ones}
        assert seen == lent, (seen, lent)
        log = d.log()
        assert f"pool node {pool} over gpu0@" in log and f"pool node {pool} idle" in log, log[-3000:]


@pytest.mark.parametrize("static", NODE_FORMS)
def test_a_flexmigd_killed_while_a_pool_node_runs_its_job_reads_the_pool_back_and_lends_its_instances_to_nobody(
    static: bool,
) -> None:
    """SIGKILL of flexmigd while the two-device job runs on its pool node: the restarted flexmigd reads the pool back
    from its GRES map, so the pool's instances do not get their own nodes again under the running job (a one-device
    job gets another instance, carved), the job runs on, unrequeued, and once it ends the pool is given back."""
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        pool = POOL
        pair = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)
        assert d.wait_state(pair, "RUNNING", timeout_s=30).nodes == (pool,)
        lent = set(printed(d, pair).split(","))
        starts = pool_starts(d)
        assert d.proc is not None
        d.proc.kill()  # SIGKILL: nothing of flexmigd's memory survives
        d.proc.wait(30)
        d.proc, d.wait_registered = None, False  # the spec's first layout is gone: nothing to wait for
        d.start_flexmigd()
        one = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=PRINT)
        d.wait_state(one, "RUNNING", timeout_s=30)
        assert printed(d, one) not in lent  # a new instance, not one of the pool's
        for start in starts:
            assert d.slurm_node(instance(static, start)) is None  # still the pool's
        again = d.job(pair)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        subprocess.run([d.testbed.commands.path("scancel"), str(pair)], env=d.testbed.env(), check=True, timeout=30)
        d.wait("the pool node left Slurm", lambda: d.slurm_node(pool) is None, timeout_s=30)
        for start in starts:
            d.wait(f"instance {start}'s own node back", functools.partial(d.responding, instance(static, start)))
        assert f"pool node {pool} over gpu0@{starts[0]}, gpu0@{starts[1]}, read back from its GRES map" in d.log()


@pytest.mark.parametrize("static", NODE_FORMS)
def test_after_a_slurmctld_restart_the_pool_node_is_registered_again_with_its_job_running(static: bool) -> None:
    """slurmctld starts again while the two-device job runs: a static pool node is back in slurm.conf's FUTURE (a
    dynamic one stays), its slurmd runs on; flexmig registers it again, the job runs on unrequeued, and its
    instances get no node of their own meanwhile."""
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        pair = d.testbed.sbatch("--gres=gpu:1g.18gb:2", script=PRINT)
        assert d.wait_state(pair, "RUNNING", timeout_s=30).nodes == (POOL,)
        printed(d, pair)
        starts = pool_starts(d)
        d.stop_ctld()
        d.start_ctld()
        d.wait("the pool node registered again", functools.partial(d.responding, POOL), timeout_s=60)
        again = d.job(pair)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        assert again.nodes == (POOL,), again
        for start in starts:
            assert d.slurm_node(instance(static, start)) is None  # still the pool's


def printed(d: SlurmDaemon, job: int) -> str:
    """The first line job ``job`` printed (its ``CUDA_VISIBLE_DEVICES``), once it has."""
    out: str = d.wait(f"job {job} printed its devices", lambda: d.output(job).strip(), timeout_s=30)
    return out


def pool_starts(d: SlurmDaemon) -> list[int]:
    """The first memory slices of the instances of pool node ``POOL``, as flexmigd's log names them."""
    found = d.wait(
        "the pool node in the log", lambda: re.search(rf"pool node {POOL} over (gpu0@\d, gpu0@\d) for", d.log())
    )
    return [int(s) for s in re.findall(r"gpu0@(\d)", found.group(1))]
