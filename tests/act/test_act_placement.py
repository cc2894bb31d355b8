"""Where operator moves put a job, and the plans they make; plus the journal's write-ahead contract."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flexmig.act.journal import Journal, JournalError, StepEvent
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import choose_targets, make_room, move_plan, start_plan
from flexmig.act.planview import pending_requests, running_jobs
from flexmig.act.records import JobRecord, Slot
from flexmig.errors import PlanRejectedError
from flexmig.jobspec import JobPolicy, JobSpec, parse_job_spec
from flexmig.mig import H200
from flexmig.nvml.types import GpuInfo, GpuInstanceInfo, Inventory, MigDeviceInfo, ProcessInfo
from flexmig.plan.types import CreateInstance, DestroyInstance, MigrateJob, PlannerSettings, ResplitJob, StartJob

SETTINGS = PlannerSettings()


def view(*instances: tuple[str, int, tuple[int, ...] | None], lost: bool = False) -> NodeView:
    """GPU 0, an H200, with (profile, start, pids) instances (pids None: NVML does not list them)."""
    gis, devs = [], []
    for n, (name, start, pids) in enumerate(instances):
        p = H200.profile(name)
        gis.append(
            GpuInstanceInfo(id=n + 1, profile_id=p.profile_id, profile_name=name, start=start, size=p.memory_slices)
        )
        procs = None if pids is None else tuple(ProcessInfo(pid, None) for pid in pids)
        devs.append(MigDeviceInfo(n, f"MIG-{n}", n + 1, 0, None, None, procs))
    gpu = GpuInfo(0, "GPU-0", H200.name, None, True, True, tuple(gis), tuple(devs), lost=lost)
    return NodeView.of(Inventory("570", "12", (gpu,)))


def keys(slots: list[Slot]) -> list[tuple[int, int]]:
    return [s.key for s in slots]


def test_free_existing_instances_come_before_new_ones() -> None:
    v = view(("1g.18gb", 3, ()), ("1g.18gb", 5, ()))
    assert keys(choose_targets(v, "1g.18gb", 3, held={})) == [(0, 3), (0, 5), (0, 0)]


def test_instances_held_or_running_foreign_processes_are_never_chosen() -> None:
    v = view(("1g.18gb", 0, ()), ("1g.18gb", 1, (4242,)), ("1g.18gb", 2, ()))
    assert keys(choose_targets(v, "1g.18gb", 2, held={(0, 0): "other"})) == [(0, 2), (0, 3)]


def test_a_resplit_keeps_the_instances_it_has_and_adds_more() -> None:
    v = view(("1g.18gb", 4, (1,)), ("1g.18gb", 5, (2,)))
    own = [Slot(0, 4, "1g.18gb"), Slot(0, 5, "1g.18gb")]
    assert keys(choose_targets(v, "1g.18gb", 3, held={}, own=own, keep_own=True)) == [(0, 4), (0, 5), (0, 0)]


def test_when_nothing_else_fits_new_instances_take_the_place_of_the_jobs_own() -> None:
    v = view(("1g.18gb", 0, (1,)), ("1g.18gb", 1, (2,)), ("1g.18gb", 2, ()), ("1g.18gb", 3, ()), ("3g.71gb", 4, ()))
    own = [Slot(0, 0, "1g.18gb"), Slot(0, 1, "1g.18gb")]
    held = {(0, 2): "a", (0, 3): "b", (0, 4): "c"}
    targets = choose_targets(v, "2g.35gb", 1, held=held, own=own)
    assert keys(targets) == [(0, 0)]
    plan = move_plan(v, "j", own, targets, SETTINGS, resplit=True, reason="grow")
    assert [type(a) for a in plan.actions] == [ResplitJob], "created and destroyed inside the move"


def test_no_room_is_refused_with_the_count_found() -> None:
    v = view(("7g.141gb", 0, (9,)))
    with pytest.raises(PlanRejectedError, match=r"no room for 2 x 1g\.18gb: found 0"):
        choose_targets(v, "1g.18gb", 2, held={(0, 0): "big"})


def test_a_lost_gpu_hosts_nothing() -> None:
    with pytest.raises(PlanRejectedError):
        choose_targets(view(lost=True), "1g.18gb", 1, held={})


def test_a_migration_plan_creates_targets_first_and_destroys_the_sources_last() -> None:
    v = view(("1g.18gb", 0, (1,)), ("1g.18gb", 1, (2,)))
    own = [Slot(0, 0, "1g.18gb"), Slot(0, 1, "1g.18gb")]
    targets = choose_targets(v, "1g.18gb", 2, held={}, own=own)
    plan = move_plan(v, "j", own, targets, SETTINGS, resplit=False, reason="op")
    kinds = [(type(a).__name__, getattr(a, "start", None)) for a in plan.actions]
    assert kinds == [
        ("CreateInstance", 2),
        ("CreateInstance", 3),
        ("MigrateJob", None),
        ("DestroyInstance", 0),
        ("DestroyInstance", 1),
    ]
    move = plan.actions[2]
    assert isinstance(move, MigrateJob) and [i.key for i in move.to_instances] == [(0, 2), (0, 3)]


def test_a_start_plan_creates_only_what_is_missing() -> None:
    v = view(("1g.18gb", 0, ()))
    plan = start_plan(v, "j", [Slot(0, 0, "1g.18gb"), Slot(0, 1, "1g.18gb")], SETTINGS)
    assert [type(a) for a in plan.actions] == [CreateInstance, StartJob]
    assert not any(isinstance(a, DestroyInstance) for a in plan.actions)


# ------------------------------------------------------------------------------------------- make room
FULL = (("1g.18gb", 0, (1,)), ("1g.18gb", 1, (2,)), ("1g.18gb", 2, (3,)), ("1g.18gb", 3, (4,)))
HELD = {(0, 1): "a", (0, 2): "b", (0, 3): "c"}
OWN = [Slot(0, 0, "1g.18gb")]


def test_making_room_destroys_an_idle_instance_in_the_way_first() -> None:
    v = view(*FULL, ("3g.71gb", 4, ()))
    with pytest.raises(PlanRejectedError):
        choose_targets(v, "2g.35gb", 1, held=HELD, own=OWN)
    targets, clear = make_room(v, "2g.35gb", 1, SETTINGS, held=HELD, own=OWN)
    assert keys(targets) == [(0, 4)] and clear == [Slot(0, 4, "3g.71gb")]
    plan = move_plan(v, "j", OWN, targets, SETTINGS, resplit=False, reason="op", clear=clear)
    kinds = [(type(a).__name__, getattr(a, "start", None)) for a in plan.actions]
    assert kinds == [("DestroyInstance", 4), ("CreateInstance", 4), ("MigrateJob", None), ("DestroyInstance", 0)]


@pytest.mark.parametrize(
    "big",
    [("3g.71gb", 4, (4242,)), ("3g.71gb", 4, None)],
    ids=["runs a process", "NVML lists no processes"],
)
def test_making_room_never_destroys_an_instance_that_may_run_something(
    big: tuple[str, int, tuple[int, ...] | None],
) -> None:
    v = view(*FULL, big)
    with pytest.raises(PlanRejectedError, match="even with every idle instance destroyed"):
        make_room(v, "2g.35gb", 1, SETTINGS, held=HELD, own=OWN)


def test_making_room_never_destroys_an_instance_a_job_holds() -> None:
    v = view(*FULL, ("3g.71gb", 4, ()))
    with pytest.raises(PlanRejectedError):
        make_room(v, "2g.35gb", 1, SETTINGS, held={**HELD, (0, 4): "big"}, own=OWN)


def test_a_start_plan_clears_the_way_before_it_creates() -> None:
    v = view(("3g.71gb", 0, ()), ("3g.71gb", 4, (9,)))
    targets, clear = make_room(v, "1g.18gb", 2, SETTINGS, held={})
    plan = start_plan(v, "j", targets, SETTINGS, clear=clear)
    assert [type(a) for a in plan.actions] == [DestroyInstance, CreateInstance, CreateInstance, StartJob]
    assert all(t.gpu == 0 and t.start < 4 for t in targets)


# ---------------------------------------------------------------------------------------------- journal
def test_the_journal_is_sqlite_in_wal_mode_and_owner_only(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    j.close()
    db = sqlite3.connect(tmp_path / "j.sqlite3")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert (tmp_path / "j.sqlite3").stat().st_mode & 0o777 == 0o600


def test_each_step_is_committed_as_intent_before_it_runs_and_as_done_after(tmp_path: Path) -> None:
    seen: list[tuple[str, str, int]] = []
    j = Journal(tmp_path / "j.sqlite3", on_step=lambda e: seen.append((e.phase, e.step, e.count)))
    _, (aid,) = j.begin_plan("test", [("migrate", "job", {"reason": "r"})])
    sid = j.step_intent(aid, "migrate", "request", {"signal": "SIGUSR1"})
    other = sqlite3.connect(tmp_path / "j.sqlite3")  # another process's view: the intent is already on disk
    assert other.execute("SELECT name, state FROM steps").fetchall() == [("request", "intent")]
    j.step_done(sid, "migrate", {"pids": [1]})
    assert other.execute("SELECT state, result FROM steps").fetchall() == [("done", '{"pids":[1]}')]
    assert seen == [("intent", "request", 1), ("done", "request", 2)]
    assert j.unfinished_plans() == [1]


def test_a_journal_from_another_schema_version_is_refused(tmp_path: Path) -> None:
    Journal(tmp_path / "j.sqlite3").close()
    db = sqlite3.connect(tmp_path / "j.sqlite3")
    db.execute("UPDATE meta SET value='99' WHERE key='schema'")
    db.commit()
    with pytest.raises(JournalError, match="journal schema 99"):
        Journal(tmp_path / "j.sqlite3")


def test_step_event_names_the_action_kind(tmp_path: Path) -> None:
    got: list[StepEvent] = []
    j = Journal(tmp_path / "j.sqlite3", on_step=got.append)
    _, (aid,) = j.begin_plan("t", [("create_instance", None, {})])
    j.step_failed_with(j.step_intent(aid, "create_instance", "create:0@1", {}), "create_instance", "boom")
    assert [(e.action_kind, e.phase) for e in got] == [("create_instance", "intent"), ("create_instance", "failed")]


# --------------------------------------------------------------------------------------- planner's view
def test_job_records_become_the_planners_running_jobs_and_queue(tmp_path: Path) -> None:

    def spec(name: str, need: str) -> JobSpec:
        text = f'name = "{name}"\nargv = ["/bin/true"]\nuser = "root"\nworking_dir = "{tmp_path}"\n'
        text += f'checkpoint_dir = "c"\n[ranks]\nmin = 1\nmax = 4\nstart = 2\n[need]\n{need}\n'
        return parse_job_spec(text, JobPolicy((tmp_path,), check_permissions=False))

    run = JobRecord("a", "u1", spec("a", 'profile = "1g.18gb"'), "running", 1, (Slot(0, 3, "1g.18gb"),))
    late = JobRecord("b", "u2", spec("b", "memory_gib = 20"), "pending", submitted_s=5.0)
    early = JobRecord("c", "u3", spec("c", "compute_slices = 2"), "pending", submitted_s=1.0)
    (r,) = running_jobs([run, late, early], H200, {"a": 42.0})
    assert r.name == "a" and [i.key for i in r.instances] == [(0, 3)] and r.last_moved_s == 42.0
    assert (r.nominal.ranks, r.nominal.min_ranks, r.nominal.max_ranks) == (2, 1, 4)
    assert r.nominal.need.profile == "1g.18gb" and r.nominal.rank_memory_mib == H200.profile("1g.18gb").memory_mib
    queue = pending_requests([run, late, early], H200)
    assert [q.name for q in queue] == ["c", "b"]
    assert (queue[1].need.memory_mib, queue[0].need.compute_slices) == (20480, 2)


def test_a_job_that_states_its_run_time_tells_the_planner_how_long_it_has_left(tmp_path: Path) -> None:
    def spec(name: str, runtime: str) -> JobSpec:
        text = f'name = "{name}"\nargv = ["/bin/true"]\nuser = "root"\nworking_dir = "{tmp_path}"\n'
        text += f'checkpoint_dir = "c"\n{runtime}[need]\nprofile = "1g.18gb"\n'
        return parse_job_spec(text, JobPolicy((tmp_path,), check_permissions=False))

    timed = JobRecord("timed", "u1", spec("timed", "runtime_s = 80\n"), "running", 1, (Slot(0, 0, "1g.18gb"),))
    vague = JobRecord("vague", "u2", spec("vague", ""), "running", 1, (Slot(0, 1, "1g.18gb"),))
    waiting = JobRecord("next", "u3", spec("next", "runtime_s = 50\n"), "pending", submitted_s=1.0)
    started = {"timed": 1000.0, "vague": 1000.0}
    a, b = running_jobs([timed, vague, waiting], H200, started_s=started, now_s=1030.0)
    assert (a.remaining_s, a.nominal.expected_runtime_s) == (50.0, 80.0)
    assert (b.remaining_s, b.nominal.expected_runtime_s) == (None, None)  # unknown: the planner assumes a long wait
    (late,) = running_jobs([timed], H200, started_s=started, now_s=1100.0)
    assert late.remaining_s == 0.0  # overdue: it could end any moment
    (queued,) = pending_requests([timed, vague, waiting], H200)
    assert queued.expected_runtime_s == 50.0
