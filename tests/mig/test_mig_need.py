"""One rule chooses the profile of a (memory, compute) need: a job started at submit and the same job placed by the
planner from the queue get the same profile, and never less memory or compute than they asked for."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmig.act.planview import job_request
from flexmig.act.records import JobRecord
from flexmig.errors import PlanRejectedError
from flexmig.jobspec import JobSpec, NeedSpec
from flexmig.mig import H200, MODELS, GpuModel, Layout, Profile
from flexmig.mig.need import fitting_profile, need_mib
from flexmig.plan import NodeState, Planner, StartJob, profile_for_need


def queued(need: NeedSpec, ranks: int = 1) -> JobRecord:
    """A pending job of ``ranks`` ranks that each need ``need``, as the journal holds it."""
    spec = JobSpec("j", ("/bin/true",), "root", None, Path("/w"), Path("/w/c"), ranks, ranks, ranks, need)
    return JobRecord("j", "u1", spec, "pending", submitted_s=1.0)


def at_submit(model: GpuModel, need: NeedSpec) -> Profile | None:
    """The profile the actuator starts a submitted job on (``jobs.submit`` calls ``profile_on``)."""
    try:
        return need.profile_on(model)
    except ValueError:
        return None


def from_queue(model: GpuModel, need: NeedSpec) -> Profile | None:
    """The profile the planner gives the same job when it places it from the queue."""
    try:
        return profile_for_need(model, job_request(queued(need), model).need)
    except PlanRejectedError:
        return None


def test_16_0005_gib_gets_1g_35gb_on_an_h200_at_submit_and_from_the_queue() -> None:
    need = NeedSpec(memory_gib=16.0005)  # 16,384.512 MiB: more than 1g.18gb's 16,384
    assert need_mib(16.0005) == 16385
    assert at_submit(H200, need) == H200.profile("1g.35gb")
    request = job_request(queued(need), H200)
    assert (request.need.memory_mib, request.rank_memory_mib) == (16385, 16385)
    assert from_queue(H200, need) == H200.profile("1g.35gb")
    plan = Planner(H200).plan(NodeState(H200, (Layout.empty(H200),), pending=(request,)))
    (start,) = [a for a in plan.actions if isinstance(a, StartJob)]
    assert [i.profile.name for i in start.instances] == ["1g.35gb"]


def test_a_need_of_exactly_a_profiles_memory_gets_that_profile() -> None:
    assert (
        at_submit(H200, NeedSpec(memory_gib=16.0))
        == from_queue(H200, NeedSpec(memory_gib=16.0))
        == H200.profile("1g.18gb")
    )


def test_memory_that_is_not_a_finite_number_has_no_profile() -> None:
    with pytest.raises(ValueError, match="not a finite amount"):
        need_mib(math.inf)
    assert at_submit(H200, NeedSpec(memory_gib=math.nan)) is None


_PROFILE_GIB = sorted({p.memory_mib / 1024 for m in MODELS for p in m.plain_profiles})
_gib = st.one_of(
    st.floats(min_value=1 / 1024, max_value=160.0),
    st.sampled_from(_PROFILE_GIB).flatmap(
        lambda g: st.sampled_from([g, math.nextafter(g, 0.0), math.nextafter(g, math.inf), g + 0.5 / 1024])
    ),
)


@given(model=st.sampled_from(MODELS), gib=_gib, compute=st.sampled_from([None, 1, 2, 3, 4, 7]))
def test_every_caller_chooses_the_profile_the_one_rule_chooses(
    model: GpuModel, gib: float, compute: int | None
) -> None:
    need = NeedSpec(memory_gib=gib, compute_slices=compute)
    rule = fitting_profile(model, need_mib(gib), compute or 1)
    assert at_submit(model, need) == from_queue(model, need) == rule
    holds = [p for p in model.plain_profiles if p.memory_mib >= gib * 1024 and p.compute_slices >= (compute or 1)]
    assert (rule is None) == (not holds)
    if rule is not None:
        assert rule in holds  # never less than asked for
        assert all((rule.compute_slices, rule.memory_slices) <= (p.compute_slices, p.memory_slices) for p in holds)
        assert job_request(queued(need), model).rank_memory_mib >= gib * 1024  # a spread rank holds it too
