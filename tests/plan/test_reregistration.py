"""Which layout a Slurm node gets, and when flexmig changes to it: an idle node at once, a busy one only when the
forecast of Slurm's own scheduling says the change keeps more slices busy (with hysteresis and batching), never a
layout that idles part of the GPU, and nothing waits longer than ``max_wait_s``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.enumerate import maximal_layouts
from flexmig.mig.layout import Layout
from flexmig.plan.reregistration import (
    Choice,
    DrainHolder,
    NodeNow,
    RegistrationCost,
    changes_instances,
    choose,
    close_in_s,
    horizon_of,
    layout_plan,
)
from flexmig.plan.types import CreateInstance, DestroyInstance, JobRequest, PlannerSettings, RankNeed

SETTINGS = PlannerSettings()
COST = RegistrationCost(fixed_s=2.0, min_interval_s=60.0, max_wait_s=1800.0)
_CACHE: dict[frozenset[str], tuple[Layout, ...]] = {}


def candidates(profiles: frozenset[str]) -> tuple[Layout, ...]:
    if profiles not in _CACHE:
        _CACHE[profiles] = tuple(maximal_layouts(H200, [H200.profile(p) for p in sorted(profiles)]))
    return _CACHE[profiles]


def layout(*items: tuple[str, int]) -> Layout:
    return Layout.of(H200, [(H200.profile(p), s) for p, s in items])


def req(name: str, profile: str, limit_s: float | None = 120.0, submitted: float = 0.0) -> JobRequest:
    return JobRequest(name, RankNeed(profile=profile), submitted_s=submitted, expected_runtime_s=limit_s, movable=False)


def decide(
    today: Layout,
    queue: Sequence[JobRequest],
    running: Sequence[DrainHolder] = (),
    *,
    now: float = 0.0,
    last_change_s: float | None = None,
    committed: bool = False,
    cost: RegistrationCost = COST,
) -> Choice:
    node = NodeNow(H200, (today,), tuple(running), tuple(queue))
    submitted = {r.name: r.submitted_s for r in queue}
    return choose(
        node, candidates=candidates, settings=SETTINGS, cost=cost, now_s=now,
        waited_s=lambda n: now - submitted[n], last_change_s=last_change_s, committed=committed,
    )  # fmt: skip


def profiles(c: Choice) -> list[str]:
    return sorted(i.profile.name for i in c.target[0].instances)


SEVEN = layout(("7g.141gb", 0))
SPLIT = layout(("3g.71gb", 4), ("2g.35gb", 0), ("2g.35gb", 2))


def test_an_idle_node_is_changed_at_once_for_a_job_it_cannot_host() -> None:
    c = decide(SEVEN, [req("a", "1g.18gb")])
    assert c.verdict.go and not c.verdict.forced
    assert "1g.18gb" in profiles(c) and c.verdict.newly_served == ("a",)
    assert c.verdict.drain_s == COST.fixed_s  # nothing to wait for: the re-registration itself


def test_an_emptied_node_is_laid_out_for_the_whole_waiting_mix_not_only_the_head() -> None:
    queue = [req("a", "3g.71gb"), req("b", "2g.35gb"), req("c", "1g.18gb"), req("d", "1g.18gb")]
    c = decide(SEVEN, queue)
    assert c.verdict.go
    assert profiles(c) == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]
    assert set(c.verdict.newly_served) == {"a", "b", "c", "d"}


def test_a_layout_that_idles_part_of_the_gpu_is_never_chosen_over_one_that_uses_it_all() -> None:
    c = decide(SEVEN, [req("a", "2g.35gb")])
    assert sum(i.profile.compute_slices for i in c.target[0].instances) == 7, profiles(c)


def test_jobs_todays_free_instances_can_host_change_nothing() -> None:
    c = decide(SPLIT, [req("a", "2g.35gb"), req("b", "3g.71gb")])
    assert not c.verdict.go and not changes_instances(c.plan), c.verdict.reason


def test_the_batching_gate_never_holds_an_idle_node() -> None:
    c = decide(SEVEN, [req("a", "1g.18gb")], now=100, last_change_s=99)
    assert c.verdict.go, c.verdict.reason


def test_a_busy_node_whose_jobs_keep_it_full_is_not_closed_for_a_young_big_job() -> None:
    running = [
        DrainHolder(f"r{i}", s, 200.0, False, 20.0, ((0, st),)) for i, (s, st) in enumerate([(3, 4), (2, 0), (2, 2)])
    ]
    queue = [req("big", "7g.141gb", submitted=-5), *(req(f"s{i}", p) for i, p in enumerate(["3g.71gb", "2g.35gb"] * 3))]
    c = decide(SPLIT, queue, running)
    assert not c.verdict.go, c.verdict.reason


def test_a_busy_node_is_closed_when_the_change_keeps_more_slices_busy() -> None:
    # A 2g job runs; three 7g jobs wait and nothing else: staying idles 5 of 7 slices.
    running = [DrainHolder("r", 2, 120.0, False, 10.0, ((0, 0),))]
    queue = [req(f"big{i}", "7g.141gb", submitted=-30) for i in range(3)]
    c = decide(SPLIT, queue, running)
    assert c.verdict.go and profiles(c) == ["7g.141gb"], c.verdict.reason
    assert c.verdict.close_by_s == 120.0  # the node is surely empty when the running job's limit ends
    assert close_in_s(NodeNow(H200, (SPLIT,), tuple(running), tuple(queue)), COST.fixed_s) == 60.0  # halfway


def test_a_change_whose_drain_takes_most_of_the_next_runs_waits_for_a_young_big_job() -> None:
    # 3g+2g+2g run with 4 minutes left of their limits (about 2 expected); a 7g job just arrived, a 3g and a 2g job
    # that fit today's layout wait too. The change would idle most of the next run times draining the node: over
    # 2.5 typical runs it looked worth it, over 1.5 (what the mix in bench/slurm_model.py favours) it waits.
    running = [
        DrainHolder(f"r{i}", s, 240.0, False, 60.0, ((0, st),)) for i, (s, st) in enumerate([(3, 4), (2, 0), (2, 2)])
    ]
    queue = [req("big", "7g.141gb", submitted=-5), req("s0", "3g.71gb"), req("s1", "2g.35gb")]
    assert decide(SPLIT, queue, running, cost=replace(COST, horizon_runs=2.5)).verdict.go  # the merged policy
    c = decide(SPLIT, queue, running)
    assert not c.verdict.go and "not worth" in c.verdict.reason, c.verdict.reason
    assert c.verdict.drain_s > 120.0  # the drain: halfway to the limits, then the re-registration


def test_batching_no_second_change_that_closes_a_busy_node_within_min_interval() -> None:
    running = [DrainHolder("r", 2, 120.0, False, 10.0, ((0, 0),))]
    queue = [req(f"big{i}", "7g.141gb", submitted=-30) for i in range(3)]
    c = decide(SPLIT, queue, running, now=100, last_change_s=50)
    assert not c.verdict.go and c.verdict.reason.startswith("batching"), c.verdict.reason


def test_a_committed_change_is_kept_until_staying_is_better_by_the_gain_ratio() -> None:
    running = [
        DrainHolder(f"r{i}", s, 200.0, False, 20.0, ((0, st),)) for i, (s, st) in enumerate([(3, 4), (2, 0), (2, 2)])
    ]
    queue = [req("big", "7g.141gb", submitted=-5), req("s0", "3g.71gb"), req("s1", "3g.71gb")]
    cost = replace(COST, horizon_runs=2.5)  # over this horizon the change is a little better than staying
    fresh = decide(SPLIT, queue, running, cost=cost)
    assert not fresh.verdict.go and "not worth" in fresh.verdict.reason  # a little better: not enough to close
    kept = decide(SPLIT, queue, running, committed=True, cost=cost)
    assert kept.verdict.go, kept.verdict.reason  # but once committed, kept: no flapping
    gone = decide(SPLIT, queue[1:], running, committed=True, cost=cost)  # the 7g job was cancelled
    assert not gone.verdict.go, gone.verdict.reason


def test_nothing_waits_longer_than_max_wait_s_for_a_change() -> None:
    running = [
        DrainHolder(f"r{i}", s, 200.0, False, 20.0, ((0, st),)) for i, (s, st) in enumerate([(3, 4), (2, 0), (2, 2)])
    ]
    cost = RegistrationCost(fixed_s=2.0, min_interval_s=60.0, max_wait_s=900.0)
    queue = [
        req("big", "7g.141gb", submitted=-901),
        *(req(f"s{i}", p) for i, p in enumerate(["3g.71gb", "2g.35gb"] * 3)),
    ]
    c = decide(SPLIT, queue, running, cost=cost, now=0.0, last_change_s=-1.0)
    assert c.verdict.go and c.verdict.forced and "7g.141gb" in profiles(c), c.verdict.reason


def test_jobs_without_a_time_limit_never_make_a_busy_node_look_about_to_empty() -> None:
    running = [DrainHolder("r", 3, None, False, 1.0, ((0, 4),))]  # just started, no --time
    c = decide(SPLIT, [req("a", "1g.18gb", limit_s=None)], running)
    assert not c.verdict.go and c.verdict.close_by_s is None, c.verdict.reason
    assert DrainHolder("old", 1, None, False, 40.0).expected_left_s(5.0) == 40.0  # as long again as it has run


def test_hook_jobs_are_requeued_by_the_change_and_do_not_hold_the_node() -> None:
    hook = DrainHolder("h", 3, None, True, 100.0, ((0, 4),))  # no limit, but it checkpoints
    node = NodeNow(H200, (SPLIT,), (hook,), (req("h", "3g.71gb", limit_s=None), req("a", "1g.18gb")),
                   requeued=frozenset({"h"}))  # fmt: skip
    c = choose(node, candidates=candidates, settings=SETTINGS, cost=COST, now_s=0.0, waited_s=lambda n: 0.0)
    assert c.verdict.go, c.verdict.reason
    assert {"1g.18gb", "3g.71gb"} <= set(profiles(c))  # room for the requeued job and the waiting one


def test_the_plan_destroys_what_differs_then_creates_what_is_new_and_keeps_the_rest() -> None:
    today = layout(("3g.71gb", 4), ("2g.35gb", 0), ("2g.35gb", 2))
    target = layout(("3g.71gb", 4), ("1g.18gb", 0), ("1g.18gb", 1), ("2g.35gb", 2))
    plan = layout_plan([today], [target], 0.0)
    kinds = [(type(a).__name__, a.start) for a in plan.actions if isinstance(a, CreateInstance | DestroyInstance)]
    assert kinds == [("DestroyInstance", 0), ("CreateInstance", 0), ("CreateInstance", 1)]


queue_st = st.lists(
    st.tuples(st.sampled_from(["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]), st.sampled_from([60.0, 120.0, None])),
    min_size=1,
    max_size=8,
)


@settings(deadline=None, max_examples=40)
@given(queue_st, st.sampled_from([SEVEN, SPLIT, layout(*((("1g.18gb", s)) for s in range(7)))]))
def test_an_idle_node_goes_only_to_a_full_valid_layout_that_starts_more(
    queue: list[tuple[str, float | None]], today: Layout
) -> None:
    c = decide(today, [req(f"j{i}", p, limit) for i, (p, limit) in enumerate(queue)])
    assert not c.target[0].violations()
    if c.verdict.go:
        assert changes_instances(c.plan) and c.verdict.gain > 0
        assert math.isfinite(c.verdict.cost) and c.verdict.cost >= 0


running_st = st.lists(
    st.tuples(st.sampled_from([(3, 4), (2, 0), (2, 2)]), st.floats(30.0, 600.0), st.floats(0.0, 300.0)),
    min_size=1,
    max_size=3,
    unique_by=lambda x: x[0],
)


@settings(deadline=None, max_examples=40)
@given(queue_st, running_st, st.sampled_from([1.0, 1.5, 2.5]))
def test_a_busy_node_commits_only_to_a_change_that_is_ready_within_the_horizon(
    queue: list[tuple[str, float | None]], running: list[tuple[tuple[int, int], float, float]], runs: float
) -> None:
    """A change on a busy node must pay for its drain inside the forecast's horizon: unless a job waited
    ``max_wait_s``, it is never committed when the node is not expected to be re-registered before the horizon."""
    holders = [DrainHolder(f"r{i}", s, rem, False, el, ((0, at),)) for i, ((s, at), rem, el) in enumerate(running)]
    requests = [req(f"j{i}", p, limit) for i, (p, limit) in enumerate(queue)]
    cost = replace(COST, horizon_runs=runs)
    c = decide(SPLIT, requests, holders, cost=cost)
    node = NodeNow(H200, (SPLIT,), tuple(holders), tuple(requests))
    if c.verdict.go and not c.verdict.forced:
        assert c.verdict.drain_s < horizon_of(node, cost.fixed_s, runs), c.verdict.reason
    assert horizon_of(node, cost.fixed_s, runs) <= horizon_of(node, cost.fixed_s, runs + 1.0)
