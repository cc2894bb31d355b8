"""The replay engine and the five policies on job lists small enough to check by hand."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200, Layout, Profile, parse_node_spec
from flexmig.plan import Discipline, PlannerSettings
from flexmig.replay.bound import lower_bound
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.engine import Replay, replay
from flexmig.replay.managers import FluidManager, LayoutManager, Manager
from flexmig.replay.metrics import Metrics, metrics_of, percentile
from flexmig.replay.repack import RepackManager
from flexmig.replay.run import Prepared, run_policy
from flexmig.replay.trace import TraceJob

P1 = H200.profile("1g.18gb")
P2 = H200.profile("2g.35gb")
P3 = H200.profile("3g.71gb")
P4 = H200.profile("4g.71gb")
P7 = H200.profile("7g.141gb")
MIX = {"1g.18gb": 0.25, "3g.71gb": 0.25, "4g.71gb": 0.25, "7g.141gb": 0.25}
RECONF = REPLAY_SETTINGS.reconfigure_s


def job(name: str, profile: Profile, arrival: float, runtime: float, ranks: int = 1, elastic: bool = False) -> TraceJob:
    return TraceJob(name, float(arrival), float(runtime), profile, ranks, elastic, 1000)


def empty(gpus: int) -> list[Layout]:
    return [Layout.empty(H200)] * gpus


Policy = Literal["fluid", "repack", "static", "drain", "drain-first-fit", "flex"]


def run(
    policy: Policy,
    jobs: list[TraceJob],
    gpus: int = 1,
    layouts: list[Layout] | None = None,
    settings: PlannerSettings | None = None,
    *,
    discipline: Discipline = "easy",
    malleable: bool = False,
) -> tuple[Replay, Metrics]:
    settings = replace(settings or REPLAY_SETTINGS, discipline=discipline)
    manager: Manager
    if policy == "fluid":
        manager = FluidManager(H200, gpus, discipline)
    elif policy == "repack":
        manager = RepackManager(H200, gpus, discipline)
    else:
        manager = LayoutManager(policy, H200, layouts or empty(gpus), settings)
    result = replay(jobs, manager, 7 * gpus, MIX, malleable=malleable)
    return result, metrics_of(policy, result)


def ends(result: Replay) -> dict[str, float | None]:
    return {r.name: r.end_s for r in result.records}


def test_fluid_runs_two_full_gpu_jobs_one_after_the_other_on_one_gpu() -> None:
    result, m = run("fluid", [job("a", P7, 0, 100), job("b", P7, 0, 100)])
    assert ends(result) == {"a": 100.0, "b": 200.0}
    assert (m.makespan_s, m.mean_jct_s, m.mean_wait_s) == (200.0, 150.0, 50.0)
    assert m.utilization == pytest.approx(1.0)


def test_static_full_gpu_layout_runs_a_4g_and_a_3g_in_turn_flex_runs_them_together() -> None:
    jobs = [job("a", P4, 0, 100), job("b", P3, 0, 100)]
    static, _ = run("static", jobs, layouts=[Layout.of(H200, [(P7, 0)])])
    assert ends(static) == {"a": 100.0, "b": 200.0}
    flex, m = run("flex", jobs)
    # Plans run serially: create 4g (2 s), start a, create 3g (2 s), start b.
    assert ends(flex) == {"a": 100.0 + RECONF, "b": 100.0 + 2 * RECONF}
    assert m.utilization == pytest.approx(7 * 100 / (7 * (100 + 2 * RECONF)))


def test_drain_never_touches_a_busy_gpu_flex_repartitions_around_the_job() -> None:
    jobs = [job("a", P1, 0, 1000), job("b", P3, 1, 10)]
    start = [Layout.of(H200, [(P1, 6)])]
    drain, _ = run("drain-first-fit", jobs, layouts=start)  # a takes the idle GPU's 1g as it is
    b_start = next(r for r in drain.records if r.name == "b").start_s
    assert b_start is not None and b_start >= 1000.0
    flex, _ = run("flex", jobs, layouts=start)
    b = next(r for r in flex.records if r.name == "b")
    assert b.start_s == 1 + RECONF and b.end_s == 1 + RECONF + 10


def test_elastic_job_spreads_over_scattered_slices_and_runs_at_the_spread_efficiency() -> None:
    hogs = [job(f"h{g}", P4, 0, 100_000) for g in range(3)]  # a 4g sits at 0: one per GPU
    wide = job("wide", P7, 10, 900, elastic=True)
    result, m = run("flex", [*hogs, wide], gpus=3)
    record = next(r for r in result.records if r.name == "wide")
    assert record.spread_start and m.spread_starts == 1
    efficiency = REPLAY_SETTINGS.spread_efficiency
    assert record.end_s is not None and record.start_s is not None
    assert record.end_s - record.start_s == pytest.approx(900 / efficiency)
    rigid, _ = run("flex", [*hogs, wide], gpus=3, settings=replace(REPLAY_SETTINGS, resplit=False))
    wide_start = next(r for r in rigid.records if r.name == "wide").start_s
    assert wide_start is not None and wide_start >= 100_000


def test_small_job_is_migrated_so_a_waiting_full_gpu_job_starts() -> None:
    # GPU 0: a long 4g (plus a short 3g); GPU 1: a short 4g (plus the long 1g). At t=100 the short ones end,
    # leaving the 1g alone on GPU 1, which the 7g arriving at t=1000 needs whole.
    jobs = [
        job("long4", P4, 0, 50_000),
        job("short3", P3, 0, 100),
        job("short4", P4, 0, 100),
        job("small", P1, 0, 50_000),
        job("big", P7, 1000, 1000),
    ]
    result, m = run("flex", jobs, gpus=2)
    assert m.migrations == 1
    big = next(r for r in result.records if r.name == "big")
    assert big.start_s is not None and big.start_s < 2000  # instead of waiting ~49,000 s
    (moved,) = [r for r in result.records if r.moves]
    assert moved.name in ("long4", "small")  # either makes a GPU whole; one move is enough
    cost = REPLAY_SETTINGS.checkpoint_s + REPLAY_SETTINGS.restart_s
    assert moved.end_s is not None and moved.start_s is not None
    assert moved.end_s - moved.start_s == pytest.approx(50_000 + cost)  # the moved job pays its downtime


EASY_CASE = [  # see the two tests below
    job("j0", P7, 0, 1),
    job("j1", P7, 0, 100),
    job("j2", P7, 0, 100),
    job("j3", P7, 1, 50, ranks=2),
    job("j4", P7, 2, 1000),
]


def starts(result: Replay) -> dict[str, float | None]:
    return {r.name: r.start_s for r in result.records}


def test_a_backfill_may_take_the_heads_gpu_when_the_head_still_fits_elsewhere_at_its_start() -> None:
    # 3x7g, static. j0 leaves GPU 0 at t=1; j1 and j2 hold GPUs 1 and 2 until t=100. The 2-GPU head j3 waits for
    # t=100 and would take GPUs 0 and 1; j4 (long) fits now only on GPU 0. It starts: at t=100 the head still fits
    # on GPUs 1 and 2 ("sits on a reserved GPU" is not the test; "the head still fits at T" is).
    result, _ = run("static", EASY_CASE, gpus=3, layouts=[Layout.of(H200, [(P7, 0)])] * 3)
    got = starts(result)
    assert (got["j4"], got["j3"]) == (2.0, 100.0)


def test_every_job_ending_at_the_heads_start_is_released_together() -> None:
    # Fluid, 21 slices: j1 and j2 both end at t=100, so 7 slices are left then beside the 14-slice head: enough for
    # the long j4 now (counting only the first of the two to end, none would be).
    result, _ = run("fluid", EASY_CASE, gpus=3)
    got = starts(result)
    assert (got["j4"], got["j3"]) == (2.0, 100.0)
    packed, _ = run("repack", EASY_CASE, gpus=3)
    assert starts(packed) == got


def test_greedy_never_holds_a_job_back_for_the_head_and_easy_does() -> None:
    # 2x7g: a long job holds GPU 0; the 2-GPU head waits for it; short 7g jobs keep arriving. Greedy runs every one
    # of them at once on GPU 1 (the head starves until they stop); EASY lets only those that end before the head's
    # start in.
    jobs = [job("hold", P7, 0, 1000), job("head", P7, 1, 100, ranks=2)]
    jobs += [job(f"s{i}", P7, 2 + 300 * i, 600) for i in range(6)]
    easy, me = run("fluid", jobs, gpus=2)
    greedy, mg = run("fluid", jobs, gpus=2, discipline="greedy")
    assert starts(easy)["head"] == 1000.0
    assert (starts(greedy)["head"] or 0) > 2000.0  # after every short job
    assert mg.by_size["multi"]["max_wait_s"] > me.by_size["multi"]["max_wait_s"]
    assert mg.max_wait_s > me.max_wait_s


def test_strong_drain_lays_an_idle_gpu_out_for_the_waiting_jobs_and_fills_the_rest() -> None:
    # One idle GPU holding a 7g. Drain-first-fit hands the 7g to the first 1g job and re-lays out nothing; strong
    # drain re-lays the GPU out for the waiting jobs' profiles (1g, 3g, 2g), so all three start at once.
    jobs = [job("a", P1, 0, 1000), job("b", P3, 0, 1000), job("c", P2, 0, 1000)]
    start = [Layout.of(H200, [(P7, 0)])]
    strong, _ = run("drain", jobs, layouts=start)
    assert all(s is not None and s < 20 for s in starts(strong).values())
    first, _ = run("drain-first-fit", jobs, layouts=start)
    assert [n for n, s in starts(first).items() if s is not None and s < 20] == ["a"]


def test_a_malleable_multi_gpu_job_starts_narrow_instead_of_draining_the_node_and_grows_back() -> None:
    # 3 GPUs; a long 7g holds GPU 0. An 8-hour, 3-GPU elastic job arrives: rigid, it waits 10 hours for GPU 0; it
    # pays to start it now on GPUs 1 and 2 at two thirds of its speed (even never grown back it would end sooner than
    # waiting, and the wait it is spared is over twice what it pays), and it grows to all three when GPU 0 frees.
    jobs = [job("hold", P7, 0, 36_000), job("big", P7, 10, 28_800, ranks=3, elastic=True)]
    rigid, _ = run("flex", jobs, gpus=3)
    narrow, m = run("flex", jobs, gpus=3, malleable=True)
    big = next(r for r in narrow.records if r.name == "big")
    assert next(r for r in rigid.records if r.name == "big").start_s == pytest.approx(36_000, abs=10)
    assert big.narrow_start and m.narrow_starts == 1 and big.resplits == 1  # grown once, when GPU 0 freed
    assert big.start_s is not None and big.start_s < 20
    done_narrow = 2 / 3 * (36_000 - big.start_s)  # two thirds of its speed until GPU 0 frees, full after re-splitting
    cost = REPLAY_SETTINGS.checkpoint_s + REPLAY_SETTINGS.restart_s
    assert big.end_s == pytest.approx(36_000 + cost + 28_800 - done_narrow, abs=30)
    assert m.by_size["multi"]["max_wait_s"] < 100


def test_a_malleable_job_does_not_start_at_half_speed_when_replay_s_margin_says_the_re_split_does_not_pay() -> None:
    # The same on 2 GPUs: half speed until GPU 0 frees spares 10 h of waiting for 5 h of slowdown and a re-split,
    # less than the twice its cost replay's gain margin asks: it waits, and starts whole.
    jobs = [job("hold", P7, 0, 36_000), job("big", P7, 10, 28_800, ranks=2, elastic=True)]
    narrow, m = run("flex", jobs, gpus=2, malleable=True)
    big = next(r for r in narrow.records if r.name == "big")
    assert not big.narrow_start and m.narrow_starts == 0 and big.start_s == pytest.approx(36_000, abs=10)


def test_malleable_baselines_start_narrow_on_whole_instances_of_their_own_profile() -> None:
    jobs = [job("hold", P7, 0, 36_000), job("big", P7, 10, 28_800, ranks=3, elastic=True)]
    for policy in ("static", "drain"):
        layouts = [Layout.of(H200, [(P7, 0)])] * 3 if policy == "static" else None
        result, _ = run(policy, jobs, gpus=3, layouts=layouts, malleable=True)
        big = next(r for r in result.records if r.name == "big")
        assert big.narrow_start and big.start_s is not None and big.start_s < 20, policy
        assert big.resplits == 1, policy


def test_job_larger_than_the_node_is_unplaceable_under_every_policy() -> None:
    jobs = [job("huge", P7, 0, 10, ranks=4), job("ok", P1, 0, 10)]
    for policy in ("fluid", "repack", "static", "drain", "drain-first-fit", "flex"):
        _, m = run(policy, jobs, gpus=2, layouts=[Layout.of(H200, [(P7, 0)])] * 2 if policy == "static" else None)
        assert (m.jobs_unplaceable, m.jobs_completed) == (1, 1), policy


def test_bound_is_the_larger_of_latest_finish_and_work_over_capacity() -> None:
    jobs = [job("a", P7, 0, 100), job("b", P7, 0, 100), job("c", P1, 50, 10)]
    m = lower_bound(jobs, 7)
    assert m.makespan_s == pytest.approx((700 + 700 + 10) / 7)
    assert m.mean_jct_s == pytest.approx(70.0)
    late = lower_bound([job("a", P1, 0, 10), job("b", P1, 500, 300)], 7)
    assert late.makespan_s == 800.0


def test_percentile_is_nearest_rank() -> None:
    assert percentile([1, 2, 3, 4], 95) == 4
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([], 95) == 0.0


def test_static_reports_the_best_eligible_candidate_and_skips_ineligible_ones() -> None:
    spec = parse_node_spec("h200x2")
    jobs = (job("a", P7, 0, 100, ranks=2), job("b", P1, 0, 100), job("c", P1, 0, 100))
    prep = Prepared(spec, jobs, {})
    result = run_policy(prep, "static", REPLAY_SETTINGS)
    assert result.metrics.extra["static_layout"] == "2x7g"  # only all-7g hosts the two-GPU job
    table = {row["layout"]: row["eligible"] for row in result.metrics.extra["static_candidates"]}
    assert table["2x7g"] and not table["2x7x1g"]


@st.composite
def job_lists(draw: st.DrawFn) -> list[TraceJob]:
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        profile = draw(st.sampled_from([P1, P2, P3, P4, P7]))
        ranks = draw(st.sampled_from([1, 1, 1, 2]))
        out.append(
            job(f"j{i:02}", profile, draw(st.integers(0, 500)), draw(st.integers(1, 400)), ranks, draw(st.booleans()))
        )
    return out


@settings(max_examples=25, deadline=None)
@given(jobs=job_lists(), discipline=st.sampled_from(["easy", "greedy"]), malleable=st.booleans())
def test_every_job_completes_no_faster_than_its_run_time_and_no_policy_beats_the_bound(
    jobs: list[TraceJob], discipline: Discipline, malleable: bool
) -> None:
    bound = lower_bound(jobs, 14)
    policies: tuple[Policy, ...] = ("fluid", "repack", "static", "drain", "drain-first-fit", "flex")
    for policy in policies:
        layouts = [Layout.of(H200, [(P7, 0)])] * 2 if policy == "static" else None
        result, m = run(policy, jobs, gpus=2, layouts=layouts, discipline=discipline, malleable=malleable)
        assert m.jobs_completed + m.jobs_unplaceable == len(jobs)
        for rec, j in zip(
            sorted(result.records, key=lambda r: r.name), sorted(jobs, key=lambda j: j.name), strict=True
        ):
            assert rec.start_s is not None and rec.end_s is not None
            assert rec.start_s >= j.arrival_s
            assert rec.end_s - rec.arrival_s >= j.runtime_s - 1e-6
        assert m.makespan_s >= bound.makespan_s - 1e-6, policy
        assert m.mean_jct_s >= bound.mean_jct_s - 1e-6, policy


@settings(max_examples=15, deadline=None)
@given(jobs=job_lists())
def test_the_same_jobs_give_the_same_replay(jobs: list[TraceJob]) -> None:
    first, _ = run("flex", jobs, gpus=2)
    again, _ = run("flex", [replace(j) for j in jobs], gpus=2)
    assert first == again
