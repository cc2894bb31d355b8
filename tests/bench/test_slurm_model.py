"""bench/slurm_model.py on a node of several GPUs: one GPU gives the figures its docstring states, a round comes a
look after a job ends (on one GPU) or every interval, and a node of two GPUs runs every job of its scaled mix once,
on instances no other job holds, and re-registers only when the whole node is empty (Slurm 22.05)."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import slurm_model  # type: ignore[import-not-found]  # noqa: E402
from slurm_mix import mix  # type: ignore[import-not-found]  # noqa: E402


def test_one_gpu_gives_the_figures_the_module_docstring_states() -> None:
    # The module docstring's seed 24 under the merged policy ("2.5 runs"): 78 %, 1.36x, 19 re-registrations an hour.
    r = slurm_model.simulate(mix(24), slurm_model.policies()["2.5 runs"], gpus=1)
    assert (r.ran, round(100 * r.util_waiting), round(r.ratio, 2), round(r.reregs_per_h)) == (45, 78, 1.36, 19)
    assert r.state.reregistrations > 0 and r.per_change is not None and r.per_change > 0


def test_a_round_comes_at_the_first_look_after_a_job_ends_or_every_interval_without_looks() -> None:
    job = slurm_model.Job(mix(24)[0], 0.0, start_s=0.0, end_s=3.2)
    steps = [k * slurm_model.STEP_S for k in range(17)]  # 0 to 8 s
    looking = slurm_model.Rounds(0.0)
    at = [t for t in steps if looking.due(t, [job])]
    assert 4.0 in at and 3.5 not in at  # the end at 3.2 s is seen at the look at 4 s
    assert all(b - a <= slurm_model.ROUND_S for a, b in itertools.pairwise(at))
    assert all((t / slurm_model.PROBE_S).is_integer() for t in at)  # rounds come at looks
    interval = slurm_model.Rounds(0.0, probe=False)
    assert [t for t in steps if interval.due(t, [job])] == [0.0, 2.0, 4.0, 6.0, 8.0]


def _check(r: Any, jobs: int, gpus: int) -> None:
    assert r.ran == jobs, f"{r.ran} of {jobs} jobs ran"
    assert 0.0 <= r.util_waiting <= 1.0 and 0.0 <= r.closed_share <= 1.0
    st = r.state
    assert len(st.layouts) == gpus
    done = [j for j in st.jobs if j.start_s < math.inf]
    assert len(done) == jobs and all(j.end_s == pytest.approx(j.start_s + j.mix.runtime_s) for j in done)
    for a in done:  # one job an instance at a time (seats index the layouts of the time: jobs never span a change)
        same = [b.name for b in done if b is not a and b.seat == a.seat and b.start_s < a.end_s and a.start_s < b.end_s]
        assert a.seat >= 0 and not same, f"{a.name} shares its instance with {same}"
    changes = [t for t, text in st.log if text.startswith("re-register")]
    assert len(changes) == st.reregistrations
    for t in changes:  # the whole node re-registers: no job runs on any GPU then
        assert not [j.name for j in done if j.start_s <= t < j.end_s], f"a job ran through the change at {t} s"


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_job_of_the_scaled_mix_runs_once_on_a_node_of_gpus(gpus: int) -> None:
    jobs = mix(21, 45 * gpus)
    r = slurm_model.simulate(jobs, slurm_model.policies()["now"], gpus=gpus)
    _check(r, len(jobs), gpus)
    assert r.ratio >= 1.0  # never faster than the packing bound of the node's GPUs


def test_a_node_of_no_gpus_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="gpus"):
        slurm_model.simulate(mix(21), slurm_model.policies()["now"], gpus=0)


@pytest.mark.parametrize("gpus", [1, 2])
def test_one_node_per_instance_runs_every_job_once_on_its_own_instance_of_its_profile(gpus: int) -> None:
    """The design for Slurm 23.11+ (``instances``): every job runs once, on an instance of its profile that no other
    job holds meanwhile (the model refuses to destroy an instance a job runs on), never faster than the bound."""
    jobs = mix(21, 45 * gpus)
    r = slurm_model.simulate(jobs, slurm_model.policies()["instances"], gpus=gpus)
    assert r.ran == len(jobs) and r.ratio >= 1.0 and 0.0 <= r.closed_share <= 1.0
    done = [j for j in r.state.jobs if j.start_s < math.inf]
    for a in done:
        assert a.where is not None
        same = [b.name for b in done if b is not a and b.where == a.where
                and b.start_s < a.end_s and a.start_s < b.end_s]  # fmt: skip
        assert not same, f"{a.name} shares its instance with {same}"
    assert r.state.reregistrations > 0


def test_any_node_draws_which_free_instance_a_job_starts_on_and_still_runs_every_job_once() -> None:
    """``--any-node``: the same seed and draw give the same run; other draws start some job on another instance of
    its profile (Slurm's choice among idle nodes), and every job still runs once on an instance of its own."""
    jobs = mix(24)
    pol = slurm_model.policies()["instances"]
    first = slurm_model.simulate(jobs, pol)
    runs = [slurm_model.simulate(jobs, pol, pick=slurm_model._pick(24, d)) for d in range(1, 6)]
    again = slurm_model.simulate(jobs, pol, pick=slurm_model._pick(24, 1))
    assert [j.start_s for j in again.state.jobs] == [j.start_s for j in runs[0].state.jobs]
    placed = {tuple(j.where for j in r.state.jobs) for r in runs}
    assert len(placed | {tuple(j.where for j in first.state.jobs)}) > 1
    for r in runs:
        assert r.ran == len(jobs)


def test_per_gpu_nodes_on_one_gpu_are_the_whole_node_model() -> None:
    """One GPU node per GPU on a one-GPU host is the whole-node model, figure for figure."""
    a = slurm_model.simulate(mix(24), slurm_model.policies()["now"], gpus=1)
    b = slurm_model.simulate(mix(24), slurm_model.policies()["per-gpu"], gpus=1)
    assert (a.ran, a.util_waiting, a.makespan, a.state.reregistrations) == (
        b.ran, b.util_waiting, b.makespan, b.state.reregistrations,
    )  # fmt: skip
    assert a.losses == b.losses


def test_per_gpu_nodes_run_every_job_once_and_a_change_closes_only_its_gpu() -> None:
    """Two GPU nodes: every job runs once, one at a time on an instance of its node; when a GPU node re-registers no
    job runs on it, while the other GPU's jobs may."""
    jobs = mix(21, 90)
    r = slurm_model.simulate(jobs, slurm_model.policies()["per-gpu"], gpus=2)
    assert r.ran == len(jobs) and r.ratio >= 1.0
    done = [j for j in r.state.jobs if j.start_s < math.inf]
    for a in done:
        assert a.node in (0, 1) and a.seat >= 0
        same = [b.name for b in done if b is not a and (b.node, b.seat) == (a.node, a.seat)
                and b.start_s < a.end_s and a.start_s < b.end_s]  # fmt: skip
        assert not same, f"{a.name} shares its instance with {same}"
    changes = [(t, int(text.split(":")[0].split()[1])) for t, text in r.state.log if ": re-register " in text]
    assert changes and len(changes) == r.state.reregistrations
    others = 0
    for t, gpu in changes:
        assert not [j.name for j in done if j.node == gpu and j.start_s <= t < j.end_s], f"GPU {gpu} busy at {t} s"
        others += any(j.node != gpu and j.start_s <= t < j.end_s for j in done)
    assert others > 0  # some change happened while the other GPU node ran a job


def test_a_jittered_mix_is_the_same_jobs_each_arriving_up_to_the_jitter_later_and_draw_0_is_the_mix() -> None:
    jobs = mix(24)
    assert slurm_model.jittered(jobs, 24, 0, 1.0) == jobs
    a, b = slurm_model.jittered(jobs, 24, 3, 1.0), slurm_model.jittered(jobs, 24, 3, 1.0)
    assert a == b != slurm_model.jittered(jobs, 24, 4, 1.0)  # a draw is the same every run, and draws differ
    for j, k in zip(jobs, a, strict=True):
        assert (k.index, k.profile, k.runtime_s, k.limit_min) == (j.index, j.profile, j.runtime_s, j.limit_min)
        assert j.arrival_s <= k.arrival_s <= j.arrival_s + 1.0
    r = slurm_model.simulate(a, slurm_model.policies()["now"], gpus=1)
    _check(r, len(jobs), 1)


def test_slurms_main_passes_come_when_a_job_ends_every_interval_and_a_queued_one_a_delay_after_the_last() -> None:
    """``--sched-interval``: Slurm's main scheduler at once when a job ends, every ``sched_interval``, and a queued
    pass (a submission, a node deleted, flexmig's ``schedule`` step) ``batch_sched_delay`` after the last."""
    job = slurm_model.Job(mix(24)[0], 0.0, start_s=0.0, end_s=10.2)
    slurm_model._slurm(30.0, 60.0)
    try:
        p = slurm_model.MainPasses(0.0, seen_arrivals=1)
        assert not p.due(1.0, [job])  # nothing queued, no job ended, the interval not over
        p.queue()
        assert not p.due(2.5, [job]) and p.due(3.0, [job])  # queued: batch_sched_delay after the last pass
        assert not p.due(5.0, [job])
        assert p.due(10.5, [job])  # the job ended: at once
        assert not p.due(11.0, [job]) and p.due(70.5, [job])  # sched_interval
    finally:
        slurm_model._slurm(1.0, None)
    assert slurm_model.MainPasses(0.0).due(0.5, [job])  # the testbed's: every step


def test_under_slurms_own_settings_the_schedule_step_starts_jobs_on_new_nodes_sooner() -> None:
    """With Slurm's own ``sched_interval`` and ``bf_interval``, a job carved for without flexmig's ``schedule``
    step waits for the next job event or pass: on held-out seeds the step gives more slices busy while jobs wait
    (the model's median over seeds 81-160: +1.0 points); here over four seeds, every job still runs once."""
    slurm_model._slurm(30.0, 60.0)
    try:
        gain = []
        for seed in (81, 82, 83, 84):
            with_step = slurm_model.simulate(mix(seed), slurm_model.policies()["instances"])
            without = slurm_model.simulate(mix(seed), slurm_model.policies()["no-schedule-step"])
            assert with_step.ran == without.ran == 45
            gain.append(with_step.util_waiting - without.util_waiting)
    finally:
        slurm_model._slurm(1.0, None)
    assert sum(gain) > 0, gain
