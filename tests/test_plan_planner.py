"""The planner on small nodes whose right answer can be checked by hand (H200; memory slices 0-7)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

import pytest

from flexmig.errors import PlanRejectedError
from flexmig.mig import H200, Layout, Profile
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

P1 = H200.profile("1g.18gb")
P1M = H200.profile("1g.35gb")
P2 = H200.profile("2g.35gb")
P3 = H200.profile("3g.71gb")
P4 = H200.profile("4g.71gb")
P7 = H200.profile("7g.141gb")
A = TypeVar("A")

# The costs these cases are worked out for: a 50 s move that must gain twice its cost, ten minutes of settling.
SETTINGS = PlannerSettings(checkpoint_s=20.0, restart_s=30.0, reconfigure_s=2.0, settling_s=600.0, gain_margin=1.0)


def req(
    name: str,
    profile: Profile,
    *,
    t: float = 0.0,
    runtime: float = 1000.0,
    ranks: int = 1,
    elastic: bool = False,
    movable: bool = True,
) -> JobRequest:
    """A queued request; elastic ones may run as 1..7*ranks ranks."""
    return JobRequest(
        name,
        RankNeed(profile=profile.name),
        ranks=ranks,
        min_ranks=1 if elastic else ranks,
        max_ranks=ranks * profile.compute_slices if elastic else ranks,
        submitted_s=t,
        expected_runtime_s=runtime,
        movable=movable,
    )


def node(*gpus: list[tuple[Profile, int]]) -> tuple[Layout, ...]:
    """Layouts from lists of (profile, start) per GPU."""
    return tuple(Layout.of(H200, items) for items in gpus)


def running(
    name: str,
    *instances: tuple[int, int, Profile],
    remaining: float = 10_000.0,
    last_moved: float | None = -10_000.0,
    movable: bool = True,
    nominal: JobRequest | None = None,
) -> RunningJob:
    """A running job on ``instances`` ((gpu, start, profile) triples)."""
    insts = tuple(Instance(g, s, p) for g, s, p in instances)
    return RunningJob(
        name,
        insts,
        nominal or req(name, insts[0].profile, ranks=len(insts)),
        movable=movable,
        last_moved_s=last_moved,
        remaining_s=remaining,
    )


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
