"""Invariants of every plan, over random nodes, jobs and queues (hypothesis)."""

import dataclasses
import re

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flexmig.errors import PlanRejectedError
from flexmig.mig import H200, Layout
from flexmig.plan import (
    Instance,
    JobRequest,
    MigrateJob,
    NodeState,
    Planner,
    PlannerSettings,
    RankNeed,
    ResplitJob,
    RunningJob,
    StartJob,
    check_state,
    validate_plan,
)
from flexmig.plan.narrow import narrow_case

PLAIN = H200.plain_profiles
P4 = H200.profile("4g.71gb")
P7 = H200.profile("7g.141gb")


@st.composite
def node_states(draw: st.DrawFn) -> NodeState:
    gpus = draw(st.integers(1, 4))
    layouts = []
    for _ in range(gpus):
        layout = Layout.empty(H200)
        items = st.lists(st.tuples(st.integers(0, len(PLAIN) - 1), st.integers(0, 7)), min_size=1, max_size=7)
        for prof_i, start in draw(items):
            if layout.can_place(PLAIN[prof_i], start):
                layout = layout.place(PLAIN[prof_i], start)
        layouts.append(layout)
    now = draw(st.floats(0, 5000))
    instances = [Instance(g, i.start, i.profile) for g, lay in enumerate(layouts) for i in lay]
    running, blocked = [], set()
    n = 0
    pool = list(instances)
    while pool:
        inst = pool.pop(0)
        what = draw(st.sampled_from(["job", "job", "job", "job", "free", "blocked"]))
        if what == "free":
            continue
        if what == "blocked":
            blocked.add(inst.key)
            continue
        group = [inst]
        mates = [i for i in pool if i.profile == inst.profile]
        extra = draw(st.integers(0, min(2, len(mates))))
        for mate in mates[:extra]:
            pool.remove(mate)
            group.append(mate)
        elastic = draw(st.booleans())
        total = len(group) * inst.profile.compute_slices
        if elastic and total in (1, 2, 3, 4, 7) and len(group) > 1:
            nominal_profile, ranks = H200.profile_for_slices(total), 1  # running spread, nominally one instance
        else:
            nominal_profile, ranks = inst.profile, len(group)
        nominal = JobRequest(
            f"r{n}",
            RankNeed(profile=nominal_profile.name),
            ranks=ranks,
            min_ranks=1 if elastic else ranks,
            max_ranks=7 * ranks if elastic else ranks,
            expected_runtime_s=draw(st.floats(10, 20000)),
            malleable=elastic and draw(st.booleans()),
        )
        running.append(
            RunningJob(
                f"r{n}",
                tuple(group),
                nominal,
                movable=draw(st.booleans()),
                last_moved_s=draw(st.floats(-5000, now)),
                remaining_s=draw(st.one_of(st.none(), st.floats(1, 20000))),
            )
        )
        n += 1
    pending = []
    for k in range(draw(st.integers(0, 8))):
        profile = draw(st.sampled_from((*PLAIN, P7, P7, P4)))  # big requests are the ones that need room made
        ranks = draw(st.integers(1, 2))
        elastic = draw(st.booleans())
        pending.append(
            JobRequest(
                f"p{k}",
                RankNeed(profile=profile.name),
                ranks=ranks,
                min_ranks=1 if elastic else ranks,
                max_ranks=7 * ranks if elastic else ranks,
                submitted_s=draw(st.floats(0, now)),
                expected_runtime_s=draw(st.one_of(st.none(), st.floats(10, 20000))),
                malleable=elastic and draw(st.booleans()),
            )
        )
    return NodeState(H200, tuple(layouts), tuple(running), tuple(pending), now, frozenset(blocked))


@st.composite
def crowded_states(draw: st.DrawFn) -> NodeState:
    """Small movable jobs scattered over every GPU and a rigid 7g waiting: the planner has to make room."""
    gpus = draw(st.integers(2, 4))
    small = [H200.profile("1g.18gb"), H200.profile("2g.35gb")]
    layouts, running = [], []
    for g in range(gpus):
        layout = Layout.empty(H200)
        for prof_i, start in draw(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 6)), min_size=1, max_size=3)):
            profile = small[prof_i]
            if layout.can_place(profile, start):
                layout = layout.place(profile, start)
                name = f"s{g}-{start}"
                nominal = JobRequest(name, RankNeed(profile=profile.name), expected_runtime_s=5000.0)
                running.append(
                    RunningJob(
                        name,
                        (Instance(g, start, profile),),
                        nominal,
                        movable=draw(st.booleans()),
                        last_moved_s=-10_000.0,
                        remaining_s=draw(st.floats(10, 50_000)),
                    )
                )
        layouts.append(layout)
    head = JobRequest("head", RankNeed(profile=P7.name), expected_runtime_s=3000.0)
    more = [JobRequest(f"q{k}", RankNeed(profile=P4.name), submitted_s=k + 1.0) for k in range(draw(st.integers(0, 2)))]
    return NodeState(H200, tuple(layouts), tuple(running), (head, *more), 100.0)


planner_settings = st.builds(
    PlannerSettings,
    checkpoint_s=st.sampled_from([3.0, 20.0]),  # the daemon's measured costs and replay's large-model ones
    restart_s=st.sampled_from([6.0, 30.0]),
    reconfigure_s=st.sampled_from([2.0, 5.0]),
    settling_s=st.sampled_from([0.0, 600.0, 4000.0]),
    gain_margin=st.sampled_from([-0.5, 0.1, 1.0]),  # moves that gain 0.5, 1.1 and 2 times their cost
    resplit=st.booleans(),
    migrate=st.booleans(),
    repartition_busy=st.booleans(),
    malleable=st.booleans(),
    discipline=st.sampled_from(["easy", "greedy"]),
)

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid(state: NodeState) -> bool:
    """The generator can pair a job with instances of mixed profiles; such states are refused up front."""
    try:
        check_state(state)
    except PlanRejectedError:
        return False
    return True


@SETTINGS
@given(state=st.one_of(node_states(), crowded_states()), cfg=planner_settings)
def test_every_plan_replays_onto_valid_layouts_without_losing_or_duplicating_a_job(
    state: NodeState, cfg: PlannerSettings
) -> None:
    assume(_valid(state))
    plan = Planner(H200, cfg).plan(state)
    out = validate_plan(state, plan, cfg)  # refuses any invalid intermediate layout, loss or duplicate
    assert set(out.holds) >= {j.name for j in state.running}
    started = [a.job for a in plan.actions if isinstance(a, StartJob)]
    assert len(started) == len(set(started)) and set(started) <= {r.name for r in state.pending}


@SETTINGS
@given(state=st.one_of(node_states(), crowded_states()), cfg=planner_settings)
def test_unmovable_jobs_are_never_moved(state: NodeState, cfg: PlannerSettings) -> None:
    assume(_valid(state))
    plan = Planner(H200, cfg).plan(state)
    pinned = {j.name for j in state.running if not j.movable}
    moved = {a.job for a in plan.actions if isinstance(a, MigrateJob | ResplitJob)}
    assert not moved & pinned
    out = validate_plan(state, plan, cfg)
    for job in state.running:
        if not job.movable:
            assert out.holds[job.name] == job.instances


@SETTINGS
@given(state=st.one_of(node_states(), crowded_states()), cfg=planner_settings)
def test_no_job_moves_within_the_settling_time(state: NodeState, cfg: PlannerSettings) -> None:
    assume(_valid(state))
    plan = Planner(H200, cfg).plan(state)
    recent = {
        j.name for j in state.running if j.last_moved_s is not None and state.now_s - j.last_moved_s < cfg.settling_s
    }
    assert not recent & {a.job for a in plan.actions if isinstance(a, MigrateJob | ResplitJob)}


@SETTINGS
@given(state=st.one_of(node_states(), crowded_states()), cfg=planner_settings)
def test_switched_off_mechanisms_stay_off(state: NodeState, cfg: PlannerSettings) -> None:
    assume(_valid(state))
    plan = Planner(H200, cfg).plan(state)
    if not cfg.migrate:
        assert not any(isinstance(a, MigrateJob) for a in plan.actions)
    if not cfg.resplit:  # a malleable job's own ranks taken or given back, its profile kept: malleability
        running = {j.name: j for j in state.running}
        for a in plan.actions:
            if isinstance(a, ResplitJob):
                job = running[a.job]
                assert cfg.malleable and job.nominal.malleable and a.profile == job.profile, a


@SETTINGS
@given(state=st.one_of(node_states(), crowded_states()), cfg=planner_settings)
def test_blocked_instances_survive_every_plan(state: NodeState, cfg: PlannerSettings) -> None:
    assume(_valid(state))
    out = validate_plan(state, Planner(H200, cfg).plan(state), cfg)
    for g, s in state.blocked:
        assert out.layouts[g].at(s) is not None


@settings(max_examples=40, deadline=None)
@given(state=st.one_of(node_states(), crowded_states()), cfg=planner_settings)
def test_the_same_state_always_gives_the_same_plan(state: NodeState, cfg: PlannerSettings) -> None:
    assume(_valid(state))
    assert Planner(H200, cfg).plan(state) == Planner(H200, cfg).plan(state)


# ------------------------------------------------------------------------- malleable decisions (issue 23)
NARROW = re.compile(r"spares ~(\d+)s of waiting for ~(\d+)s of slowdown and growing back, ~(\d+)s if it never grows")
SHRINK = re.compile(r"after [^:]*shrinking [^:]*: spares ~(\d+)s of waiting for (\d+)s of moves")
GROW = re.compile(r"^grow .*: saves ~(\d+)s for (\d+)s of downtime")


@st.composite
def malleable_states(draw: st.DrawFn) -> NodeState:
    """Whole GPUs busy for a while or free, jobs running narrow that could grow back, and malleable jobs waiting
    for several GPUs: the planner weighs narrow starts, narrow reservations, shrinks and growth."""
    gpus = draw(st.integers(2, 4))
    layouts, running, n = [], [], 0
    for g in range(gpus):
        kind = draw(st.sampled_from(["busy", "busy", "free", "narrow", "small"]))
        if kind == "free":
            layouts.append(Layout.empty(H200))
            continue
        if kind == "small":
            layout = Layout.empty(H200).place(H200.profile("3g.71gb"), 4).place(H200.profile("4g.71gb"), 0)
            layouts.append(layout)
            for start, prof in ((0, "4g.71gb"), (4, "3g.71gb")):
                req = JobRequest(f"r{n}", RankNeed(profile=prof), expected_runtime_s=draw(st.floats(600, 50_000)))
                running.append(
                    RunningJob(
                        f"r{n}",
                        (Instance(g, start, H200.profile(prof)),),
                        req,
                        last_moved_s=-10_000.0,
                        remaining_s=draw(st.floats(60, 50_000)),
                    )
                )
                n += 1
            continue
        layouts.append(Layout.empty(H200).place(P7, 0))
        ranks = 2 if kind == "narrow" else 1
        req = JobRequest(
            f"r{n}",
            RankNeed(profile=P7.name),
            ranks=ranks,
            min_ranks=1,
            max_ranks=7 * ranks,
            expected_runtime_s=draw(st.floats(600, 100_000)),
            malleable=kind == "narrow",
        )
        running.append(
            RunningJob(
                f"r{n}",
                (Instance(g, 0, P7),),
                req,
                last_moved_s=draw(st.floats(-20_000, 0)),
                remaining_s=draw(st.floats(60, 100_000)),
            )
        )
        n += 1
    pending = [
        JobRequest(
            f"p{k}",
            RankNeed(profile=draw(st.sampled_from([P7.name, P7.name, "3g.71gb", "1g.18gb"]))),
            ranks=(ranks := draw(st.integers(1, 3))),
            min_ranks=1,
            max_ranks=7 * ranks,
            submitted_s=float(k),
            expected_runtime_s=draw(st.one_of(st.none(), st.floats(60, 100_000))),
            malleable=draw(st.sampled_from([True, True, False])),
        )
        for k in range(draw(st.integers(1, 4)))
    ]
    return NodeState(H200, tuple(layouts), tuple(running), tuple(pending), 1000.0)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=st.one_of(malleable_states(), malleable_states(), node_states(), crowded_states()),
    cfg=st.builds(dataclasses.replace, planner_settings, malleable=st.just(True), discipline=st.just("easy"))
    | planner_settings,
)
def test_every_narrow_start_shrink_and_growth_gains_at_least_the_margin_times_its_cost(
    state: NodeState, cfg: PlannerSettings
) -> None:
    assume(_valid(state))
    plan = Planner(H200, cfg).plan(state)
    ratio = cfg.gain_ratio
    slack = 0.5 + 0.5 * abs(ratio)  # the reasons round to whole seconds
    for action in plan.actions:
        if isinstance(action, StartJob) and (m := NARROW.search(action.reason)):
            wait, expected, worst = (float(x) for x in m.groups())
            assert wait + 1.0 >= worst, f"may end later than waiting if it never grows: {action.reason}"
            assert wait + slack >= ratio * expected, action.reason
            continue
        shrink = SHRINK.search(action.reason) if isinstance(action, StartJob) else None
        grow = GROW.search(action.reason) if isinstance(action, ResplitJob) else None
        for m in (shrink, grow):
            if m is not None:
                gain, cost = (float(x) for x in m.groups())
                assert gain + slack >= ratio * cost, action.reason


def _narrow_end(runtime: float, speed: float, start: float, grow_at: float | None, move: float) -> float:
    """When a job started narrow at ``start`` ends if it grows back at ``grow_at`` (None: never), step by step."""
    if grow_at is None or speed * (grow_at - start) >= runtime:
        return start + runtime / speed
    return grow_at + move + (runtime - speed * (grow_at - start))


@settings(max_examples=300, deadline=None)
@given(
    runtime=st.floats(1, 200_000),
    speed=st.floats(0.05, 0.95),
    wait=st.floats(0, 500_000),
    settling=st.sampled_from([0.0, 300.0, 600.0]),
    move=st.floats(0, 100),
    margin=st.sampled_from([0.0, 0.1, 1.0]),
)
def test_a_narrow_start_is_never_taken_when_the_model_says_it_loses(
    runtime: float, speed: float, wait: float, settling: float, move: float, margin: float
) -> None:
    case = narrow_case(runtime, speed, start_s=100.0, nominal_s=100.0 + wait, settling_s=settling, move_cost_s=move)
    assert case is not None
    waiting_end = 100.0 + wait + runtime
    grown_end = _narrow_end(runtime, speed, 100.0, max(100.0 + wait, 100.0 + settling), move)
    stuck_end = _narrow_end(runtime, speed, 100.0, None, move)
    # the model's costs are what the job's own schedule gives, step by step
    assert abs((grown_end - (100.0 + runtime)) - case.expected_cost_s) <= 1e-6 * max(1.0, grown_end)
    assert abs((stuck_end - (100.0 + runtime)) - case.worst_cost_s) <= 1e-6 * max(1.0, stuck_end)
    if case.pays(1.0 + margin):
        assert stuck_end <= waiting_end + 1e-6 * waiting_end, "it never ends later than waiting, grown back or not"
        assert waiting_end - grown_end >= margin * case.expected_cost_s - 1e-6 * waiting_end
    faster = narrow_case(
        runtime, speed + 0.04, start_s=100.0, nominal_s=100.0 + wait, settling_s=settling, move_cost_s=move
    )
    assert faster is not None
    if case.pays(1.0 + margin):
        assert faster.pays(1.0 + margin), "what pays at one speed pays at a higher one"
