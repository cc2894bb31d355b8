"""The planner on small nodes whose right answer can be checked by hand (H200; memory slices 0-7)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

import pytest

from flexmig.errors import PlanRejectedError
from flexmig.mig import H200
from flexmig.plan import (
    CreateInstance,
    DestroyInstance,
    Instance,
    JobRequest,
    MigrateJob,
    NodeState,
    Outcome,
    Plan,
    Planner,
    PlannerSettings,
    RankNeed,
    ResplitJob,
    RunningJob,
    StartJob,
    validate_plan,
)
from support.plans import P1, P1M, P2, P3, P4, P7, node, req, running

A = TypeVar("A")

# The costs these cases are worked out for: a 50 s move that must gain twice its cost, ten minutes of settling.
SETTINGS = PlannerSettings(checkpoint_s=20.0, restart_s=30.0, reconfigure_s=2.0, settling_s=600.0, gain_margin=1.0)


def plan_for(state: NodeState, settings: PlannerSettings | None = None) -> tuple[Plan, Outcome]:
    settings = settings or SETTINGS
    plan = Planner(H200, settings).plan(state)
    outcome = validate_plan(state, plan, settings)
    return plan, outcome


def of_type(plan: Plan, kind: type[A]) -> list[A]:
    return [a for a in plan.actions if isinstance(a, kind)]


def test_empty_queue_gives_an_empty_plan() -> None:
    state = NodeState(H200, node([], []))
    plan, _ = plan_for(state)
    assert not plan and plan.cost_s == 0


def test_small_jobs_share_a_gpu_and_keep_the_other_whole_for_a_7g() -> None:
    state = NodeState(H200, node([], []), pending=(req("a", P1), req("b", P2, t=1), req("c", P7, t=2)))
    plan, _ = plan_for(state)
    started = {a.job: a.instances for a in of_type(plan, StartJob)}
    assert set(started) == {"a", "b", "c"}
    assert started["a"][0].gpu == started["b"][0].gpu
    assert started["c"] == (Instance(1 - started["a"][0].gpu, 0, P7),)


def test_a_1g_goes_where_it_leaves_room_for_a_4g() -> None:
    # A 1g at 0-3 would block the only 4g placement; the planner puts it in the upper half.
    state = NodeState(H200, node([]), pending=(req("a", P1),))
    plan, out = plan_for(state)
    (start,) = of_type(plan, StartJob)
    assert start.instances[0].start >= 4
    assert out.layouts[0].place(P4, 0)  # still possible


def test_free_instance_of_the_right_profile_is_reused_without_reconfiguration() -> None:
    state = NodeState(H200, node([(P3, 0), (P3, 4)]), pending=(req("a", P3),))
    plan, _ = plan_for(state)
    assert of_type(plan, CreateInstance) == [] and of_type(plan, DestroyInstance) == []
    assert len(of_type(plan, StartJob)) == 1


def test_busy_gpu_is_repartitioned_around_its_running_job() -> None:
    # GPU 0: a job on 3g@4, a free 3g@0. A 4g fits only at 0: destroy the free 3g, create the 4g, job untouched.
    state = NodeState(
        H200,
        node([(P3, 0), (P3, 4)]),
        running=(running("r", (0, 4, P3)),),
        pending=(req("a", P4),),
    )
    plan, out = plan_for(state)
    assert [type(a) for a in plan.actions] == [DestroyInstance, CreateInstance, StartJob]
    destroy, create = plan.actions[0], plan.actions[1]
    assert isinstance(destroy, DestroyInstance) and isinstance(create, CreateInstance)
    assert destroy.start == 0 and create.profile == P4
    assert out.holds["r"] == (Instance(0, 4, P3),)


def test_elastic_7g_spreads_over_scattered_free_slices() -> None:
    busy = [(P3, 0)]
    state = NodeState(
        H200,
        node(busy, busy, busy),
        running=tuple(running(f"r{g}", (g, 0, P3)) for g in range(3)),
        pending=(req("big", P7, elastic=True),),
    )
    plan, _ = plan_for(state)
    (start,) = of_type(plan, StartJob)
    assert len(start.instances) == 7 and {i.profile for i in start.instances} == {P1}
    assert len({i.gpu for i in start.instances}) >= 2  # one job on several GPUs
    assert "spread" in start.reason


def test_rigid_7g_does_not_spread() -> None:
    busy = [(P3, 0)]
    state = NodeState(
        H200,
        node(busy, busy, busy),
        running=tuple(running(f"r{g}", (g, 0, P3), movable=False) for g in range(3)),
        pending=(req("big", P7),),
    )
    plan, _ = plan_for(state)
    assert of_type(plan, StartJob) == []


def test_no_resplit_setting_keeps_elastic_jobs_whole() -> None:
    busy = [(P3, 0)]
    state = NodeState(
        H200,
        node(busy, busy, busy),
        running=tuple(running(f"r{g}", (g, 0, P3), movable=False) for g in range(3)),
        pending=(req("big", P7, elastic=True),),
    )
    plan, _ = plan_for(state, replace(SETTINGS, resplit=False))
    assert of_type(plan, StartJob) == []


def _blocked_7g(**kw: Any) -> NodeState:
    """GPU 0 holds a small job at 0; GPU 1 holds a 3g at 0: a rigid 7g waits unless the small job moves."""
    return NodeState(
        H200,
        node([(P1, 0)], [(P3, 0)]),
        running=(running("small", (0, 0, P1), **kw), running("other", (1, 0, P3), movable=False)),
        pending=(req("big", P7, t=5.0),),
        now_s=5.0,
    )


def test_small_job_migrates_to_free_a_whole_gpu_for_a_waiting_7g() -> None:
    plan, _ = plan_for(_blocked_7g())
    (move,) = of_type(plan, MigrateJob)
    assert move.job == "small" and move.to_instances[0].gpu == 1
    (start,) = of_type(plan, StartJob)
    assert start.job == "big" and start.instances == (Instance(0, 0, P7),)
    kinds = [type(a) for a in plan.actions]
    assert kinds.index(MigrateJob) < kinds.index(StartJob)
    assert move.cost_s == SETTINGS.checkpoint_s + SETTINGS.restart_s


def test_unmovable_job_is_never_migrated() -> None:
    plan, _ = plan_for(_blocked_7g(movable=False))
    assert of_type(plan, MigrateJob) == [] and of_type(plan, StartJob) == []


def test_job_moved_within_the_settling_time_stays_put() -> None:
    plan, _ = plan_for(_blocked_7g(last_moved=0.0))  # now is 5 s, settling 600 s
    assert of_type(plan, MigrateJob) == []


def test_move_that_gains_less_than_margin_times_cost_is_not_made() -> None:
    # The small job ends in 60 s: waiting 60 s beats a 50 s move (needs gain >= 2 x 50 s).
    plan, _ = plan_for(_blocked_7g(remaining=60.0))
    assert of_type(plan, MigrateJob) == []
    plan, _ = plan_for(_blocked_7g(remaining=500.0))
    assert len(of_type(plan, MigrateJob)) == 1


def test_spread_job_is_resplit_back_to_its_nominal_shape_when_a_gpu_frees() -> None:
    spread = tuple((0, s, P1) for s in range(7))
    nominal = req("e", P7, elastic=True)
    state = NodeState(
        H200,
        node([(P1, s) for s in range(7)], []),
        running=(running("e", *spread, nominal=nominal, remaining=10_000.0),),
        now_s=10_000.0,
    )
    plan, out = plan_for(state)
    (move,) = of_type(plan, ResplitJob)
    assert move.ranks == 1 and move.profile == P7 and move.to_instances == (Instance(1, 0, P7),)
    assert out.holds["e"] == (Instance(1, 0, P7),)


def test_blocked_instance_is_neither_used_nor_destroyed() -> None:
    state = NodeState(H200, node([(P7, 0)]), pending=(req("a", P1),), blocked=frozenset({(0, 0)}))
    plan, _ = plan_for(state)
    assert not plan


def test_blocked_gpu_is_left_alone() -> None:
    state = NodeState(H200, node([], []), pending=(req("a", P7), req("b", P7, t=1)), blocked_gpus=frozenset({0}))
    plan, _ = plan_for(state)
    assert [a.instances[0].gpu for a in of_type(plan, StartJob)] == [1]


def test_backfill_never_takes_the_gpu_reserved_for_the_waiting_head() -> None:
    # GPU 0 frees at t=100 (its job ends); the rigid 7g head reserves it. A long 1g behind it may not go
    # on GPU 0 (it would delay the head), a short one may.
    state = NodeState(
        H200,
        node([(P3, 0)], [(P7, 0)]),
        running=(
            running("ends-soon", (0, 0, P3), remaining=100.0, movable=False),
            running("ends-late", (1, 0, P7), remaining=10_000.0, movable=False),
        ),
        pending=(req("head", P7, t=0), req("long", P1, t=1, runtime=5_000.0), req("short", P1, t=2, runtime=50.0)),
    )
    plan, _ = plan_for(state)
    started = [a.job for a in of_type(plan, StartJob)]
    assert started == ["short"]


def test_backfill_may_not_leave_a_head_reserved_at_its_nominal_shape_only_a_spread() -> None:
    # The elastic 7g head is reserved on GPU 0, which frees at t=2. A long 3g behind it would fit now on GPU 0's
    # free 3g@4, and at t=2 the head could still start, but only spread (4x1g on GPU 0 beside it, 3x1g on GPU 1's
    # free 1g.18gb@3, @5, @6) at 90% speed. The head was reserved whole: the 3g waits (GPU 1 has no room for it).
    ones = [(P1, s) for s in range(7)]
    state = NodeState(
        H200,
        node([(P3, 0), (P3, 4)], ones),
        running=(
            running("ends-soon", (0, 0, P3), remaining=2.0, movable=False),
            running("stays", (1, 0, P1), (1, 1, P1), (1, 2, P1), (1, 4, P1), remaining=50_000.0, movable=False),
        ),
        pending=(req("head", P7, t=0, runtime=341.0, elastic=True), req("long", P3, t=1, runtime=3_671.0)),
    )
    plan, _ = plan_for(state)
    assert of_type(plan, StartJob) == []
    assert any("head waits; reserved from t=2s on GPU(s) [0]" in n for n in plan.notes), plan.notes
    # Ending by the head's start, the same 3g may go there.
    short = replace(state, pending=(state.pending[0], req("short", P3, t=1, runtime=1.0)))
    plan, _ = plan_for(short)
    assert [a.job for a in of_type(plan, StartJob)] == ["short"]


def test_plans_are_deterministic() -> None:
    state = NodeState(
        H200, node([], [], []), pending=tuple(req(f"j{i}", p, t=i) for i, p in enumerate([P1, P3, P2, P4, P1M, P7, P1]))
    )
    first = Planner(H200).plan(state)
    again = Planner(H200).plan(state)
    assert first == again


def test_state_with_one_instance_held_twice_is_refused() -> None:
    state = NodeState(H200, node([(P3, 0)]), running=(running("a", (0, 0, P3)), running("b", (0, 0, P3))))
    with pytest.raises(PlanRejectedError, match="held by both"):
        Planner(H200).plan(state)


def test_request_for_an_unknown_profile_is_refused_by_name() -> None:
    bad = JobRequest("x", RankNeed(profile="9g.1tb"))
    with pytest.raises(PlanRejectedError, match=r"9g\.1tb"):
        Planner(H200).plan(NodeState(H200, node([]), pending=(bad,)))


def test_request_by_memory_and_compute_gets_the_smallest_covering_profile() -> None:
    need = JobRequest("x", RankNeed(memory_mib=20_000, compute_slices=1))
    plan, _ = plan_for(NodeState(H200, node([]), pending=(need,)))
    (start,) = of_type(plan, StartJob)
    assert start.instances[0].profile == P1M


def test_plan_cost_is_the_sum_of_action_costs() -> None:
    plan, _ = plan_for(_blocked_7g())
    assert plan.cost_s == pytest.approx(sum(a.cost_s for a in plan.actions))
    assert isinstance(plan, Plan) and all(a.reason for a in plan.actions)


# ----------------------------------------------------------------------------------------------- malleable jobs
DAEMON = PlannerSettings(settling_s=0.0)  # the daemon's costs; remaining times unknown, as in flexmigd


def ddp(name: str = "ddp", ranks: int = 4, min_ranks: int = 2) -> JobRequest:
    """A job spec with ranks.min below ranks.start: malleable, as flexmigd reads it."""
    return JobRequest(
        name,
        RankNeed(profile=P1M.name),
        ranks=ranks,
        min_ranks=min_ranks,
        max_ranks=ranks,
        rank_memory_mib=P1M.memory_mib,
        malleable=True,
    )


def test_a_malleable_job_shrinks_for_a_queued_one_and_grows_back_when_it_ends() -> None:
    # 4 x 1g.35gb fill every memory slice; a queued 3g needs four of them. Unknown run times (the daemon's case).
    job = RunningJob("ddp", tuple(Instance(0, s, P1M) for s in (0, 2, 4, 6)), ddp(), last_moved_s=0.0)
    head = JobRequest("b", RankNeed(profile=P3.name), rank_memory_mib=P3.memory_mib, submitted_s=1.0)
    state = NodeState(H200, node([(P1M, s) for s in (0, 2, 4, 6)]), (job,), (head,), now_s=100.0)
    plan, out = plan_for(state, DAEMON)
    (shrink,) = of_type(plan, ResplitJob)
    assert (shrink.job, shrink.ranks, [i.start for i in shrink.to_instances]) == ("ddp", 2, [4, 6])
    assert "shrink ddp to 2x1g.35gb (50% speed) to make room for b" in shrink.reason
    (start,) = of_type(plan, StartJob)
    assert start.job == "b" and "after shrinking ddp" in start.reason
    assert sorted(i.start for i in out.holds["ddp"]) == [4, 6]

    # b ends: ddp runs narrow at half speed and grows back to its four ranks.
    narrow = RunningJob("ddp", out.holds["ddp"], ddp(), last_moved_s=100.0)
    after = NodeState(H200, out.layouts, (narrow,), (), now_s=200.0)
    plan, out = plan_for(after, DAEMON)
    (grow,) = of_type(plan, ResplitJob)
    assert grow.ranks == 4 and {i.start for i in grow.from_instances} <= {i.start for i in grow.to_instances}
    assert grow.reason.startswith("grow ddp to 4x1g.35gb (100% speed, from 50%)")
    assert len(out.holds["ddp"]) == 4


def test_a_job_that_is_not_malleable_is_never_shrunk() -> None:
    rigid = replace(ddp(), min_ranks=4, malleable=False)
    job = RunningJob("ddp", tuple(Instance(0, s, P1M) for s in (0, 2, 4, 6)), rigid, last_moved_s=0.0)
    head = JobRequest("b", RankNeed(profile=P3.name), submitted_s=1.0)
    state = NodeState(H200, node([(P1M, s) for s in (0, 2, 4, 6)]), (job,), (head,), now_s=100.0)
    plan, _ = plan_for(state, DAEMON)
    assert not of_type(plan, ResplitJob) and not of_type(plan, StartJob)
    off, _ = plan_for(replace(state, running=(replace(job, nominal=ddp()),)), replace(DAEMON, malleable=False))
    assert not of_type(off, ResplitJob), "malleable off: nothing shrinks either"


NARROW = replace(SETTINGS, gain_margin=0.1)  # the daemon's margin: replay's (1) rules out every half-speed start


def test_a_malleable_head_starts_narrow_when_waiting_for_its_shape_ends_it_later() -> None:
    # GPU 0 runs a job for 10 hours; a 2-GPU elastic, malleable head of 8 hours fits on GPU 1 alone.
    big = replace(req("big", P7, ranks=2, elastic=True, runtime=28_800.0), malleable=True)
    state = NodeState(H200, node([(P7, 0)], []), (running("hold", (0, 0, P7), remaining=36_000.0),), (big,))
    plan, _ = plan_for(state, NARROW)
    (start,) = of_type(plan, StartJob)
    assert start.job == "big" and len(start.instances) == 1 and start.instances[0].gpu == 1
    assert "starts narrow as 1x7g.141gb at 50% speed" in start.reason
    assert "spares ~36000s of waiting for ~18050s of slowdown and growing back, ~28800s if it never grows" in (
        start.reason
    )
    # ... and waits when its shape frees soon: narrow, it would end later.
    soon = replace(state, running=(running("hold", (0, 0, P7), remaining=300.0),))
    plan, _ = plan_for(soon, NARROW)
    assert not of_type(plan, StartJob)


def test_a_narrow_start_that_would_end_later_than_waiting_if_it_never_grew_back_is_not_taken() -> None:
    # 8 hours of work at half speed take 16: waiting 5 hours for both GPUs ends it at 13 h. Expected to grow back
    # at 5 h it would end at ~10.5 h, but if the room went to someone else it would end at 16 h: it waits.
    big = replace(req("big", P7, ranks=2, elastic=True, runtime=28_800.0), malleable=True)
    state = NodeState(H200, node([(P7, 0)], []), (running("hold", (0, 0, P7), remaining=18_000.0),), (big,))
    plan, _ = plan_for(state, NARROW)
    assert not of_type(plan, StartJob)
    longer = replace(state, running=(running("hold", (0, 0, P7), remaining=30_000.0),))
    plan, _ = plan_for(longer, NARROW)
    assert [a.job for a in of_type(plan, StartJob)] == ["big"], "a wait longer than the narrow slowdown: it starts"


def test_a_narrow_start_must_clear_the_gain_margin_like_any_move() -> None:
    # Half speed, growing back when the shape frees (before it is done): the wait spared W must be at least
    # (1 + margin) x (W / 2 + one re-split), which no such W satisfies at replay's margin of 1; at the daemon's 0.1 it
    # does.
    big = replace(req("big", P7, ranks=2, elastic=True, runtime=28_800.0), malleable=True)
    state = NodeState(H200, node([(P7, 0)], []), (running("hold", (0, 0, P7), remaining=50_000.0),), (big,))
    assert not of_type(plan_for(state)[0], StartJob)
    assert of_type(plan_for(state, NARROW)[0], StartJob)


def test_a_malleable_head_is_reserved_narrow_so_it_needs_only_what_frees_first() -> None:
    # Both GPUs busy: GPU 0 frees in 1 h, GPU 1 in 10 h. The 2-GPU malleable head is reserved for one GPU at 1 h,
    # not for both at 10 h: a 2-hour job behind it may not take GPU 0, a 30-minute one may.
    big = replace(req("big", P7, ranks=2, elastic=True, runtime=28_800.0), malleable=True)
    held = (running("soon", (0, 0, P7), remaining=3600.0), running("late", (1, 0, P7), remaining=36_000.0))
    pending = (big, req("long", P1, t=1.0, runtime=7200.0), req("short", P1, t=2.0, runtime=1800.0))
    state = NodeState(H200, node([(P7, 0)], [(P7, 0)]), held, pending)
    plan, _ = plan_for(state, NARROW)
    assert not of_type(plan, StartJob)  # nothing is free now at all
    assert any("big waits; reserved from t=3600s" in n for n in plan.notes)


def test_greedy_discipline_lets_a_long_job_take_the_gpu_the_head_waits_for() -> None:
    state = NodeState(
        H200,
        node([(P3, 0)], [(P7, 0)]),
        running=(
            running("ends-soon", (0, 0, P3), remaining=100.0, movable=False),
            running("ends-late", (1, 0, P7), remaining=10_000.0, movable=False),
        ),
        pending=(req("head", P7, t=0), req("long", P1, t=1, runtime=5_000.0), req("short", P1, t=2, runtime=50.0)),
    )
    easy, _ = plan_for(state)
    greedy, _ = plan_for(state, replace(SETTINGS, discipline="greedy"))
    assert [a.job for a in of_type(easy, StartJob)] == ["short"]
    assert [a.job for a in of_type(greedy, StartJob)] == ["long", "short"]


def test_a_spread_job_regrown_onto_a_larger_free_instance_names_that_instance_s_profile() -> None:
    # The nominal 2g has no place of its own, but a free 3g covers it: the re-split names the 3g it lands on
    # (a hypothesis case once found a ResplitJob naming 2g.35gb with a 3g.71gb as its target).
    layouts = node([(P3, 0), (P1, 4), (P1, 5)], [(P1, 0)], [(P1, 0)], [(P1, 0)])
    elastic = JobRequest("r1", RankNeed(profile=P2.name), ranks=1, min_ranks=1, max_ranks=7, expected_runtime_s=10.0)
    state = NodeState(
        H200,
        layouts,
        running=(
            running("r0", (0, 4, P1), movable=False, remaining=None, last_moved=0.0),
            running("r1", (0, 5, P1), (1, 0, P1), remaining=46.0, last_moved=0.0, nominal=elastic),
            running("r2", (2, 0, P1), movable=False, remaining=None, last_moved=0.0),
            running("r3", (3, 0, P1), movable=False, remaining=None, last_moved=0.0),
        ),
    )
    settings = PlannerSettings(
        checkpoint_s=3.0,
        restart_s=6.0,
        reconfigure_s=2.0,
        settling_s=0.0,
        gain_margin=-0.5,
        migrate=False,
        repartition_busy=False,
    )
    plan, out = plan_for(state, settings)
    resplits = of_type(plan, ResplitJob)
    assert [a.job for a in resplits] == ["r1"]
    for action in resplits:
        assert {i.profile for i in action.to_instances} == {action.profile}
        assert len(action.to_instances) == action.ranks
    assert out.holds["r0"] == state.running[0].instances


def test_a_job_with_standby_ranks_costs_a_standby_restart_to_move() -> None:
    s = PlannerSettings()
    assert s.move_cost() == s.checkpoint_s + s.restart_s
    assert s.move_cost(standby=True) == s.checkpoint_s + s.standby_restart_s < s.move_cost()
    assert s.move_cost(7.0, standby=True) == 7.0, "a job's own figure wins"
