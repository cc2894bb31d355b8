"""The jobs' footprint on a simulated node (``flexmig.sim.JobLoad``): a rank the actuator registered holds memory and
keeps its instance busy, so status, metrics, nvitop and nvidia-smi show a training job, not an idle instance."""

from __future__ import annotations

import os

import pytest

from flexmig.sim import JobLoad, SimNode, install


@pytest.fixture
def node() -> SimNode:
    return install("h200:3g.71gb@0+2g.35gb@4+1g.18gb@6")


def test_a_registered_rank_holds_most_of_its_instance_and_keeps_its_sms_busy(node: SimNode) -> None:
    uuid = node.mig_uuids(0)[0]
    node.start_process(uuid, pid=os.getpid(), real=True)
    JobLoad(node)(100.0)
    gi = node.gpu(0).gpu_instances[0]
    (proc,) = gi.compute_instances[0].processes
    total = gi.profile.memory_mib << 20
    assert 0.5 * total <= proc.memory_bytes <= 0.8 * total
    assert 0.6 <= gi.compute_instances[0].activity.sm <= 0.95


def test_the_footprint_is_a_function_of_the_seed_the_pid_and_the_time(node: SimNode) -> None:
    uuid = node.mig_uuids(0)[1]
    node.start_process(uuid, pid=os.getpid(), real=True)
    JobLoad(node)(50.0)
    first = node.gpu(0)
    JobLoad(node)(50.0)  # another stepper, the same moment: the same picture
    assert node.gpu(0) == first


def test_synthetic_processes_and_idle_instances_are_left_alone(node: SimNode) -> None:
    fake = node.start_process(node.mig_uuids(0)[2], memory_bytes=1 << 30)
    JobLoad(node)(10.0)
    gpu = node.gpu(0)
    assert [p.memory_bytes for gi in gpu.gpu_instances for ci in gi.compute_instances for p in ci.processes
            if p.pid == fake] == [1 << 30]  # fmt: skip
    assert all(ci.activity.sm == 0.0 for gi in gpu.gpu_instances for ci in gi.compute_instances)
