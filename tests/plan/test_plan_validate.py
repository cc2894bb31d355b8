"""validate_plan refuses, by action number and reason, every plan the hardware or a rule would refuse."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from flexmig.errors import PlanRejectedError
from flexmig.mig import H200, Profile
from flexmig.plan import (
    Action,
    CreateInstance,
    DestroyInstance,
    Instance,
    JobRequest,
    MigrateJob,
    NodeState,
    Outcome,
    Plan,
    PlannerSettings,
    ResplitJob,
    RunningJob,
    StartJob,
    validate_plan,
)
from support.plans import P1, P3, P4, P7, node, req, running


def state(
    layouts: list[list[tuple[Profile, int]]],
    running: Iterable[RunningJob] = (),
    pending: Iterable[JobRequest] = (),
    now: float = 1000.0,
    **kw: Any,
) -> NodeState:
    return NodeState(H200, node(*layouts), tuple(running), tuple(pending), now, **kw)


def check(st: NodeState, *actions: Action, settings: PlannerSettings | None = None) -> Outcome:
    return validate_plan(st, Plan(tuple(actions)), settings)


def create(g: int, s: int, p: Profile) -> CreateInstance:
    return CreateInstance(g, s, p, "test", 2.0)


def destroy(g: int, s: int, p: Profile) -> DestroyInstance:
    return DestroyInstance(g, s, p, "test", 2.0)


def test_create_that_overlaps_is_refused_naming_the_slice() -> None:
    with pytest.raises(PlanRejectedError, match=r"action 1 .*memory slice 4 is already held"):
        check(state([[(P3, 4)]]), create(0, 0, P7))


def test_create_at_a_start_the_profile_does_not_allow_is_refused() -> None:
    with pytest.raises(PlanRejectedError, match="may start only"):
        check(state([[]]), create(0, 2, P3))


def test_destroying_an_instance_a_job_holds_is_refused() -> None:
    st = state([[(P3, 0)]], running=[running("a", (0, 0, P3))])
    with pytest.raises(PlanRejectedError, match="held by 'a'"):
        check(st, destroy(0, 0, P3))


def test_destroying_a_missing_instance_is_refused() -> None:
    with pytest.raises(PlanRejectedError, match=r"no 3g\.71gb"):
        check(state([[]]), destroy(0, 0, P3))


def test_order_matters_destroy_then_create_is_valid_create_then_destroy_is_not() -> None:
    st = state([[(P3, 0)]])
    out = check(st, destroy(0, 0, P3), create(0, 0, P4))
    assert out.layouts[0].spec() == "4g.71gb@0"
    with pytest.raises(PlanRejectedError, match="action 1"):
        check(st, create(0, 0, P4), destroy(0, 0, P3))


def test_start_needs_a_queued_job_and_existing_free_instances() -> None:
    st = state([[(P3, 0)]], pending=[req("a", P3)])
    assert check(st, StartJob("a", (Instance(0, 0, P3),), "go", 0)).holds["a"] == (Instance(0, 0, P3),)
    with pytest.raises(PlanRejectedError, match="not waiting"):
        check(st, StartJob("zz", (Instance(0, 0, P3),), "go", 0))
    with pytest.raises(PlanRejectedError, match=r"no 3g\.71gb instance at gpu0:3g\.71gb@4"):
        check(st, StartJob("a", (Instance(0, 4, P3),), "go", 0))


def test_a_job_is_never_started_twice() -> None:
    st = state([[(P3, 0), (P3, 4)]], pending=[req("a", P3)])
    with pytest.raises(PlanRejectedError, match="started twice"):
        check(st, StartJob("a", (Instance(0, 0, P3),), "", 0), StartJob("a", (Instance(0, 4, P3),), "", 0))


def test_start_in_a_shape_the_request_does_not_allow_is_refused() -> None:
    st = state([[(P1, 0), (P1, 1)]], pending=[req("a", P3)])
    with pytest.raises(PlanRejectedError, match="may not run"):
        check(st, StartJob("a", (Instance(0, 0, P1), Instance(0, 1, P1)), "", 0))


def test_rigid_job_may_take_a_larger_instance_but_not_a_smaller_one() -> None:
    st = state([[(P4, 0), (P1, 4)]], pending=[req("a", P3), req("b", P3)])
    check(st, StartJob("a", (Instance(0, 0, P4),), "", 0))
    with pytest.raises(PlanRejectedError):
        check(st, StartJob("b", (Instance(0, 4, P1),), "", 0))


def test_migrating_an_unmovable_job_is_refused() -> None:
    st = state([[(P3, 0), (P3, 4)]], running=[running("a", (0, 0, P3), movable=False)])
    with pytest.raises(PlanRejectedError, match="may not be moved"):
        check(st, MigrateJob("a", (Instance(0, 0, P3),), (Instance(0, 4, P3),), "", 50))


def test_moving_a_job_inside_the_settling_time_is_refused() -> None:
    st = state([[(P3, 0), (P3, 4)]], running=[running("a", (0, 0, P3), last_moved=900.0)], now=1000.0)
    move = MigrateJob("a", (Instance(0, 0, P3),), (Instance(0, 4, P3),), "", 50)
    with pytest.raises(PlanRejectedError, match="settling"):
        check(st, move, settings=PlannerSettings(settling_s=600))
    assert check(st, move, settings=PlannerSettings(settling_s=60)).holds["a"] == (Instance(0, 4, P3),)


def test_migration_onto_an_instance_another_job_holds_is_refused() -> None:
    st = state([[(P3, 0), (P3, 4)]], running=[running("a", (0, 0, P3)), running("b", (0, 4, P3))])
    with pytest.raises(PlanRejectedError, match="held by 'b'"):
        check(st, MigrateJob("a", (Instance(0, 0, P3),), (Instance(0, 4, P3),), "", 50))


def test_migration_must_name_every_instance_the_job_holds() -> None:
    st = state([[(P1, 0), (P1, 1), (P1, 2)]], running=[running("a", (0, 0, P1), (0, 1, P1))])
    with pytest.raises(PlanRejectedError, match="exactly the instances"):
        check(st, MigrateJob("a", (Instance(0, 0, P1),), (Instance(0, 2, P1),), "", 50))


def test_resplit_changes_the_shape_within_the_elastic_range() -> None:
    nominal = req("a", P7, elastic=True)
    st = state([[(P7, 0)], [(P1, s) for s in range(7)]], running=[running("a", (0, 0, P7), nominal=nominal)])
    to = tuple(Instance(1, s, P1) for s in range(7))
    out = check(st, ResplitJob("a", 7, P1, (Instance(0, 0, P7),), to, "", 50))
    assert out.holds["a"] == to
    rigid = state([[(P7, 0)], [(P1, s) for s in range(7)]], running=[running("b", (0, 0, P7))])
    with pytest.raises(PlanRejectedError, match="may not run as 7x1g"):
        check(rigid, ResplitJob("b", 7, P1, (Instance(0, 0, P7),), tuple(Instance(1, s, P1) for s in range(7)), "", 50))


def test_a_blocked_instance_is_never_used() -> None:
    st = state([[(P3, 0)]], pending=[req("a", P3)], blocked=frozenset({(0, 0)}))
    with pytest.raises(PlanRejectedError, match="blocked"):
        check(st, StartJob("a", (Instance(0, 0, P3),), "", 0))


def test_nothing_is_created_on_a_blocked_gpu() -> None:
    with pytest.raises(PlanRejectedError, match="GPU 0 is blocked"):
        check(state([[]], blocked_gpus=frozenset({0})), create(0, 0, P7))
