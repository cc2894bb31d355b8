"""Invariants of every plan, over random nodes, jobs and queues (hypothesis)."""

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
    if not cfg.resplit:
        assert not any(isinstance(a, ResplitJob) for a in plan.actions)


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
