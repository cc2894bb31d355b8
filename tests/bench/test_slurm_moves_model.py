"""bench/slurm_moves.py, the model of moves under one Slurm node per MIG instance: the issue's two-GPU case moves
one job, not both, and the 7g starts within 120 s (without moves it waits for a 1g job's end); on a cluster's mix
every moved job starts again once per move and ends, no job is moved more than twice, and only hook jobs move."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import slurm_moves  # type: ignore[import-not-found]  # noqa: E402


def _two(moves: bool) -> slurm_moves.Outcome:
    return slurm_moves.run_case(slurm_moves.Case("two", 0, 1, 2, moves, 1.0, 2))


def _seven_wait(o: slurm_moves.Outcome) -> float:
    return float(o.seven_longest)


def test_the_two_gpu_case_moves_one_job_and_the_7g_starts_within_120_s() -> None:
    moved = _two(moves=True)
    assert sum(moved.moves.count.values()) == 1
    assert _seven_wait(moved) <= 120.0
    assert moved.resumed_once


def test_without_moves_the_7g_of_the_two_gpu_case_waits_for_a_1g_job_to_end() -> None:
    assert _seven_wait(_two(moves=False)) > 1000.0


def test_a_cluster_mix_moves_only_hook_jobs_at_most_twice_each_and_each_resumes_once() -> None:
    o = slurm_moves.run_case(slurm_moves.Case("mix", 3, 2, 2, True, 0.5, 2, 90))
    assert o.moved > 0
    assert o.most <= 2
    assert set(o.moves.count) <= o.hook
    assert o.resumed_once
    assert o.result.ran == 90
