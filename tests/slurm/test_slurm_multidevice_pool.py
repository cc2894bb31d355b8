"""The pure decisions of pool nodes (:mod:`flexmig.slurm.pool`): which waiting jobs want one, what the static form's
names and slurm.conf lines are, which free instances a pool takes, and when it gives them back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmig.mig.catalogue import model_by_key
from flexmig.plan.types import JobRequest, RankNeed
from flexmig.slurm.demand import SlurmDemand
from flexmig.slurm.gres import GresCount
from flexmig.slurm.instances import queue_of
from flexmig.slurm.pool import (
    POOL_WEIGHT,
    Pool,
    PoolAsk,
    PoolDevice,
    choose_pool,
    parse_pool_node,
    pool_asks,
    pool_lines,
    pool_node,
    pool_places,
    pool_retires,
    split_asks,
)
from flexmig.slurm.settings import instance_port, parse_instance_node
from flexmig.slurm.slots import slot_places
from flexmig.slurm.squeue import SlurmJob

H200 = model_by_key("h200")


def dev(gpu: int, start: int, profile: str = "1g.18gb", *, free: bool = True) -> PoolDevice:
    return PoolDevice(gpu, start, profile, free)


# ------------------------------------------------------------------------------------------- asks
def test_only_requests_of_several_devices_of_one_profile_are_pool_asks() -> None:
    reqs = [
        JobRequest("slurm-1", RankNeed("1g.18gb"), ranks=2),
        JobRequest("slurm-2", RankNeed("3g.71gb"), ranks=1),
        JobRequest("slurm-3", RankNeed(None, memory_mib=1000), ranks=3),
        JobRequest("slurm-4", RankNeed("2g.35gb"), ranks=3),
    ]
    assert pool_asks(reqs) == [PoolAsk("slurm-1", "1g.18gb", 2), PoolAsk("slurm-4", "2g.35gb", 3)]
    assert PoolAsk("slurm-1", "1g.18gb", 2).gres == "gpu:1g.18gb:2"


# ------------------------------------------------------------------------------------------- names and lines
def test_a_pool_node_is_named_after_its_gpu_count_and_profile_and_is_never_read_as_an_instance_node() -> None:
    assert pool_node("fm-node", 0, 2, "1g.18gb") == "fm-node-gpu0-x2-1g18gb"
    assert pool_node("fm-node", None, 3, "7g.141gb") == "fm-node-x3-7g141gb"
    assert parse_pool_node("fm-node", "fm-node-gpu0-x2-1g18gb") == (0, 2, "1g18gb")
    assert parse_pool_node("fm-node", "fm-node-x3-7g141gb") == (None, 3, "7g141gb")
    assert parse_instance_node("fm-node", "fm-node-gpu0-x2-1g18gb") is None
    assert parse_pool_node("fm-node", "fm-node-gpu0-0-1g18gb") is None  # an instance node
    assert parse_pool_node("fm-node", "other-gpu0-x2-1g18gb") is None
    assert parse_pool_node("fm-node", "fm-node-gpu0-x1-1g18gb") is None


def test_a_pool_of_one_device_is_refused_with_its_count() -> None:
    with pytest.raises(ValueError, match="not 1"):
        pool_node("fm-node", 0, 1, "1g.18gb")


def test_an_h200_gpu_has_twelve_pool_lines_and_the_host_one_per_count_of_whole_gpus() -> None:
    places = list(pool_places(H200, 2))
    per_gpu = [(g, p.name, n) for g, p, n in places if g == 0]
    assert len(per_gpu) == 12
    assert ("1g.18gb", 7) in {(p, n) for _, p, n in per_gpu}
    assert not any(p.endswith("+me") for _, p, _ in per_gpu)  # one instance a GPU: no pool of them
    assert [(g, p.name, n) for g, p, n in places if g is None] == [(None, "7g.141gb", 2)]


def test_pool_lines_are_future_nodes_above_the_instance_nodes_ports_with_a_high_weight() -> None:
    gpus, base = 2, 6830
    lines = pool_lines("fm-node", H200, gpus, port_base=base, cpus_per_slice=2, hostname="h", addr="127.0.0.1")
    first = lines[0]
    assert first.startswith("NodeName=fm-node-gpu0-x2-1g18gb NodeHostname=h NodeAddr=127.0.0.1 ")
    assert "Gres=gpu:1g.18gb:2" in first and "CPUs=4" in first and f"Weight={POOL_WEIGHT}" in first
    assert first.endswith("State=FUTURE")
    ports = [int(line.split("Port=")[1].split()[0]) for line in lines]
    top = max(instance_port(base, g, s) for g, _, s in slot_places(H200, gpus))
    assert len(set(ports)) == len(ports) and min(ports) > top
    names = [line.split()[0] for line in lines]
    assert len(set(names)) == len(names)


def test_a_host_of_no_gpus_or_absurdly_many_is_refused() -> None:
    for gpus in (0, 65):
        with pytest.raises(ValueError, match=f"{gpus} GPUs"):
            list(pool_places(H200, gpus))


# ------------------------------------------------------------------------------------------- choosing
def test_two_free_1g_instances_of_one_gpu_make_the_pool() -> None:
    devices = [dev(0, 0), dev(0, 1, free=False), dev(0, 2), dev(0, 4, "3g.71gb")]
    pool = choose_pool(PoolAsk("slurm-7", "1g.18gb", 2), devices, H200)
    assert pool == Pool("1g.18gb", ((0, 0), (0, 2)), 0)
    assert pool.gres == "gpu:1g.18gb:2" and pool.name("fm-node") == "fm-node-gpu0-x2-1g18gb"


def test_free_instances_on_two_gpus_do_not_make_a_pool_of_a_smaller_profile() -> None:
    assert choose_pool(PoolAsk("slurm-7", "1g.18gb", 2), [dev(0, 0), dev(1, 0)], H200) is None


def test_the_gpu_with_the_fewest_free_instances_that_suffice_is_taken() -> None:
    devices = [dev(0, s) for s in range(7)] + [dev(1, 3), dev(1, 5), dev(2, 0)]
    pool = choose_pool(PoolAsk("slurm-7", "1g.18gb", 2), devices, H200)
    assert pool is not None and pool.devices == ((1, 3), (1, 5))


def test_whole_gpu_instances_pool_across_the_lowest_gpus() -> None:
    devices = [dev(g, 0, "7g.141gb") for g in (3, 1, 2)]
    pool = choose_pool(PoolAsk("slurm-9", "7g.141gb", 2), devices, H200)
    assert pool == Pool("7g.141gb", ((1, 0), (2, 0)), None)
    assert pool.name("fm-node") == "fm-node-x2-7g141gb"


def test_an_unknown_profile_is_refused_naming_it() -> None:
    with pytest.raises(KeyError, match=r"9g\.1gb"):
        choose_pool(PoolAsk("slurm-7", "9g.1gb", 2), [dev(0, 0)], H200)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.booleans()), max_size=28), st.integers(2, 7))
def test_a_chosen_pool_has_exactly_the_count_asked_of_distinct_free_instances_of_its_profile_on_one_gpu(
    raw: list[tuple[int, int, bool]], count: int
) -> None:
    devices = list({(g, s): dev(g, s, free=f) for g, s, f in raw}.values())
    pool = choose_pool(PoolAsk("slurm-1", "1g.18gb", count), devices, H200)
    free = {(d.gpu, d.start) for d in devices if d.free}
    per_gpu = {g: sum(1 for fg, _ in free if fg == g) for g, _ in free}
    if pool is None:
        assert all(n < count for n in per_gpu.values())
    else:
        assert len(pool.devices) == len(set(pool.devices)) == count
        assert set(pool.devices) <= free and {g for g, _ in pool.devices} == {pool.gpu}


# ------------------------------------------------------------------------------------------- giving back
def test_an_idle_pool_with_no_job_asking_for_its_gres_retires_after_a_round() -> None:
    pool = Pool("1g.18gb", ((0, 0), (0, 1)), 0)
    assert not pool_retires(pool, idle_rounds=0, held=False, asks=[])
    assert pool_retires(pool, idle_rounds=1, held=False, asks=[PoolAsk("slurm-2", "1g.18gb", 3)])
    assert not pool_retires(pool, idle_rounds=5, held=False, asks=[PoolAsk("slurm-2", "1g.18gb", 2)])
    assert not pool_retires(pool, idle_rounds=5, held=True, asks=[])


# ------------------------------------------------------------------------------------------- the carving's queue
def test_with_pool_nodes_a_job_of_two_devices_on_one_node_waits_as_two_parts_and_without_them_is_left_out() -> None:
    """A host that registers pool nodes carves a job of N devices on one node as N parts, the instances its pool node
    is then made of; without pool nodes (the cluster's assignment) it is left out, saying why; a job of several
    devices on each of several nodes is left out either way (a pool node is one host's)."""
    pair = JobRequest("slurm-1", RankNeed("1g.18gb"), ranks=2, min_ranks=2, max_ranks=2, submitted_s=100.0)
    demand = SlurmDemand("n", (pair,), (), (), {})
    queue, left = queue_of(demand, 130.0, pools=True)
    assert [(w.name, w.profile, w.alone) for w in queue] == [
        ("slurm-1#1", "1g.18gb", False),
        ("slurm-1#2", "1g.18gb", False),
    ]
    assert left == {}
    queue, left = queue_of(demand, 130.0)
    assert queue == [] and "--nodes=2 --gres=gpu:1g.18gb:1" in left["slurm-1"]
    job = SlurmJob(
        job_id=1, name="j", user_id=1000, user="alice", state="PENDING", reason="Resources", partitions=("mig",),
        nodes=(), node_count=2, gpus_per_node=(GresCount("gpu", "1g.18gb", 2),), held=(), requeue=False, comment="",
        priority=100, submit_s=100.0, start_s=None, time_limit_s=None, restart_count=0,
    )  # fmt: skip
    queue, left = queue_of(SlurmDemand("n", (pair,), (job,), (), {}), 130.0, pools=True)
    assert queue == [] and "not 2 nodes of 2 devices" in left["slurm-1"]


def test_an_idle_pool_node_serves_as_many_waiting_jobs_of_its_exact_gres_as_there_are_such_pools() -> None:
    """In Slurm's priority order: a second job of the same GRES wants a pool node of its own, another GRES too."""
    asks = [PoolAsk("slurm-1", "1g.18gb", 2), PoolAsk("slurm-2", "1g.18gb", 2), PoolAsk("slurm-3", "1g.18gb", 3)]
    pool = Pool("1g.18gb", ((0, 0), (0, 1)), 0)
    assert split_asks(asks, [pool]) == (frozenset({"slurm-1"}), asks[1:])
    assert split_asks(asks, []) == (frozenset(), asks)
    other = Pool("1g.18gb", ((1, 0), (1, 1)), 1)
    assert split_asks(asks, [pool, other]) == (frozenset({"slurm-1", "slurm-2"}), asks[2:])
