"""bench/slurm_ideal.py, the yardsticks of the cluster mix: which sets of instances fit on some GPUs (against a
search that lays them out with flexmig's own Layout), the ideal rival's schedule (every job after its arrival, the
running set fitting at every start, no job later than the end of everything before it), and the tighter lower
bound (never above a real schedule's makespan, never below the packing term); and bench/slurm_moves.py's
``moves-own`` variant (a moved job's target only on its own host)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.slurm.moves import Blocked, Running, plan_moves

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import slurm_ideal  # type: ignore[import-not-found]  # noqa: E402
import slurm_moves  # type: ignore[import-not-found]  # noqa: E402
from slurm_mix import SLICES, MixJob  # type: ignore[import-not-found]  # noqa: E402

PROFILES: tuple[str, ...] = slurm_ideal.PROFILES


def _lays_out(counts: tuple[int, ...], gpus: int) -> bool:
    """Whether the instances of ``counts`` can be placed on ``gpus`` empty H200s (a search over placements)."""
    todo = [p for p, n in zip(PROFILES, counts, strict=True) for _ in range(n)]
    todo.sort(key=lambda p: -H200.profile(p).compute_slices)

    seen: set[tuple[int, tuple[str, ...]]] = set()

    def place(k: int, lays: list[Layout]) -> bool:
        if k == len(todo):
            return True
        key = (k, tuple(sorted(lay.spec() for lay in lays)))  # the GPUs are alike: a state once is enough
        if key in seen:
            return False
        seen.add(key)
        prof = H200.profile(todo[k])
        for g, lay in enumerate(lays):
            for start in prof.starts:
                if lay.can_place(prof, start) and place(k + 1, [*lays[:g], lay.place(prof, start), *lays[g + 1 :]]):
                    return True
        return False

    return place(0, [Layout.empty(H200)] * gpus)


@settings(max_examples=150, deadline=None)
@given(st.tuples(st.integers(0, 8), st.integers(0, 4), st.integers(0, 3), st.integers(0, 2)), st.integers(1, 2))
def test_a_set_of_instances_fits_exactly_when_it_can_be_laid_out(counts: tuple[int, ...], gpus: int) -> None:
    assert (counts in slurm_ideal.fits(gpus)) == _lays_out(counts, gpus)


def test_two_3g_fit_on_one_gpu_but_not_beside_a_1g() -> None:
    assert (0, 0, 2, 0) in slurm_ideal.fits(1)
    assert (1, 0, 2, 0) not in slurm_ideal.fits(1)
    assert (7, 0, 0, 1) in slurm_ideal.fits(2)
    assert (0, 0, 0, 3) not in slurm_ideal.fits(2)


_jobs = st.lists(
    st.tuples(st.floats(0, 300), st.sampled_from(PROFILES), st.floats(5, 120)), min_size=1, max_size=25
).map(lambda xs: [MixJob(k, round(a, 2), p, round(r, 2), 4) for k, (a, p, r) in enumerate(sorted(xs))])


def _running(jobs: list[MixJob], starts: dict[int, float], t: float) -> tuple[int, ...]:
    on = [j.profile for j in jobs if starts[j.index] <= t < starts[j.index] + j.runtime_s]
    return tuple(on.count(p) for p in PROFILES)


@settings(max_examples=60, deadline=None)
@given(_jobs, st.integers(1, 3))
def test_the_ideal_schedule_is_a_schedule_in_submission_order(jobs: list[MixJob], gpus: int) -> None:
    got = slurm_ideal.ideal(jobs, gpus)
    fits = slurm_ideal.fits(gpus)
    for j in jobs:
        s = got.starts[j.index]
        assert s >= j.arrival_s
        assert _running(jobs, got.starts, s) in fits  # what runs from each start on fits on the GPUs
        before = [k for k in jobs if k.index < j.index]
        latest = max((got.starts[k.index] + k.runtime_s for k in before), default=j.arrival_s)
        assert s <= max(j.arrival_s, latest)  # once everything before it has ended, it starts
    first = min(j.arrival_s for j in jobs)
    assert abs(got.makespan - (max(got.starts[j.index] + j.runtime_s for j in jobs) - first)) < 1e-9


@settings(max_examples=60, deadline=None)
@given(_jobs, st.integers(1, 3))
def test_the_tighter_bound_is_below_a_real_schedule_and_above_the_packing_term(jobs: list[MixJob], gpus: int) -> None:
    lb = slurm_ideal.lower_bound(jobs, gpus)
    assert lb <= slurm_ideal.ideal(jobs, gpus).makespan + 1e-9
    assert lb >= sum(SLICES[j.profile] * j.runtime_s for j in jobs) / (7 * gpus) - 1e-9


def test_the_tighter_bound_sees_a_late_burst() -> None:
    early = [MixJob(0, 0.0, "1g.18gb", 10.0, 1)]
    late = [MixJob(k, 100.0, "7g.141gb", 50.0, 1) for k in range(1, 5)]
    assert slurm_ideal.lower_bound(early + late, 2) == 100.0 + 4 * 50.0 / 2


def test_moves_own_finds_no_target_when_the_only_room_is_on_another_host() -> None:
    h0 = [Layout.of(H200, [("1g.18gb", 0)])]
    h1 = [Layout.of(H200, [("3g.71gb", 0)])]
    running = [
        Running("a", ("h0", 0, 0), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=12.5),
        Running("b", ("h1", 0, 0), "3g.71gb", hook=False, moves=0, remaining_s=3000.0, cost_s=12.5),
    ]
    asks = [Blocked("w", "7g.141gb", 60.0)]
    cluster = {"h0": h0, "h1": h1}
    anywhere = plan_moves(H200, cluster, running, asks)
    assert [(m.job, m.target[0]) for m in anywhere.moves] == [("a", "h1")]
    own = slurm_moves._own_host("w", cluster, running, asks, frozenset(), [], max_moves=2)
    assert own.moves == ()
