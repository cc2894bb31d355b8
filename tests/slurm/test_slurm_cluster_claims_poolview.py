"""The cluster's view of pool nodes (:func:`flexmig.slurm.cluster_claims.cluster_hosts`): a pool node's instances
have no instance nodes of their own while it exists, so before this view counted them their slices were free on
their host to every other host (the assignment gave waiting jobs room a pool holds, a move counted it as a moved
job's target, the move owner counted the host as having room now). Pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Waiting
from flexmig.slurm.cluster_claims import BUSY, CLOSED, IDLE, assign, cluster_hosts, move_owner
from flexmig.slurm.gres import GresCount
from flexmig.slurm.moving import other_hosts
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.pool import pool_node
from flexmig.slurm.settings import slot_node
from flexmig.slurm.squeue import SlurmJob

TOKEN = "flexmig:hook"
STATES = {IDLE: ("idle", frozenset[str]()), BUSY: ("allocated", frozenset[str]()),
          CLOSED: ("idle", frozenset({"DRAIN"})), "future": ("future", frozenset[str]())}  # fmt: skip


def node(host: str, gpu: int, start: int, profile: str, what: str = IDLE) -> SlurmNode:
    """A static instance node as Slurm lists it (``what`` "future": its instance has no node now)."""
    state, flags = STATES[what]
    return SlurmNode(slot_node(host, gpu, start, profile), state, flags, "maintenance" if flags else "",
                     (GresCount("gpu", profile, 1),), (), ("mig",), 8)  # fmt: skip


def pool(host: str, gpu: int | None, count: int, profile: str, what: str = BUSY) -> SlurmNode:
    """A pool node of ``count`` devices of ``profile`` as Slurm lists it."""
    state, flags = STATES[what]
    return SlurmNode(pool_node(host, gpu, count, profile), state, flags, "", (GresCount("gpu", profile, count),),
                     (), ("mig",), 8 * count)  # fmt: skip


def running(job_id: int, node_name: str, *, hook: bool) -> SlurmJob:
    """A job running on ``node_name`` (a hook job that may be requeued when ``hook``), limit one hour."""
    return SlurmJob(
        job_id=job_id, name="j", user_id=1000, user="alice", state="RUNNING", reason="None", partitions=("mig",),
        nodes=(node_name,), node_count=1, gpus_per_node=(), held=(), requeue=hook, comment=TOKEN if hook else "",
        priority=100, submit_s=0.0, start_s=0.0, time_limit_s=3600.0, restart_count=0,
    )  # fmt: skip


# fm-h1's GPU 0: a busy 3g at 4 and a pool node over the 1g instances at 0 and 1 (their own nodes in FUTURE);
# slices 2-3 are free.
POOLED = [node("fm-h1", 0, 4, "3g.71gb", BUSY), node("fm-h1", 0, 0, "1g.18gb", "future"),
          node("fm-h1", 0, 1, "1g.18gb", "future")]  # fmt: skip


def test_a_pools_slices_are_not_free_room_on_its_host() -> None:
    """Fails before: the 1g instances of the pool had no nodes, so slices 0-3 looked free and a waiting 3g job was
    assigned to fm-h1, which cannot carve it while the pool exists."""
    hosts = cluster_hosts([*POOLED, pool("fm-h1", 0, 2, "1g.18gb")], H200, reserved=())
    assert hosts["fm-h1"].gpus[0] == {4: ("3g.71gb", BUSY), 0: ("1g.18gb", BUSY), 1: ("1g.18gb", BUSY)}
    assert assign([Waiting("slurm-7", "3g.71gb")], hosts, H200, partitions={}) == {}
    assert assign([Waiting("slurm-8", "2g.35gb")], hosts, H200, partitions={}) == {"slurm-8": "fm-h1"}
    # without the pool node (given back: its instances have their own nodes again) the room is there
    assert assign([Waiting("slurm-7", "3g.71gb")], cluster_hosts(POOLED, H200, reserved=()), H200,
                  partitions={}) == {"slurm-7": "fm-h1"}  # fmt: skip


def test_an_idle_or_drained_pool_is_closed_and_a_future_one_is_no_pool() -> None:
    for what in (IDLE, CLOSED):
        hosts = cluster_hosts([*POOLED, pool("fm-h1", 0, 2, "1g.18gb", what)], H200, reserved=())
        assert hosts["fm-h1"].gpus[0][0] == ("1g.18gb", CLOSED)
        # closed: not an idle 1g a one-device job would be given, nor destroyed for a 3g
        assert assign([Waiting("slurm-7", "3g.71gb"), Waiting("slurm-9", "1g.18gb")], hosts, H200,
                      partitions={}) == {"slurm-9": "fm-h1"}  # fmt: skip
    hosts = cluster_hosts([*POOLED, pool("fm-h1", 0, 2, "1g.18gb", "future")], H200, reserved=())
    assert hosts["fm-h1"].gpus[0] == {4: ("3g.71gb", BUSY)}


def test_a_pool_job_goes_to_the_host_whose_open_pool_node_serves_it() -> None:
    """fm-h1 made an idle pool node of two 1g for the job (Slurm starts it there at its next pass); fm-h2 has two idle
    1g instances (no carving). Fails without the open pool: the job was assigned to fm-h2 (the pool's slices closed,
    or, before the view saw pools, free but to be carved), so fm-h1 left it to fm-h2, which carved for it, and gave
    its pool back as no job it served asked for it."""
    nodes = [*POOLED, pool("fm-h1", 0, 2, "1g.18gb", IDLE), node("fm-h2", 0, 0, "1g.18gb"),
             node("fm-h2", 0, 1, "1g.18gb"), node("fm-h2", 0, 4, "3g.71gb", BUSY)]  # fmt: skip
    hosts = cluster_hosts(nodes, H200, reserved=())
    assert hosts["fm-h1"].pools == (("1g.18gb", 2),) and hosts["fm-h2"].pools == ()
    for first in (10, 11):  # whatever the rotation says
        pair = [Waiting(f"slurm-{first}#{k}", "1g.18gb", alone=False) for k in (1, 2)]
        later = [Waiting(f"slurm-{first + 2}#{k}", "1g.18gb", alone=False) for k in (1, 2)]
        got = assign([*pair, *later], hosts, H200, partitions={}, pools={f"slurm-{first}", f"slurm-{first + 2}"})
        # the first in priority order takes the pool; the next one is carved for where there is room
        assert got == {**{w.name: "fm-h1" for w in pair}, **{w.name: "fm-h2" for w in later}}, got
        # three 1g: not that pool's job
        three = [Waiting(f"slurm-{first}#{k}", "1g.18gb", alone=False) for k in (1, 2, 3)]
        assert "fm-h1" not in assign(three, hosts, H200, partitions={}, pools={f"slurm-{first}"}).values()
    drained = cluster_hosts([*POOLED, pool("fm-h1", 0, 2, "1g.18gb", CLOSED)], H200, reserved=())
    assert drained["fm-h1"].pools == ()


def test_a_pool_on_a_gpu_with_no_instance_node_adds_the_gpu_full() -> None:
    """Dynamic instance nodes: a GPU whose instances are all a pool's has no node but the pool's."""
    hosts = cluster_hosts([pool("fm-h1", 0, 7, "1g.18gb")], H200, reserved=())
    assert sorted(hosts["fm-h1"].gpus[0]) == list(range(7))
    assert assign([Waiting("slurm-7", "1g.18gb")], hosts, H200, partitions={}) == {}


def test_a_whole_gpu_pool_holds_as_many_empty_gpus() -> None:
    futures = [node("fm-h1", g, 0, "7g.141gb", "future") for g in range(3)]
    hosts = cluster_hosts([*futures, pool("fm-h1", None, 2, "7g.141gb")], H200, reserved=())
    assert hosts["fm-h1"].gpus == {0: {0: ("7g.141gb", BUSY)}, 1: {0: ("7g.141gb", BUSY)}, 2: {}}
    q = [Waiting("slurm-7", "7g.141gb"), Waiting("slurm-8", "7g.141gb")]
    assert assign(q, hosts, H200, partitions={}) == {"slurm-7": "fm-h1"}


def test_a_pool_that_does_not_fit_beside_the_instance_nodes_leaves_its_host_out() -> None:
    """A view caught between two looks (the pool's instances' nodes still listed): like overlapping instances."""
    full = [node("fm-h1", 0, s, "1g.18gb") for s in range(7)]
    assert "fm-h1" not in cluster_hosts([*full, pool("fm-h1", 0, 2, "1g.18gb")], H200, reserved=())
    assert "fm-h1" in cluster_hosts(full, H200, reserved=())


def test_a_gres_or_name_that_is_no_pool_of_the_model_is_ignored() -> None:
    odd = SlurmNode("fm-h1-gpu0-x2-1g18gb", "allocated", frozenset(), "", (GresCount("gpu", "1g.18gb", 3),), (),
                    ("mig",), 8)  # fmt: skip
    whole_on_gpu = pool("fm-h1", 0, 2, "7g.141gb")
    assert cluster_hosts([*POOLED, odd, whole_on_gpu], H200, reserved=()) == cluster_hosts(POOLED, H200, reserved=())


def test_room_in_another_hosts_pool_is_no_target_of_a_move() -> None:
    """Fails before: fm-h1's pool slices counted as free on its GPU, a target for a job fm-h2 moves."""
    lays, busy, closed = other_hosts("fm-h2", [*POOLED, pool("fm-h1", 0, 2, "1g.18gb")], H200, reserved=())
    assert sorted((i.start, i.profile.name) for i in lays["fm-h1"][0]) == [(0, "1g.18gb"), (1, "1g.18gb"),
                                                                           (4, "3g.71gb")]  # fmt: skip
    assert {r.place for r in busy} == {("fm-h1", 0, 0), ("fm-h1", 0, 1), ("fm-h1", 0, 4)}
    lays, busy, closed = other_hosts("fm-h2", [*POOLED, pool("fm-h1", 0, 2, "1g.18gb", IDLE)], H200, reserved=())
    assert closed == {("fm-h1", 0, 0), ("fm-h1", 0, 1)}
    assert not Layout.of(H200, [(i.profile, i.start) for i in lays["fm-h1"][0]]).can_place(
        H200.profile("3g.71gb"), 0)  # fmt: skip


def test_a_host_whose_room_is_a_busy_pool_has_no_room_now_for_the_move_owner() -> None:
    """Fails before: fm-h1's GPU looked empty (its pool's 1g instances had no nodes), so fm-h1 had "room now" for
    the 7g job and owned it: no host moved, and the 7g job waited for the pool's job to end."""
    nodes = [pool("fm-h1", 0, 7, "1g.18gb"), node("fm-h1", 0, 0, "7g.141gb", "future"),
             node("fm-h2", 0, 0, "4g.71gb", BUSY), node("fm-h2", 0, 4, "3g.71gb")]  # fmt: skip
    jobs = [running(1, "fm-h1-gpu0-x7-1g18gb", hook=False), running(2, nodes[2].name, hook=True)]
    got = move_owner(Waiting("slurm-9", "7g.141gb"), nodes, jobs, [], H200, hook_token=TOKEN, max_moves=2)
    assert got == "fm-h2"


@st.composite
def pooled_gpus(draw: st.DrawFn) -> tuple[list[tuple[str, int]], str, list[int]]:
    """A GPU's layout of small profiles and the starts of 2 or more instances of one profile a pool took: the lowest
    of them (as :func:`flexmig.slurm.pool.choose_pool` takes them), or any of them."""
    lay = Layout.empty(H200)
    for _ in range(draw(st.integers(0, 7))):
        small = H200.profile(draw(st.sampled_from(("1g.18gb", "2g.35gb", "3g.71gb"))))
        fits = lay.placements(small)
        if fits:
            lay = lay.place(small, draw(st.sampled_from(fits)))
    items = [(i.profile.name, i.start) for i in lay]
    by_profile: dict[str, list[int]] = {}
    for name, start in items:
        by_profile.setdefault(name, []).append(start)
    choices = sorted(p for p, starts in by_profile.items() if len(starts) >= 2)
    if not choices:
        return items, "", []
    profile = draw(st.sampled_from(choices))
    starts = sorted(by_profile[profile])
    n = draw(st.integers(2, len(starts)))
    taken = starts[:n] if draw(st.booleans()) else sorted(draw(st.permutations(starts))[:n])
    return items, profile, taken


@given(pooled_gpus(), st.sampled_from((BUSY, IDLE)))
@settings(max_examples=200, deadline=None)
def test_a_pool_counts_exactly_its_slices_and_never_makes_room(
    gpu: tuple[list[tuple[str, int]], str, list[int]], what: str
) -> None:
    """Whatever instances a pool took, the view's GPU has the real one's instances of each profile and as many free
    slices (never more room than there is); when the pool took the instances the view puts it on (the lowest that
    fit beside the others), the view is the real layout exactly."""
    items, profile, taken = gpu
    listed = [node("fm-h1", 0, s, p, BUSY) for p, s in items if not (p == profile and s in taken)]
    nodes = listed + ([pool("fm-h1", 0, len(taken), profile, what)] if taken else [])
    hosts = cluster_hosts(nodes, H200, reserved=())
    if not items:
        assert "fm-h1" not in hosts
        return
    seen = hosts["fm-h1"].gpus[0]
    real = Layout.of(H200, items)
    view = Layout.of(H200, [(p, s) for s, (p, _) in seen.items()])
    assert sorted(i.profile.name for i in view) == sorted(i.profile.name for i in real)
    assert sum(i.profile.memory_slices for i in view) == sum(i.profile.memory_slices for i in real)
    if what == IDLE and taken:
        assert sum(1 for p, w in seen.values() if w == CLOSED) == len(taken)
    starts = sorted(s for p, s in items if p == profile)
    if taken and taken == starts[: len(taken)]:
        rest = [(p, s) for p, s in items if not (p == profile and s in taken)]
        lay, first = Layout.of(H200, rest), []
        for _ in taken:  # the starts the view puts the pool on: the first that fit, one after another
            first.append(next(s for s in H200.profile(profile).starts if lay.can_place(H200.profile(profile), s)))
            lay = lay.place(H200.profile(profile), first[-1])
        if first == taken:
            assert view == real
