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


def _requeued_order(back: bool) -> list[str]:
    """The waiting jobs in priority order after job0, moved at 10 s, is released at 20 s while job1 (submitted at
    5 s) waits."""
    sm = slurm_moves.sm
    jobs = [sm.Job(j, j.arrival_s) for j in slurm_moves.two_gpu_case()[:2]]
    jobs[1].submit_s = 5.0
    jobs[0].start_s, jobs[0].end_s = 0.0, 10.0
    st = sm.State((), jobs, t=20.0)
    mv = slurm_moves.Moves(requeue=[(20.0, jobs[0], 100.0)])
    slurm_moves._release(st, mv, back=back)
    return [j.name for j in st.pending()]


def test_a_moved_job_waits_again_behind_the_jobs_already_waiting_as_slurm_requeues_it() -> None:
    assert _requeued_order(back=True) == ["job1", "job0"]  # Slurm: the requeue's submit time, its age restarted
    assert _requeued_order(back=False) == ["job0", "job1"]  # --requeue kept: the model before


def test_the_7g_jobs_longest_wait_splits_into_behind_older_jobs_and_after() -> None:
    o = slurm_moves.run_case(slurm_moves.Case("mix", 3, 2, 2, True, 0.5, 2, 90))
    assert 0.0 <= o.seven_behind <= o.seven_longest
    alone = _two(moves=False)  # nothing older waits in the two-GPU case: the whole wait is after
    assert alone.seven_behind == 0.0 and alone.seven_longest > 1000.0
