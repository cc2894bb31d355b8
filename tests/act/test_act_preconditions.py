"""The rules an action must pass before it starts, on one view of the node (pure: no NVML, no processes).

GPU 0 is an H200: 3g.71gb takes memory slices 0-3, 2g.35gb 4-5, 1g.18gb one slice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flexmig.act.nodeview import InstanceView, NodeView
from flexmig.act.preconditions import (
    check_destroy,
    check_movable,
    check_move_targets,
    check_start_targets,
    check_startable,
    layout_changes,
    overlap,
)
from flexmig.act.records import JobRecord, JobState, Slot
from flexmig.act.steps import Refused
from flexmig.jobspec import JobPolicy, parse_job_spec
from flexmig.mig import H200

OWN_PID, FOREIGN_PID = 100, 999


def node(*instances: tuple[str, int, frozenset[int] | None], lost: frozenset[int] = frozenset()) -> NodeView:
    """GPU 0 with (profile, start, pids) instances; pids None: NVML would not list them."""
    views = tuple(
        InstanceView(0, start, profile, gi_id=n + 1, uuid=f"MIG-{n}", pids=pids)
        for n, (profile, start, pids) in enumerate(instances)
    )
    return NodeView(views, ((0, H200),), lost)


def job(tmp_path: Path, state: JobState, *slots: Slot) -> JobRecord:
    text = f'name = "train"\nargv = ["/bin/true"]\nuser = "root"\nworking_dir = "{tmp_path}"\ncheckpoint_dir = "c"\n'
    text += '[ranks]\nmin = 1\nmax = 4\n[need]\nprofile = "1g.18gb"\n'
    spec = parse_job_spec(text, JobPolicy((tmp_path,), check_permissions=False))
    return JobRecord("train", "uid-1", spec, state, 1, slots)


S3, S2, S1 = Slot(0, 0, "3g.71gb"), Slot(0, 4, "2g.35gb"), Slot(0, 6, "1g.18gb")


def test_instances_overlap_only_where_they_share_a_memory_slice_of_one_gpu() -> None:
    assert overlap(S3, Slot(0, 2, "1g.18gb"))
    assert not overlap(S3, S2), "slices 0-3 and 4-5 touch but do not overlap"
    assert not overlap(S3, Slot(1, 0, "3g.71gb")), "another GPU"
    assert overlap(Slot(0, 0, "no-such-profile"), S1), "an unknown profile counts as 8 slices from its start"


def test_a_standalone_destroy_never_takes_a_running_jobs_instance() -> None:
    with pytest.raises(Refused, match=r"gpu0:2g.35gb@4 is held by job other"):
        check_destroy(S2, {S2.key: "other"})
    check_destroy(S1, {S2.key: "other"})


def test_a_running_job_is_not_started_again(tmp_path: Path) -> None:
    with pytest.raises(Refused, match="job train is already running"):
        check_startable(job(tmp_path, "running", S1))
    check_startable(job(tmp_path, "stopped"))


def test_a_job_starts_only_on_idle_existing_targets_no_other_job_holds(tmp_path: Path) -> None:
    rec = job(tmp_path, "pending")
    idle = node(("1g.18gb", 6, frozenset()))
    check_start_targets(rec, [S1], idle, {})
    with pytest.raises(Refused, match=r"target gpu0:2g.35gb@4 does not exist"):
        check_start_targets(rec, [S2], idle, {})
    with pytest.raises(Refused, match="is held by job other"):
        check_start_targets(rec, [S1], idle, {S1.key: "other"})
    with pytest.raises(Refused, match=rf"runs processes of no registered job: \[{FOREIGN_PID}\]"):
        check_start_targets(rec, [S1], node(("1g.18gb", 6, frozenset({FOREIGN_PID}))), {})
    with pytest.raises(Refused, match="runs processes of no registered job"):
        check_start_targets(rec, [S1], node(("1g.18gb", 6, None)), {})
    with pytest.raises(Refused, match="GPU 0 is lost"):
        check_start_targets(rec, [S1], node(("1g.18gb", 6, frozenset()), lost=frozenset({0})), {})


def test_a_job_moves_only_while_running_with_all_its_ranks_from_where_it_runs(tmp_path: Path) -> None:
    rec = job(tmp_path, "running", S1)
    check_movable(rec, [S1], [S2], alive=1)
    with pytest.raises(Refused, match="job train is stopped, not running"):
        check_movable(job(tmp_path, "stopped", S1), [S1], [S2], alive=0)
    with pytest.raises(Refused, match="not on the plan's source instances"):
        check_movable(rec, [S2], [S1], alive=1)
    with pytest.raises(Refused, match="does not have all its ranks running"):
        check_movable(rec, [S1], [S2], alive=0)
    with pytest.raises(Refused, match="no target instances"):
        check_movable(rec, [S1], [], alive=1)


def test_a_move_allows_the_jobs_own_processes_and_no_others(tmp_path: Path) -> None:
    rec = job(tmp_path, "running", S1)
    mine = {OWN_PID}
    check_move_targets(rec, [S1], [S2], node(("1g.18gb", 6, frozenset(mine))), {}, mine=mine)
    with pytest.raises(Refused, match=rf"gpu0:1g.18gb@6 runs processes of no registered job: \[{FOREIGN_PID}\]"):
        check_move_targets(rec, [S1], [S2], node(("1g.18gb", 6, frozenset({OWN_PID, FOREIGN_PID}))), {}, mine=mine)
    busy_target = node(("1g.18gb", 6, frozenset(mine)), ("2g.35gb", 4, frozenset({FOREIGN_PID})))
    with pytest.raises(Refused, match=r"target gpu0:2g.35gb@4 runs processes of no registered job"):
        check_move_targets(rec, [S1], [S2], busy_target, {}, mine=mine)
    with pytest.raises(Refused, match=r"target gpu0:2g.35gb@4 is held by job other"):
        check_move_targets(rec, [S1], [S2], node(("1g.18gb", 6, frozenset(mine))), {S2.key: "other"}, mine=mine)


def test_a_missing_target_must_fit_once_the_jobs_overlapping_sources_are_gone(tmp_path: Path) -> None:
    rec = job(tmp_path, "running", S3)
    whole = Slot(0, 0, "7g.141gb")
    check_move_targets(rec, [S3], [whole], node(("3g.71gb", 0, frozenset())), {}, mine=set())
    crowded = node(("3g.71gb", 0, frozenset()), ("1g.18gb", 6, frozenset()))
    with pytest.raises(Refused, match=r"cannot create gpu0:7g.141gb@0: memory slice 6 is already held"):
        check_move_targets(rec, [S3], [whole], crowded, {}, mine=set())
    with pytest.raises(Refused, match=r"target gpu0:1g.18gb@6 is occupied by gpu0:2g.35gb@6"):
        check_move_targets(
            rec, [S3], [S1], node(("3g.71gb", 0, frozenset()), ("2g.35gb", 6, frozenset())), {}, mine=set()
        )


def test_a_move_destroys_only_the_sources_its_missing_targets_overlap() -> None:
    view = node(("3g.71gb", 0, frozenset()), ("1g.18gb", 6, frozenset()))
    assert layout_changes(view, [S3, S1], [Slot(0, 0, "4g.71gb"), S1]) == ([S3], [Slot(0, 0, "4g.71gb")])
    assert layout_changes(view, [S3], [S1]) == ([], []), "a target that exists is used as it is"
