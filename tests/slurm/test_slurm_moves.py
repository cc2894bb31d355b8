"""Moves of running hook jobs under one Slurm node per MIG instance (:func:`flexmig.slurm.moves.plan_moves`): only
jobs that opted in, each at most ``max_moves_per_job`` times, the fewest of them, only when the waiting job gains
more than they lose, and only when every moved job can restart at once somewhere else while the freed region fits
the waiting job."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.slurm.moves import Blocked, MovePlan, Place, Region, Running, plan_moves

PROFILES = ("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
SMALL = ("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb")  # what runs: mostly small, so that moves happen
BIG = ("3g.71gb", "4g.71gb", "7g.141gb", "7g.141gb")  # what waits


def _slices(profile: str) -> int:
    return H200.profile(profile).compute_slices


def _one_1g_each(hosts: dict[str, int]) -> dict[str, list[Layout]]:
    return {h: [Layout.of(H200, [("1g.18gb", 6)]) for _ in range(n)] for h, n in hosts.items()}


def test_two_long_1g_hook_jobs_on_two_gpus_a_7g_moves_one_not_both() -> None:
    hosts = _one_1g_each({"n1": 2})
    running = [
        Running("a", ("n1", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("b", ("n1", 1, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
    ]
    plan = plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb", 5.0)])
    assert len(plan.moves) == 1
    (move,) = plan.moves
    assert plan.region is not None
    assert (plan.region.host, plan.region.gpu, plan.region.start) == (*move.source[:2], 0)
    assert move.target[:2] != move.source[:2]  # it restarts on the other GPU, beside the job that stays
    assert plan.gain > plan.loss


def test_the_two_gpus_on_two_hosts_move_one_job_to_the_other_host() -> None:
    hosts = _one_1g_each({"n1": 1, "n2": 1})
    running = [
        Running("a", ("n1", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("b", ("n2", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
    ]
    plan = plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")])
    assert [m.job for m in plan.moves] == ["a"]
    assert plan.moves[0].target[0] == "n2"


def test_with_requeue_behind_the_room_of_the_waiting_jobs_of_its_profile_is_not_a_moved_job_s_target() -> None:
    # GPU 1 has room for one 1g (slice 5) and a 1g job waits: requeued, the moved 1g would wait behind it (Slurm
    # gives a requeued job the requeue's submit time). The default counts that room as its target (the 7g gains its
    # slices either way); requeue_behind (a rejected variant) leaves it to the waiting job, and moves nothing
    hosts = {"n1": [Layout.of(H200, [("1g.18gb", 6)]),
                    Layout.of(H200, [("3g.71gb", 0), ("1g.18gb", 4), ("1g.18gb", 6)])]}  # fmt: skip
    running = [
        Running("a", ("n1", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
        *(Running(n, ("n1", 1, s), p, hook=False, moves=0, remaining_s=3000.0, cost_s=15.0)
          for n, s, p in (("b", 0, "3g.71gb"), ("c", 4, "1g.18gb"), ("d", 6, "1g.18gb"))),
    ]  # fmt: skip
    big = Blocked("big", "7g.141gb", 5.0)
    queue = [Blocked("small", "1g.18gb", 9.0), big]
    assert [(m.job, m.target) for m in plan_moves(H200, hosts, running, [big]).moves] == [("a", ("n1", 1, 5))]
    assert [m.job for m in plan_moves(H200, hosts, running, queue).moves] == ["a"]
    behind = plan_moves(H200, hosts, running, queue, requeue_behind=True)
    assert not behind.moves and behind.waiting == "big", behind
    assert "no room elsewhere for a" in behind.reason


def test_a_job_that_did_not_opt_in_is_never_moved() -> None:
    hosts = _one_1g_each({"n1": 2})
    running = [
        Running("a", ("n1", 0, 6), "1g.18gb", hook=False, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("b", ("n1", 1, 6), "1g.18gb", hook=False, moves=0, remaining_s=3000.0, cost_s=15.0),
    ]
    assert plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")]).moves == ()


def test_a_job_moved_twice_is_not_moved_again() -> None:
    hosts = _one_1g_each({"n1": 2})
    running = [
        Running("a", ("n1", 0, 6), "1g.18gb", hook=True, moves=2, remaining_s=3000.0, cost_s=15.0),
        Running("b", ("n1", 1, 6), "1g.18gb", hook=True, moves=2, remaining_s=3000.0, cost_s=15.0),
    ]
    assert plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")]).moves == ()
    assert len(plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")], max_moves_per_job=3).moves) == 1


def test_no_move_when_the_waiting_job_gains_less_than_the_moved_job_loses() -> None:
    hosts = _one_1g_each({"n1": 2})
    running = [
        Running("a", ("n1", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=10.0, cost_s=80.0),
        Running("b", ("n1", 1, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=80.0),
    ]
    plan = plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")])
    assert plan.moves == ()
    assert "loses" in plan.reason  # 10 s x 7 slices gained against 80 s x 1 slice lost


def test_no_move_when_the_moved_job_has_nowhere_to_restart() -> None:
    lay = Layout.of(H200, [("4g.71gb", 0), ("3g.71gb", 4)])
    running = [
        Running("a", ("n1", 0, 0), "4g.71gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("b", ("n1", 0, 4), "3g.71gb", hook=False, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("c", ("n1", 1, 0), "4g.71gb", hook=False, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("d", ("n1", 1, 4), "3g.71gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
    ]
    plan = plan_moves(H200, {"n1": [lay, lay]}, running, [Blocked("w", "4g.71gb")])
    assert plan.moves == ()
    assert "no room elsewhere" in plan.reason


def test_no_move_for_a_job_that_a_free_instance_or_a_carving_serves() -> None:
    hosts = {"n1": [Layout.of(H200, [("1g.18gb", 6)])]}
    running = [Running("a", ("n1", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=1.0)]
    plan = plan_moves(H200, hosts, running, [Blocked("w", "3g.71gb")])
    assert plan.moves == ()
    assert plan.waiting is None


def test_a_region_another_job_holds_is_left_to_it() -> None:
    hosts = _one_1g_each({"n1": 3})
    running = [
        Running(n, ("n1", g, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0)
        for g, n in enumerate(("a", "b", "c"))
    ]
    held = [("older", Region("n1", 0, 0, "7g.141gb"))]
    plan = plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")], held=held)
    assert [m.job for m in plan.moves] == ["b"]
    assert plan.region is not None and plan.region.gpu == 1
    assert plan.moves[0].target[1] == 2  # not into the held GPU 0


def test_the_hook_jobs_that_would_hold_the_region_longest_are_moved_and_the_rest_left_to_end() -> None:
    two = Layout.of(H200, [("1g.18gb", 5), ("1g.18gb", 6)])
    full = Layout.of(H200, [("4g.71gb", 0), ("3g.71gb", 4)])
    hosts = {"n1": [two, full], "n2": [Layout.of(H200, [("4g.71gb", 0)])]}
    running = [
        Running("long", ("n1", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("short", ("n1", 0, 5), "1g.18gb", hook=False, moves=0, remaining_s=60.0, cost_s=15.0),
        Running("c", ("n1", 1, 0), "4g.71gb", hook=False, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("d", ("n1", 1, 4), "3g.71gb", hook=False, moves=0, remaining_s=3000.0, cost_s=15.0),
        Running("e", ("n2", 0, 0), "4g.71gb", hook=False, moves=0, remaining_s=3000.0, cost_s=15.0),
    ]
    full_n2 = {**hosts, "n2": [Layout.of(H200, [("4g.71gb", 0), ("3g.71gb", 4)])]}
    busy_n2 = [*running, Running("f", ("n2", 0, 4), "3g.71gb", hook=False, moves=0, remaining_s=9.0, cost_s=1.0)]
    assert plan_moves(H200, full_n2, busy_n2, [Blocked("big", "7g.141gb")]).moves == ()  # no room: every GPU full
    plan = plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")])
    assert [m.job for m in plan.moves] == ["long"]
    assert plan.free_in_s == 60.0  # when the job that stays ends, not in 3000 s
    assert plan.region == Region("n1", 0, 0, "7g.141gb")
    assert plan.moves[0].target[0] == "n2"


def test_of_two_regions_as_good_the_one_the_job_holds_is_taken() -> None:
    hosts = _one_1g_each({"n1": 3})
    running = [
        Running(n, ("n1", g, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=15.0)
        for g, n in enumerate(("a", "b", "c"))
    ]
    held = [("big", Region("n1", 1, 0, "7g.141gb"))]
    plan = plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")], held=held)
    assert [m.job for m in plan.moves] == ["b"]


def test_a_hold_on_a_region_of_jobs_that_may_not_move_does_not_keep_the_moves_from_another() -> None:
    hosts = _one_1g_each({"n1": 2})
    running = [
        Running("deaf", ("n1", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=1800.0, cost_s=15.0),
        Running("plain", ("n1", 1, 6), "1g.18gb", hook=False, moves=0, remaining_s=1800.0, cost_s=15.0),
    ]
    held = [("big", Region("n1", 1, 0, "7g.141gb"))]  # the carving's hold, by the time limits alone
    plan = plan_moves(H200, hosts, running, [Blocked("big", "7g.141gb")], held=held)
    assert [m.job for m in plan.moves] == ["deaf"]
    assert plan.region == Region("n1", 0, 0, "7g.141gb")


def test_a_job_on_an_instance_that_is_not_there_is_refused_by_name() -> None:
    running = [Running("ghost", ("n1", 0, 3), "1g.18gb", hook=True, moves=0, remaining_s=1.0, cost_s=1.0)]
    with pytest.raises(ValueError, match="ghost"):
        plan_moves(H200, _one_1g_each({"n1": 1}), running, [Blocked("w", "7g.141gb")])


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_moves_per_job"):
        plan_moves(H200, _one_1g_each({"n1": 1}), [], [], max_moves_per_job=-1)


# ------------------------------------------------------------------------------------------------ properties


@dataclass(frozen=True)
class Cluster:
    """A cluster as :func:`plan_moves` takes it."""

    hosts: dict[str, list[Layout]]
    running: list[Running]
    waiting: list[Blocked]
    closed: frozenset[Place]
    max_moves: int


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """One to three hosts of one or two GPUs, each GPU laid out by a random sequence of placements of small profiles
    that were legal in turn; each instance busy (mostly hook jobs, moved 0-3 times, a limit or none), closed or free;
    a queue of big profiles (so that some cases move a job)."""
    hosts: dict[str, list[Layout]] = {}
    running: list[Running] = []
    closed: set[Place] = set()
    for h in range(draw(st.integers(1, 3))):
        lays = []
        for g in range(draw(st.integers(1, 2))):
            lay = Layout.empty(H200)
            for name, start in draw(st.lists(st.tuples(st.sampled_from(SMALL), st.integers(0, 7)), max_size=4)):
                if lay.can_place(H200.profile(name), start):
                    lay = lay.place(H200.profile(name), start)
            if draw(st.integers(0, 5)):  # mostly a full GPU: what waits cannot be carved from free slices
                for start in H200.profile("1g.18gb").starts:
                    if lay.can_place(H200.profile("1g.18gb"), start):
                        lay = lay.place(H200.profile("1g.18gb"), start)
            lays.append(lay)
            for inst in lay:
                kind = draw(st.sampled_from(("busy",) * 12 + ("free",) * 3 + ("closed",)))
                place = (f"h{h}", g, inst.start)
                if kind == "closed":
                    closed.add(place)
                elif kind == "busy":
                    running.append(
                        Running(
                            f"j{len(running)}",
                            place,
                            inst.profile.name,
                            hook=draw(st.sampled_from((True,) * 7 + (False,))),
                            moves=draw(st.sampled_from((0, 0, 0, 1, 2, 3))),
                            remaining_s=draw(st.none() | st.floats(0.0, 5000.0)),
                            cost_s=draw(st.floats(0.0, 100.0)),
                        )
                    )
        hosts[f"h{h}"] = lays
    asks = draw(st.lists(st.sampled_from(BIG), min_size=1, max_size=3))
    waiting = [Blocked(f"w{k}", p, 0.0) for k, p in enumerate(asks)]
    return Cluster(hosts, running, waiting, frozenset(closed), draw(st.sampled_from((0, 1, 2, 2, 2, 3))))


@st.composite
def spread_clusters(draw: st.DrawFn) -> Cluster:
    """Small hook jobs spread over the GPUs of one or two hosts (one or two each), a big job waiting: the case moves
    are for, so that most examples move a job."""
    hosts: dict[str, list[Layout]] = {}
    running: list[Running] = []
    for h in range(draw(st.integers(1, 2))):
        lays = []
        for g in range(draw(st.integers(1, 3))):
            lay = Layout.empty(H200)
            for name in draw(st.lists(st.sampled_from(("1g.18gb", "2g.35gb", "3g.71gb")), min_size=1, max_size=2)):
                starts = lay.placements(H200.profile(name))
                if starts:
                    start = draw(st.sampled_from(starts))
                    lay = lay.place(H200.profile(name), start)
                    running.append(
                        Running(
                            f"j{len(running)}",
                            (f"h{h}", g, start),
                            name,
                            hook=draw(st.sampled_from((True,) * 5 + (False,))),
                            moves=draw(st.integers(0, 2)),
                            remaining_s=draw(st.floats(1.0, 5000.0)),
                            cost_s=draw(st.floats(0.0, 60.0)),
                        )
                    )
            lays.append(lay)
        hosts[f"h{h}"] = lays
    waiting = [Blocked("w0", draw(st.sampled_from(("4g.71gb", "7g.141gb"))), 0.0)]
    return Cluster(hosts, running, waiting, frozenset(), 2)


def _plan(c: Cluster) -> MovePlan:
    return plan_moves(H200, c.hosts, c.running, c.waiting, max_moves_per_job=c.max_moves, closed=c.closed)


@settings(max_examples=300, deadline=None)
@given(st.one_of(clusters(), spread_clusters()))
def test_never_moves_a_job_that_did_not_opt_in(c: Cluster) -> None:
    hook = {r.name for r in c.running if r.hook}
    assert all(m.job in hook for m in _plan(c).moves)


@settings(max_examples=300, deadline=None)
@given(st.one_of(clusters(), spread_clusters()))
def test_never_moves_a_job_past_the_bound(c: Cluster) -> None:
    moved = {r.name: r.moves for r in c.running}
    assert all(moved[m.job] < c.max_moves for m in _plan(c).moves)


@settings(max_examples=300, deadline=None)
@given(st.one_of(clusters(), spread_clusters()))
def test_the_region_fits_the_waiting_job_once_free_and_the_moved_jobs_fit_elsewhere_now(c: Cluster) -> None:
    plan = _plan(c)
    if not plan.moves:
        return
    region = plan.region
    assert region is not None
    on = {r.place: r for r in c.running}
    moved = {m.source for m in plan.moves}
    lays = {h: list(ls) for h, ls in c.hosts.items()}
    profile = H200.profile(region.profile)
    lay = lays[region.host][region.gpu]
    for inst in list(lay):
        if region.covers(H200, region.host, region.gpu, inst):
            place = (region.host, region.gpu, inst.start)
            assert place not in c.closed
            if place in on and place not in moved:  # a job that stays ends before the region is said to be free
                left = on[place].remaining_s
                assert left is not None and left <= plan.free_in_s
            lay = lay.remove(inst.start)
    lays[region.host][region.gpu] = lay.place(profile, region.start)
    for m in plan.moves:
        host, g, start = m.target
        target = lays[host][g]
        if not m.create:
            kept = target.at(start)
            assert kept is not None and kept.profile.name == m.profile
            assert m.target not in on and m.target not in c.closed
            continue
        mine = H200.profile(m.profile)
        for other in list(target):
            if other.start < start + mine.memory_slices and start < other.end:
                place = (host, g, other.start)
                assert place not in on and place not in c.closed  # carved from idle instances only
                assert not region.covers(H200, host, g, other)
                target = target.remove(other.start)
        lays[host][g] = target.place(mine, start)  # raises if two moves count on the same slices


@settings(max_examples=300, deadline=None)
@given(st.one_of(clusters(), spread_clusters()))
def test_a_move_is_taken_only_when_the_gain_exceeds_the_loss(c: Cluster) -> None:
    plan = _plan(c)
    if plan.moves:
        by = {r.name: r for r in c.running}
        loss = sum(by[m.job].cost_s * _slices(m.profile) for m in plan.moves)
        assert plan.loss == pytest.approx(loss)
        assert plan.gain > plan.loss
