"""A job asking for more MIG devices of one profile on one node than one GPU holds (``--gres=gpu:1g.18gb:8`` on an
H200, which holds 7) under one Slurm node per MIG instance: a pool node's instances share one GPU, so no pool node
can serve it. Before, it waited as 8 parts that no GPU could hold: nothing was carved and nothing said why. Now
flexmig refuses it at once, as a job mixing profiles (:data:`flexmig.slurm.instances.MIXED`), with one warning line
naming the job and what to ask for instead (slurmctld itself refuses it at submission where no node of its
configuration can hold 8: static nodes, and dynamic ones on 24.11.5). Pure, then real Slurm daemons and the rig's
ordinary user."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from flexmig.errors import SlurmError
from flexmig.mig import H200
from flexmig.slurm.carver import InstanceCarver
from flexmig.slurm.cluster_claims import cluster_queue
from flexmig.slurm.demand import SlurmDemand, read_demand
from flexmig.slurm.gres import GresCount
from flexmig.slurm.instances import TOO_MANY, queue_of
from flexmig.slurm.squeue import SlurmJob
from support.slurm import SlurmDaemon, skip_reason
from support.slurm_forms import NODE_FORMS
from support.slurm_refusals import refused_once

SPEC = "h200:3g.71gb@0+3g.71gb@4"
SLEEP = "#!/bin/sh\nsleep 60\n"


def _job(job_id: int, profile: str, count: int) -> SlurmJob:
    return SlurmJob(
        job_id=job_id, name="j", user_id=1000, user="alice", state="PENDING", reason="Resources",
        partitions=("mig",), nodes=(), node_count=1, gpus_per_node=(GresCount("gpu", profile, count),), held=(),
        requeue=False, comment="", priority=100, submit_s=float(job_id), start_s=None, time_limit_s=None,
        restart_count=0,
    )  # fmt: skip


def _demand(jobs: list[SlurmJob]) -> SlurmDemand:
    demand = read_demand(jobs, None, "fm-node-gpu0-0", H200, index_map={}, now_s=10.0, hook_token="flexmig:hook")
    assert isinstance(demand, SlurmDemand)
    return demand


def test_a_pool_job_of_more_devices_than_a_gpu_holds_is_left_out_at_once_naming_what_to_ask() -> None:
    jobs = [_job(7, "1g.18gb", 8), _job(8, "1g.18gb", 7), _job(9, "3g.71gb", 3), _job(10, "7g.141gb", 2)]
    queue, left = queue_of(_demand(jobs), 10.0, most_parts=56, pools=True, model=H200)
    assert [w.name for w in queue] == [*(f"slurm-8#{k}" for k in range(1, 8)), "slurm-10#1", "slurm-10#2"]
    assert set(left) == {"slurm-7", "slurm-9"}, left
    assert left["slurm-7"].startswith(TOO_MANY) and "(8 x 1g.18gb; a GPU of h200 holds 7)" in left["slurm-7"]
    assert "--nodes=8 --gres=gpu:1g.18gb:1" in left["slurm-7"], left["slurm-7"]
    assert "(3 x 3g.71gb; a GPU of h200 holds 2)" in left["slurm-9"], left["slurm-9"]
    # the cluster's queue leaves it out too: no host is assigned parts that no GPU can hold
    everyone, _ = cluster_queue(jobs, H200, now_s=10.0, hook_token="flexmig:hook", most_parts=56)
    assert {w.name.split("#")[0] for w in everyone} == {"slurm-8", "slurm-10"}


def test_the_carver_warns_once_per_refused_job(caplog: pytest.LogCaptureFixture) -> None:
    """One warning line per job left out as :data:`TOO_MANY`, the round it is first left out, never again while it
    waits (the carver's :meth:`_tell_refused`, shared with jobs mixing profiles)."""
    carver = InstanceCarver(
        "fm-node", settings=cast(Any, None), client=cast(Any, None), executor=cast(Any, None),
        agent_for=cast(Any, None), wall=lambda: 0.0,
    )  # fmt: skip
    _, carver.left_out = queue_of(_demand([_job(7, "1g.18gb", 8), _job(8, "1g.18gb", 2)]), 10.0, pools=True,
                                  model=H200)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="flexmig.slurm.carver"):
        carver._tell_refused()
        carver._tell_refused()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and lines[0].startswith(f"Slurm: job 7 {TOO_MANY} (8 x 1g.18gb"), lines


@pytest.mark.integration
@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
@pytest.mark.parametrize("static", NODE_FORMS)
def test_a_job_of_eight_1g_on_one_node_is_refused_by_slurm_or_by_flexmigd_in_one_line(static: bool) -> None:
    """Static nodes: slurmctld refuses the job at submission (the biggest pool node of slurm.conf has 7 1g devices);
    so does 24.11.5's with dynamic nodes. Where a slurmctld queues it, flexmigd says once, as a warning, that it
    never runs and why, and serves the other jobs."""
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        try:
            job = d.testbed.sbatch("--gres=gpu:1g.18gb:8", script=SLEEP)
        except SlurmError as e:
            assert "Requested node configuration is not available" in str(e), e
            return
        assert not static, "slurmctld queued a job no static node can run"
        line = refused_once(d, job, TOO_MANY, SLEEP)
        assert f"job {job} {TOO_MANY} (8 x 1g.18gb" in line, line
