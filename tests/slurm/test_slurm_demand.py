"""Slurm's queue as the planner's demand: which jobs concern the node, what they ask for, what runs on it and may
move, array throttles, and when a wait began. (The layout choice itself: ``tests/plan/test_reregistration.py``.)"""

from __future__ import annotations

from dataclasses import replace

from flexmig.mig import H200
from flexmig.plan.types import Instance
from flexmig.slurm.demand import read_demand
from flexmig.slurm.gres import GresCount
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.squeue import SlurmJob

NODE = SlurmNode("n1", "mixed", frozenset({"DYNAMIC_NORM"}), "", (), (), ("mig",), 16)
G1 = H200.profile("1g.18gb")
G3 = H200.profile("3g.71gb")


def job(job_id: int, **kw: object) -> SlurmJob:
    base = SlurmJob(
        job_id=job_id, name="j", user_id=1000, user="alice", state="PENDING", reason="ReqNodeNotAvail",
        partitions=("mig",), nodes=(), node_count=1, gpus_per_node=(GresCount("gpu", "1g.18gb", 1),), held=(),
        requeue=False, comment="", priority=100, submit_s=float(job_id), start_s=None, time_limit_s=None,
        restart_count=0,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def demand(*jobs: SlurmJob, index_map: dict[int, Instance] | None = None, now: float = 1000.0) -> object:
    return read_demand(
        jobs, NODE, "n1", H200, index_map=index_map or {}, now_s=now, hook_token="flexmig:hook", hook_settle_s=60
    )


def test_pending_jobs_of_the_nodes_partitions_become_requests_in_priority_order() -> None:
    d = read_demand(
        [job(1), job(2, priority=500), job(3, partitions=("other",)), job(4, reason="Dependency")],
        NODE, "n1", H200, index_map={}, now_s=0, hook_token="flexmig:hook",
    )  # fmt: skip
    assert [r.name for r in d.pending] == ["slurm-2", "slurm-1"]
    assert set(d.ignored) == {3, 4}
    assert "partition other" in d.ignored[3] and "Dependency" in d.ignored[4]


def test_a_job_of_two_types_and_an_array_become_several_requests() -> None:
    two = job(5, gpus_per_node=(GresCount("gpu", "1g.18gb", 2), GresCount("gpu", "3g.71gb", 1)))
    arr = job(6, array_tasks=3)
    d = read_demand([two, arr], NODE, "n1", H200, index_map={}, now_s=0, hook_token="flexmig:hook")
    names = {r.name: (r.need.profile, r.ranks) for r in d.pending}
    assert names == {
        "slurm-5:1g.18gb": ("1g.18gb", 2),
        "slurm-5:3g.71gb": ("3g.71gb", 1),
        "slurm-6.0": ("1g.18gb", 1),
        "slurm-6.1": ("1g.18gb", 1),
        "slurm-6.2": ("1g.18gb", 1),
    }


def test_a_type_that_is_no_mig_profile_is_left_out_with_its_reason() -> None:
    d = read_demand(
        [job(7, gpus_per_node=(GresCount("gpu", "a100", 1),)), job(8, excluded_nodes=("n1",)),
         job(9, required_nodes=("n2",)), job(10, gpus_per_node=())],
        NODE, "n1", H200, index_map={}, now_s=0, hook_token="flexmig:hook",
    )  # fmt: skip
    assert not d.pending
    assert "no MIG profile" in d.ignored[7] and "excludes" in d.ignored[8]
    assert "must run on n2" in d.ignored[9] and "no GPU" in d.ignored[10]


def test_only_settled_requeue_jobs_that_opted_in_are_movable() -> None:
    inst = {0: Instance(0, 4, G3)}
    held = (("n1", (GresCount("gpu", "3g.71gb", 1, (0,)),)),)
    running = {"state": "RUNNING", "nodes": ("n1",), "held": held, "start_s": 0.0}
    cases = {
        11: dict(running, requeue=True, comment="flexmig:hook"),
        12: dict(running, requeue=True, comment=""),  # never signalled: no opt-in
        13: dict(running, requeue=False, comment="flexmig:hook"),  # cannot be requeued
        14: dict(running, requeue=True, comment="x, flexmig:hook", start_s=990.0),  # not settled yet
        15: dict(running, requeue=True, comment="flexmig:hook", node_count=2, nodes=("n1", "n2")),
    }
    d = read_demand(
        [job(i, **kw) for i, kw in cases.items()], NODE, "n1", H200, index_map=inst, now_s=1000.0,
        hook_token="flexmig:hook", hook_settle_s=60,
    )  # fmt: skip
    movable = {r.job.job_id: r.movable for r in d.running}
    assert movable == {11: True, 12: False, 13: False, 14: False, 15: False}
    assert all(r.instances == (Instance(0, 4, G3),) for r in d.running)
    assert [r.name for r in d.requeued_requests(H200)] == ["slurm-11"]


def test_an_index_the_map_does_not_know_makes_a_job_immovable() -> None:
    held = (("n1", (GresCount("gpu", "1g.18gb", 1, (5,)),)),)
    d = read_demand(
        [job(16, state="RUNNING", nodes=("n1",), held=held, requeue=True, comment="flexmig:hook", start_s=0.0)],
        NODE, "n1", H200, index_map={}, now_s=1000.0, hook_token="flexmig:hook",
    )  # fmt: skip
    assert d.running[0].unknown_indices == (5,) and not d.running[0].movable


def test_a_throttled_array_stands_for_the_tasks_slurm_may_start_now() -> None:
    running = job(31, state="RUNNING", nodes=("n1",), array_job_id=30, array_max_tasks=2, start_s=0.0)
    pending = job(30, array_job_id=30, array_max_tasks=2, array_tasks=19)
    d = read_demand([running, pending], NODE, "n1", H200, index_map={}, now_s=1, hook_token="flexmig:hook")
    assert [r.name for r in d.pending] == ["slurm-30"]  # one more may start, not 19
    full = job(32, state="RUNNING", nodes=("n1",), array_job_id=30, array_max_tasks=2, start_s=0.0)
    d = read_demand([running, full, pending], NODE, "n1", H200, index_map={}, now_s=1, hook_token="flexmig:hook")
    assert d.pending == () and "throttle" in d.ignored[30]


def test_a_pending_job_is_aged_from_when_it_became_eligible() -> None:
    d = read_demand([job(40, submit_s=100.0, eligible_s=400.0)], NODE, "n1", H200, index_map={}, now_s=500,
                    hook_token="flexmig:hook")  # fmt: skip
    assert d.pending[0].submitted_s == 400.0
