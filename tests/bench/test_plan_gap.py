"""bench/plan_gap.py, flex's gap to the reference's ideal repacking by class: room among unmoved instances is found
exactly, a start that only a repack allows is class (a), and the classes add up to the difference in mean JCT."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.run import ReplayConfig, prepare
from support.heldout import heldout_trace
from support.refcheck import ref_jobs
from support.refsim import RefJob, RefResult, simulate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import plan_gap  # type: ignore[import-not-found]  # noqa: E402


def test_room_is_found_around_instances_that_stay_and_refused_where_only_a_repack_has_it() -> None:
    gpus: list[list[tuple[int, str]]] = [[(4, "3g.71gb")], [(0, "4g.71gb")]]
    assert plan_gap.add_without_moving(gpus, ["7g.141gb"]) is None
    assert gpus == [[(4, "3g.71gb")], [(0, "4g.71gb")]]  # left as it was
    got = plan_gap.add_without_moving(gpus, ["4g.71gb"])
    assert got == [(0, (0, "4g.71gb"))]  # beside the 3g at 4, the only room
    assert plan_gap.add_without_moving([[], []], ["3g.71gb", "4g.71gb", "7g.141gb"]) is not None


def test_a_start_the_reference_made_by_moving_a_running_job_is_class_a() -> None:
    # Two GPUs: 4g and 3g jobs end up one on each GPU's side; a 7g then needs them moved onto one GPU.
    jobs = [
        RefJob("a", 0.0, 100.0, "4g.71gb"),
        RefJob("b", 1.0, 1000.0, "4g.71gb"),
        RefJob("c", 2.0, 1000.0, "3g.71gb"),
        RefJob("d", 3.0, 101.0, "3g.71gb"),
        RefJob("e", 105.0, 50.0, "7g.141gb"),
        RefJob("f", 160.0, 10.0, "1g.18gb"),
    ]
    ref = RefResult(
        start={j.name: j.arrival_s for j in jobs},
        end={j.name: j.arrival_s + j.runtime_s for j in jobs},
    )
    assert plan_gap.reference_moves(jobs, ref, 2) == {"e"}


def test_the_classes_add_up_to_the_difference_in_mean_jct(tmp_path: Path) -> None:
    prep = prepare(ReplayConfig(heldout_trace(tmp_path / "h.csv", 300), node="h200x8", load=0.9, seed=0))
    jobs = ref_jobs(prep)
    ref = simulate(jobs, "repack", prep.spec.count, "greedy", [], REPLAY_SETTINGS.reconfigure_s)
    flex, room = plan_gap.flex_probed(prep, replace(REPLAY_SETTINGS, discipline="greedy"), jobs, ref)
    gap = plan_gap.classify(jobs, ref, flex, room, plan_gap.reference_moves(jobs, ref, prep.spec.count))
    assert gap.n == len(flex)
    assert sum(gap.by_class.values()) == pytest.approx(gap.total_h, abs=1e-9)
    assert sum(gap.count.values()) == gap.n
    late = [n for n in flex if flex[n][0] > ref.start[n] + 1.0]
    assert sum(gap.count.get(c, 0) for c in plan_gap.CLASSES) == len(late)
    assert all(room.get(n) in {"room", "taken", "price", "placement", "full", "unknown"} for n in late)
