"""A job asking for MIG devices of several profiles on one node (``--gres=gpu:1g.18gb:1,gpu:2g.35gb:1``) under one
Slurm node per MIG instance: no node of that layout has two profiles, so flexmig refuses it at once, with one warning
line naming the job and what to ask for instead, and carves nothing for it (before, it was carved for as two jobs of
one device each, whose instances idled while the job pended forever). Real Slurm daemons, the rig's ordinary user."""

from __future__ import annotations

import pytest

from flexmig.errors import SlurmError
from flexmig.mig import H200
from flexmig.slurm.demand import SlurmDemand, read_demand
from flexmig.slurm.gres import GresCount
from flexmig.slurm.instances import MIXED, queue_of
from flexmig.slurm.squeue import SlurmJob
from support.slurm import SlurmDaemon, skip_reason
from support.slurm_forms import NODE_FORMS
from support.slurm_refusals import refused_once

SPEC = "h200:3g.71gb@0+3g.71gb@4"
SLEEP = "#!/bin/sh\nsleep 60\n"


def _job(job_id: int, *gres: tuple[str | None, int]) -> SlurmJob:
    return SlurmJob(
        job_id=job_id, name="j", user_id=1000, user="alice", state="PENDING", reason="Resources",
        partitions=("mig",), nodes=(), node_count=1, gpus_per_node=tuple(GresCount("gpu", t, n) for t, n in gres),
        held=(), requeue=False, comment="", priority=100, submit_s=float(job_id), start_s=None, time_limit_s=None,
        restart_count=0,
    )  # fmt: skip


def test_a_job_of_two_profiles_on_one_node_is_left_out_at_once_naming_what_it_asked_for() -> None:
    mixed, pair = _job(7, ("1g.18gb", 1), ("2g.35gb", 1)), _job(8, ("1g.18gb", 2))
    demand = read_demand([mixed, pair], None, "fm-node-gpu0-0", H200, index_map={}, now_s=10.0,
                         hook_token="flexmig:hook")  # fmt: skip
    assert isinstance(demand, SlurmDemand)
    queue, left = queue_of(demand, 10.0, pools=True)
    assert [w.name for w in queue] == ["slurm-8#1", "slurm-8#2"]  # the one-profile pair waits as a pool's parts
    assert set(left) == {"slurm-7:1g.18gb", "slurm-7:2g.35gb"}, left
    for why in left.values():
        assert why.startswith(MIXED) and "(gpu:1g.18gb:1,gpu:2g.35gb:1)" in why, why


@pytest.mark.integration
@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
@pytest.mark.parametrize("static", NODE_FORMS)
def test_a_two_profile_job_is_refused_at_once_by_slurm_or_by_flexmigd_in_one_line_and_nothing_is_carved(
    static: bool,
) -> None:
    """Static instance nodes: slurmctld itself refuses the job at submission (no node of slurm.conf, FUTURE ones
    included, has both profiles). Dynamic ones: slurmctld queues it (a node may register with both), and flexmigd
    says once, as a warning, that it never will and why, and carves nothing for it while serving other jobs."""
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        if static:
            with pytest.raises(SlurmError, match="Requested node configuration is not available"):
                d.testbed.sbatch("--gres=gpu:1g.18gb:1,gpu:2g.35gb:1", script=SLEEP)
            return
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:1,gpu:2g.35gb:1", script=SLEEP)
        line = refused_once(d, job, MIXED, SLEEP)
        assert f"job {job} {MIXED} (gpu:1g.18gb:1,gpu:2g.35gb:1)" in line, line
        assert "2g.35gb@" not in d.log(), d.log()[-3000:]  # nothing carved for its 2g device
