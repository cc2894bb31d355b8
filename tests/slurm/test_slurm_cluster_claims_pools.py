"""The cluster's assignment (:mod:`flexmig.slurm.cluster_claims`) and jobs of several devices on one node
(``--gres=gpu:1g.18gb:2``, a pool node's): the job's parts go to one host and, for a profile smaller than a GPU, fit
on one GPU of it, so that one host alone carves and makes a pool node for it. Pure."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Waiting
from flexmig.slurm.cluster_claims import (
    BUSY,
    CLOSED,
    IDLE,
    RETIRING,
    Seen,
    assign,
    cluster_hosts,
    cluster_queue,
    host_queue,
    pool_jobs,
)
from flexmig.slurm.gres import GresCount
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.squeue import SlurmJob
from support.slurm_views import LAYOUTS, host_nodes, node

TWO_3G = (("3g.71gb", 0), ("3g.71gb", 4))
TOKEN = "flexmig:hook"


def job(job_id: int, profile: str = "1g.18gb", count: int = 1, nodes: int = 1) -> SlurmJob:
    """A waiting job of ``count`` MIG devices of ``profile`` a node on ``nodes`` nodes."""
    return SlurmJob(
        job_id=job_id, name="j", user_id=1000, user="alice", state="PENDING", reason="Resources",
        partitions=("mig",), nodes=(), node_count=nodes, gpus_per_node=(GresCount("gpu", profile, count),), held=(),
        requeue=False, comment="", priority=100, submit_s=float(job_id), start_s=None, time_limit_s=None,
        restart_count=0,
    )  # fmt: skip


def queue(jobs: list[SlurmJob]) -> list[Waiting]:
    return cluster_queue(jobs, H200, now_s=1e5, hook_token=TOKEN, most_parts=42)[0]


def test_a_pool_job_is_carved_for_by_one_host_alone_with_both_its_parts() -> None:
    """Fails on the assignment that left a pool job out: unassigned, it was in every host's queue (each host carved
    two 1g instances and made a pool node for the one job)."""
    nodes = host_nodes("fm-h1", TWO_3G) + host_nodes("fm-h2", TWO_3G)
    jobs = [job(10, count=2)]
    q = queue(jobs)
    assert [w.name for w in q] == ["slurm-10#1", "slurm-10#2"]
    assert pool_jobs(q, jobs) == {"slurm-10"}
    carving = []
    for h in ("fm-h1", "fm-h2"):
        mine, left, _ = host_queue(h, q, nodes, jobs, H200, reserved=(), seen=Seen(), now_s=0.0, hook_token=TOKEN,
                                   free_after_s=60.0)  # fmt: skip
        assert {w.name for w in mine} in (set(), {"slurm-10#1", "slurm-10#2"}), mine
        if mine:
            carving.append(h)
        else:
            assert set(left) == {"slurm-10#1", "slurm-10#2"}, left
    assert len(carving) == 1, carving


def test_a_job_of_several_nodes_is_no_pool_job_its_parts_may_go_to_different_hosts() -> None:
    jobs = [job(10, "7g.141gb", nodes=2)]
    q = queue(jobs)
    assert pool_jobs(q, jobs) == frozenset()
    hosts = cluster_hosts(host_nodes("fm-h1", (("7g.141gb", 0),)) + host_nodes("fm-h2", (("7g.141gb", 0),)),
                          H200, reserved=())  # fmt: skip
    assert set(assign(q, hosts, H200, partitions={}).values()) == {"fm-h1", "fm-h2"}


def test_a_host_whose_room_for_two_1g_is_split_over_two_gpus_gets_no_pool_job() -> None:
    """fm-h1 has an idle 1g on each of its GPUs (the rest busy), fm-h2 room for two 1g on one GPU only by carving:
    the idle instances cost nothing, but a pool node's instances share one GPU, so the job goes to fm-h2."""
    split = [
        *host_nodes("fm-h1", (("3g.71gb", 0), ("2g.35gb", 4)), BUSY), node("fm-h1", 0, 6, "1g.18gb"),
        *host_nodes("fm-h1", (("3g.71gb", 0), ("2g.35gb", 4)), BUSY, gpu=1), node("fm-h1", 1, 6, "1g.18gb"),
    ]  # fmt: skip
    room = [*host_nodes("fm-h2", (("4g.71gb", 0),), BUSY), node("fm-h2", 0, 4, "3g.71gb")]
    hosts = cluster_hosts(split + room, H200, reserved=())
    pair = [Waiting("slurm-10#1", "1g.18gb", alone=False), Waiting("slurm-10#2", "1g.18gb", alone=False)]
    for first in (10, 11):  # whatever the rotation says
        q = [Waiting(w.name.replace("10", str(first)), w.profile, alone=False) for w in pair]
        got = assign(q, hosts, H200, partitions={}, pools={f"slurm-{first}"})
        assert got == {q[0].name: "fm-h2", q[1].name: "fm-h2"}, got
    # without the pool rule each part would take one of fm-h1's idle 1g instances (no carving)
    assert set(assign(pair, hosts, H200, partitions={}).values()) == {"fm-h1"}
    # a one-device 1g job still takes an idle 1g where it is
    assert assign([Waiting("slurm-12", "1g.18gb")], hosts, H200, partitions={}) == {"slurm-12": "fm-h1"}


def test_two_idle_1g_of_one_gpu_serve_a_pool_job_without_carving() -> None:
    ones = [*host_nodes("fm-h1", (("4g.71gb", 0),), BUSY), *(node("fm-h1", 0, s, "1g.18gb") for s in (4, 5))]
    hosts = cluster_hosts(ones + host_nodes("fm-h2", TWO_3G), H200, reserved=())
    for first in (10, 11):
        q = [Waiting(f"slurm-{first}#{k}", "1g.18gb", alone=False) for k in (1, 2)]
        assert set(assign(q, hosts, H200, partitions={}, pools={f"slurm-{first}"}).values()) == {"fm-h1"}


def test_a_pool_job_that_fits_no_host_is_assigned_to_none_and_later_jobs_still_are() -> None:
    hosts = cluster_hosts(host_nodes("fm-h1", TWO_3G, BUSY) + host_nodes("fm-h2", (("3g.71gb", 0),), BUSY)
                          + [node("fm-h2", 0, 4, "1g.18gb")], H200, reserved=())  # fmt: skip
    q = [Waiting(f"slurm-10#{k}", "1g.18gb", alone=False) for k in (1, 2, 3, 4, 5)]  # five 1g: no GPU has room
    got = assign([*q, Waiting("slurm-11", "1g.18gb")], hosts, H200, partitions={}, pools={"slurm-10"})
    assert got == {"slurm-11": "fm-h2"}, got


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[SlurmNode], list[SlurmJob]]:
    """2-3 hosts of 1-2 GPUs of the layouts above, each instance idle, busy, closed or retiring; and 1-6 waiting
    jobs of one device, several devices on one node, or one device on two nodes."""
    nodes: list[SlurmNode] = []
    for h in range(draw(st.integers(2, 3))):
        for gpu in range(draw(st.integers(1, 2))):
            for p, s in draw(st.sampled_from(LAYOUTS)):
                what = draw(st.sampled_from((IDLE, IDLE, BUSY, CLOSED, RETIRING)))
                nodes.append(node(f"fm-h{h + 1}", gpu, s, p, what))
    ids = draw(st.lists(st.integers(1, 10_000), min_size=1, max_size=6, unique=True))
    jobs = []
    for i in sorted(ids):
        profile = draw(st.sampled_from(("1g.18gb", "2g.35gb", "3g.71gb")))
        count, n = draw(st.sampled_from(((1, 1), (2, 1), (3, 1), (1, 2))))
        jobs.append(job(i, profile, count, n))
    return nodes, jobs


def _fits_one_gpu(nodes: list[SlurmNode], host: str, profile: str, count: int) -> bool:
    """Whether ``count`` instances of ``profile`` can be had on one GPU of ``host`` from its idle instances of the
    profile, its free slices and those of its idle or retiring instances (busy and closed ones stay): the oracle."""
    by_gpu: dict[int, list[tuple[str, int, str]]] = {}
    hosts = cluster_hosts(nodes, H200, reserved=())
    for gpu, on_gpu in hosts[host].gpus.items():
        by_gpu[gpu] = [(p, s, w) for s, (p, w) in on_gpu.items()]
    want = H200.profile(profile)
    for items in by_gpu.values():
        kept = Layout.of(H200, [(p, s) for p, s, w in items if w in (BUSY, CLOSED)])
        ready = sum(1 for p, _, w in items if p == profile and w == IDLE)
        if ready >= count or _most(kept, want) >= count:
            return True
    return False


def _most(lay: Layout, profile: object) -> int:
    """How many instances of ``profile`` at most fit in ``lay`` (greedy from the top, as MIG's placements nest)."""
    n = 0
    for start in sorted(profile.starts, reverse=True):  # type: ignore[attr-defined]
        if lay.can_place(profile, start):  # type: ignore[arg-type]
            lay = lay.place(profile, start)  # type: ignore[arg-type]
            n += 1
    return n


@given(clusters(), st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_a_pool_jobs_parts_go_to_one_host_where_they_fit_one_gpu_or_to_none_whichever_host_computes_it(
    cluster: tuple[list[SlurmNode], list[SlurmJob]], rnd: random.Random
) -> None:
    nodes, jobs = cluster
    q = queue(jobs)
    pools = pool_jobs(q, jobs)
    most = {j.job_id: H200.profile(j.gpus_per_node[0].type or "").max_instances for j in jobs}
    # a job of more devices than one GPU holds (3 x 3g.71gb) is refused (instances.TOO_MANY), no pool job
    assert pools == {f"slurm-{j.job_id}" for j in jobs if j.node_count == 1 and 1 < j.gpus_per_node[0].count
                     <= most[j.job_id]}  # fmt: skip
    hosts = cluster_hosts(nodes, H200, reserved=())
    got = assign(q, hosts, H200, partitions={}, pools=pools)
    for j in jobs:
        base = f"slurm-{j.job_id}"
        parts = [w.name for w in q if w.name.split("#")[0] == base]
        where = {got[p] for p in parts if p in got}
        if base not in pools:
            continue
        assert len(where) <= 1 and (not where or all(p in got for p in parts)), (base, got)
        if where and j.job_id == min(x.job_id for x in jobs):  # the first job sees the hosts as they are
            (host,) = where
            assert _fits_one_gpu(nodes, host, j.gpus_per_node[0].type or "", len(parts)), (host, nodes)
    for h in sorted(hosts):
        view = list(nodes)
        rnd.shuffle(view)  # each host's look lists the nodes in its own order: the same answer
        assert assign(q, cluster_hosts(view, H200, reserved=()), H200, partitions={}, pools=pools) == got
        mine, _, _ = host_queue(h, q, view, jobs, H200, reserved=(), seen=Seen(), now_s=0.0, hook_token=TOKEN,
                                free_after_s=60.0)  # fmt: skip
        for base in pools:  # a pool job in one host's queue (all its parts), or unassigned in every host's
            named = {w.name for w in q if w.name.split("#")[0] == base}
            have = named & {w.name for w in mine}
            assert have in (set(), named), (h, have, named)
            if not any(p in got for p in named):
                assert have == named
