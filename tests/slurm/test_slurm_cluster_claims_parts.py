"""The cluster's assignment of waiting jobs to hosts (:mod:`flexmig.slurm.cluster_claims`), pure: each host's view
of the instance nodes of every host, the assignment every host computes alike, and a host's queue from it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Waiting, carve
from flexmig.slurm.cluster_claims import (
    BUSY,
    CLOSED,
    IDLE,
    RETIRING,
    Seen,
    aged,
    assign,
    cluster_hosts,
    cluster_queue,
    host_queue,
    queue_for,
)
from flexmig.slurm.gres import GresCount
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.settings import slot_node
from flexmig.slurm.squeue import SlurmJob
from support.slurm_views import LAYOUTS, host_nodes, node

PROFILES = ("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")


def job(job_id: int, profile: str = "1g.18gb", **kw: object) -> SlurmJob:
    """A waiting job of one MIG device of ``profile`` (submitted at second ``job_id``)."""
    return SlurmJob(
        job_id=job_id, name="j", user_id=1000, user="alice", state="PENDING", reason="Resources",
        partitions=("mig",), nodes=(), node_count=1, gpus_per_node=(GresCount("gpu", profile, 1),), held=(),
        requeue=False, comment="", priority=100, submit_s=float(job_id), start_s=None, time_limit_s=None,
        restart_count=0, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def waiting(*profiles: str, first: int = 10) -> list[Waiting]:
    return [Waiting(f"slurm-{first + k}", p) for k, p in enumerate(profiles)]


def hosts_of(nodes: list[SlurmNode], reserved: frozenset[str] = frozenset()) -> dict[str, object]:
    return dict(cluster_hosts(nodes, H200, reserved=reserved))


TWO_3G = (("3g.71gb", 0), ("3g.71gb", 4))


def test_two_idle_hosts_three_1g_jobs_all_go_to_one_host_which_carves_one_3g_for_them() -> None:
    nodes = host_nodes("fm-h1", TWO_3G) + host_nodes("fm-h2", TWO_3G)
    hosts = cluster_hosts(nodes, H200, reserved=())
    queue = waiting("1g.18gb", "1g.18gb", "1g.18gb")
    got = assign(queue, hosts, H200, partitions={})
    assert set(got) == {j.name for j in queue} and len(set(got.values())) == 1, got
    # the rotation on the job's ID: the first job's ID picks among equal hosts
    assert set(assign(waiting("1g.18gb", first=11), hosts, H200, partitions={}).values()) != set(got.values())
    # while that host carves (its idle 3g drained by flexmig to be retired), the jobs stay its own
    (owner,) = set(got.values())
    other = "fm-h2" if owner == "fm-h1" else "fm-h1"
    mid = [node(owner, 0, 0, "3g.71gb"), node(owner, 0, 4, "3g.71gb", RETIRING), *host_nodes(other, TWO_3G)]
    assert assign(queue, cluster_hosts(mid, H200, reserved=()), H200, partitions={}) == got
    # its 3g retired (the node back in FUTURE: not listed), then its new 1g nodes registered
    gone = [node(owner, 0, 0, "3g.71gb"), *host_nodes(other, TWO_3G)]
    assert assign(queue, cluster_hosts(gone, H200, reserved=()), H200, partitions={}) == got
    made = [*gone, *(node(owner, 0, s, "1g.18gb") for s in (4, 5, 6))]
    assert assign(queue, cluster_hosts(made, H200, reserved=()), H200, partitions={}) == got


def test_a_job_an_idle_instance_of_another_host_can_run_is_carved_for_nowhere_else() -> None:
    nodes = host_nodes("fm-h1", TWO_3G) + host_nodes("fm-h2", (("3g.71gb", 0), ("1g.18gb", 4)))
    queue = waiting("1g.18gb")
    for first in (10, 11):  # whatever the rotation says
        q = waiting("1g.18gb", first=first)
        assert assign(q, cluster_hosts(nodes, H200, reserved=()), H200, partitions={}) == {q[0].name: "fm-h2"}
    mine, left, _ = host_queue("fm-h1", queue, nodes, [job(10)], H200, reserved=(), seen=Seen(), now_s=0.0,
                               hook_token="flexmig:hook", free_after_s=60.0)  # fmt: skip
    assert mine == [] and "fm-h2" in left["slurm-10"], left


def test_busy_closed_and_reserved_instances_are_neither_given_nor_destroyed() -> None:
    busy = host_nodes("fm-h1", (("1g.18gb", 0), ("1g.18gb", 1)), BUSY)
    closed = [node("fm-h1", 0, 2, "1g.18gb", CLOSED), node("fm-h1", 0, 4, "3g.71gb")]
    hosts = cluster_hosts([*busy, *closed], H200, reserved={slot_node("fm-h1", 0, 4, "3g.71gb")})
    assert {s: w for s, (_, w) in hosts["fm-h1"].gpus[0].items()} == {0: BUSY, 1: BUSY, 2: CLOSED, 4: CLOSED}
    # slice 3 alone is free: one 1g there, the closed 1g and the reserved 3g neither serve nor are destroyed
    assert assign(waiting("1g.18gb", "1g.18gb", "3g.71gb"), hosts, H200, partitions={}) == {"slurm-10": "fm-h1"}


def test_a_job_goes_only_to_a_host_of_its_partitions() -> None:
    a = host_nodes("fm-h1", TWO_3G)
    b = [SlurmNode(n.name, n.state, n.flags, n.reason, n.gres, (), ("big",), 8) for n in host_nodes("fm-h2", TWO_3G)]
    hosts = cluster_hosts([*a, *b], H200, reserved=())
    for first in (10, 11):
        q = waiting("1g.18gb", first=first)
        assert assign(q, hosts, H200, partitions={q[0].name: frozenset({"big"})}) == {q[0].name: "fm-h2"}


def test_names_that_are_not_instance_nodes_of_the_model_are_no_host() -> None:
    odd = [
        SlurmNode("fm-h1-gpu0", "idle", frozenset(), "", (GresCount("gpu", "1g.18gb", 7),), (), ("mig",), 8),
        SlurmNode("fm-h2-gpu0-4-1g18gb", "idle", frozenset(), "", (GresCount("gpu", "3g.71gb", 1),), (), (), 8),
        SlurmNode("fm-h3-gpu0-3", "idle", frozenset(), "", (GresCount("gpu", "3g.71gb", 1),), (), (), 8),  # bad start
        SlurmNode("login1", "idle", frozenset(), "", (), (), (), 8),
    ]
    assert cluster_hosts(odd, H200, reserved=()) == {}
    dynamic = [node("fm-h4", 0, 4, "3g.71gb", static=False)]
    assert set(cluster_hosts(dynamic, H200, reserved=())) == {"fm-h4"}
    overlapping = [node("fm-h5", 0, 0, "7g.141gb"), node("fm-h5", 0, 4, "3g.71gb")]  # caught between two looks
    assert cluster_hosts(overlapping, H200, reserved=()) == {}


def test_a_host_alone_keeps_its_queue() -> None:
    queue = waiting("1g.18gb", "7g.141gb")
    jobs = [job(10), job(11, "7g.141gb")]
    mine, left, seen = host_queue("fm-h1", queue, host_nodes("fm-h1", TWO_3G), jobs, H200, reserved=(), seen=Seen(),
                                  now_s=5.0, hook_token="flexmig:hook", free_after_s=60.0)  # fmt: skip
    assert (mine, left, seen) == (queue, {}, Seen())


def test_the_cluster_queue_leaves_jobs_that_name_nodes_to_everyone() -> None:
    jobs = [job(1), job(2, excluded_nodes=("fm-h1-gpu0-4-1g18gb",)), job(3, required_nodes=("fm-h2-gpu0-4-1g18gb",))]
    queue, parts = cluster_queue(jobs, H200, now_s=10.0, hook_token="flexmig:hook", most_parts=14)
    assert [w.name for w in queue] == ["slurm-1"] and parts == {"slurm-1": frozenset({"mig"})}


def test_a_job_left_waiting_by_its_host_becomes_anyones_after_the_bound() -> None:
    queue = waiting("1g.18gb")
    assignment = {"slurm-10": "fm-h2"}
    seen = aged(Seen(), assignment, 100.0)
    assert queue_for("fm-h1", queue, assignment, seen, now_s=159.0, free_after_s=60.0)[0] == []
    seen = aged(seen, assignment, 159.0)
    assert queue_for("fm-h1", queue, assignment, seen, now_s=160.0, free_after_s=60.0)[0] == queue
    moved = aged(seen, {"slurm-10": "fm-h3"}, 160.0)  # another host now: its clock starts again
    assert queue_for("fm-h1", queue, {"slurm-10": "fm-h3"}, moved, now_s=200.0, free_after_s=60.0)[0] == []
    assert aged(moved, {}, 201.0) == Seen()  # no longer waits: forgotten


# ---------------------------------------------------------------------------------------------- properties
@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[SlurmNode], list[SlurmJob]]:
    """A cluster's instance nodes (1-3 hosts of 1-2 GPUs, each instance idle, busy, closed or retiring) and a queue."""
    nodes: list[SlurmNode] = []
    static = draw(st.booleans())
    for h in range(draw(st.integers(1, 3))):
        for gpu in range(draw(st.integers(1, 2))):
            for p, s in draw(st.sampled_from(LAYOUTS)):
                what = draw(st.sampled_from((IDLE, IDLE, BUSY, CLOSED, RETIRING)))
                nodes.append(node(f"fm-h{h + 1}", gpu, s, p, what, static=static))
    ids = draw(st.lists(st.integers(1, 10_000), min_size=1, max_size=8, unique=True))
    return nodes, [job(i, draw(st.sampled_from(PROFILES))) for i in sorted(ids)]


def queue_of(jobs: list[SlurmJob]) -> list[Waiting]:
    return cluster_queue(jobs, H200, now_s=1e5, hook_token="flexmig:hook", most_parts=42)[0]


@given(clusters(), st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_each_waiting_job_is_carved_for_by_one_host_at_most_whichever_host_computes_it(
    cluster: tuple[list[SlurmNode], list[SlurmJob]], rnd: random.Random
) -> None:
    nodes, jobs = cluster
    queue = queue_of(jobs)
    hosts = cluster_hosts(nodes, H200, reserved=())
    got = assign(queue, hosts, H200, partitions={})
    assert set(got.values()) <= set(hosts)
    queues = {}
    for h in sorted(hosts):
        view = list(nodes)
        rnd.shuffle(view)  # each host's look lists the nodes in its own order
        assert assign(queue, cluster_hosts(view, H200, reserved=()), H200, partitions={}) == got
        mine, _, _ = host_queue(h, queue, view, jobs, H200, reserved=(), seen=Seen(), now_s=0.0,
                                hook_token="flexmig:hook", free_after_s=60.0)  # fmt: skip
        queues[h] = {w.name for w in mine}
    if len(hosts) > 1:
        for w in queue:  # an assigned job in its host's queue alone; an unassigned one in every host's
            carving = [h for h in hosts if w.name in queues[h]]
            assert carving == ([got[w.name]] if w.name in got else sorted(hosts)), (w, got, queues)


def _serves(nodes: list[SlurmNode], host: str, job: Waiting) -> bool:
    """Whether :func:`flexmig.plan.carving.carve`, given host ``host`` as Slurm shows it and ``job`` alone, serves
    the job now (an idle instance of its profile, or one it carves): the oracle of the assignment. An instance
    flexmig is retiring is left out (its place is free), one an administrator closed is pinned."""
    by_gpu: dict[int, list[tuple[SlurmNode, str, int]]] = {}
    for n in nodes:
        gpu, start = n.name.rsplit("-gpu", 1)[1].split("-")[:2]
        if not n.name.startswith(host + "-gpu"):
            continue
        on_gpu = by_gpu.setdefault(int(gpu), [])  # the GPU is the host's even when every instance retires
        if not (n.drained and n.reason.startswith("flexmig")):
            on_gpu.append((n, n.gres[0].type or "", int(start)))
    layouts: list[Layout] = []
    busy: dict[tuple[int, int], float | None] = {}
    pinned: set[tuple[int, int]] = set()
    free = False
    for k, g in enumerate(sorted(by_gpu)):
        layouts.append(Layout.of(H200, [(p, s) for _, p, s in by_gpu[g]]))
        for n, p, s in by_gpu[g]:
            if n.state != "idle":
                busy[(k, s)] = None
            elif n.drained:
                pinned.add((k, s))
            elif p == job.profile:
                free = True
    c = carve(H200, layouts, busy, [job], now_s=0.0, pinned=frozenset(pinned), keep_free=False, hold_when_idle=False)
    return free or bool(c.create)


@given(clusters())
@settings(max_examples=150, deadline=None)
def test_a_lone_job_is_assigned_exactly_when_some_host_can_serve_it(
    cluster: tuple[list[SlurmNode], list[SlurmJob]],
) -> None:
    nodes, jobs = cluster
    job = queue_of(jobs[:1])[0]
    hosts = cluster_hosts(nodes, H200, reserved=())
    got = assign([job], hosts, H200, partitions={})
    can = [h for h in sorted(hosts) if _serves(nodes, h, job)]
    assert (job.name in got) == bool(can), (job, got, can)
    if job.name in got:
        assert got[job.name] in can


@given(clusters(), st.floats(0.0, 1e6), st.floats(1.0, 600.0))
@settings(max_examples=100, deadline=None)
def test_a_job_assigned_elsewhere_is_freed_once_stuck_past_the_bound(
    cluster: tuple[list[SlurmNode], list[SlurmJob]], t0: float, bound: float
) -> None:
    nodes, jobs = cluster
    queue = queue_of(jobs)
    hosts = cluster_hosts(nodes, H200, reserved=())
    got = assign(queue, hosts, H200, partitions={})
    seen = aged(Seen(), got, t0)
    for h in hosts:
        before = {w.name for w in queue_for(h, queue, got, seen, now_s=t0 + bound * 0.99, free_after_s=bound)[0]}
        later = t0 + bound + 1.0
        after = {w.name for w in queue_for(h, queue, got, aged(seen, got, later), now_s=later, free_after_s=bound)[0]}
        assert after == {w.name for w in queue}  # every job is this host's again
        assert before == {w.name for w in queue if got.get(w.name, h) == h}
