"""Synthetic traces (flexmig.replay.synth): seeded, at the load asked for, with the shapes and arrivals they name."""

from __future__ import annotations

import statistics
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest

from flexmig.errors import TraceError
from flexmig.mig import H200
from flexmig.replay.load import cap_runtime, natural_load
from flexmig.replay.synth import SCENARIOS, Pools, load_pools, scenario, synthesize, write_pod_list
from flexmig.replay.trace import TraceRow, map_trace, read_trace
from support.heldout import TRACES


@cache
def pools() -> Pools:
    return load_pools(TRACES, H200)


def rows(name: str, *, load: float = 0.8, seed: int = 1, jobs: int = 600) -> list[TraceRow]:
    return synthesize(pools(), SCENARIOS[name], model=H200, gpus=8, load=load, seed=seed, jobs=jobs)


def gaps(trace: list[TraceRow]) -> list[float]:
    return [float(b.creation_s - a.creation_s) for a, b in pairwise(trace)]


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    assert rows("default-poisson", seed=3) == rows("default-poisson", seed=3)
    assert rows("default-poisson", seed=3) != rows("default-poisson", seed=4)


@pytest.mark.parametrize("name", ["default-poisson", "gpushare-bursty", "multigpu-diurnal", "default-trace"])
@pytest.mark.parametrize("load", [0.5, 0.9])
def test_the_jobs_offer_the_load_asked_for_once_mapped_and_capped(name: str, load: float) -> None:
    jobs = cap_runtime(map_trace(rows(name, load=load), H200).jobs, 86400.0)
    assert len(jobs) == 600
    assert natural_load(jobs, 56) == pytest.approx(load, rel=0.02)


def test_arrivals_start_at_zero_and_never_go_back_in_time() -> None:
    for name in ("default-poisson", "default-bursty", "default-diurnal", "default-trace"):
        trace = rows(name)
        assert trace[0].creation_s == 0
        assert all(g >= 0 for g in gaps(trace)), name


def test_bursty_and_trace_arrivals_are_burstier_than_poisson() -> None:
    def cv(name: str) -> float:
        g = gaps(rows(name, jobs=2000))
        return statistics.pstdev(g) / statistics.mean(g)

    poisson = cv("default-poisson")
    assert poisson == pytest.approx(1.0, abs=0.15)  # exponential gaps
    assert cv("default-bursty") > poisson + 0.5
    assert cv("default-trace") > poisson


def test_diurnal_arrivals_follow_the_day() -> None:
    trace = rows("default-diurnal", jobs=3000, load=0.5)
    by_hour = [0] * 24
    for r in trace:
        by_hour[int(r.creation_s % 86400 // 3600)] += 1
    assert max(by_hour) > 3 * min(by_hour)


def test_shapes_come_from_the_named_pod_list() -> None:
    def multi_share(name: str) -> float:
        trace = rows(name, jobs=3000)
        return sum(r.num_gpu > 1 for r in trace) / len(trace)

    assert multi_share("multigpu-poisson") > 2 * multi_share("default-poisson")
    fractional = [r for r in rows("gpushare-poisson", jobs=3000) if r.num_gpu == 1 and r.gpu_milli < 1000]
    assert len(fractional) > 0.4 * 3000


def test_a_written_pod_list_reads_back_as_the_same_rows(tmp_path: Path) -> None:
    trace = rows("multigpu-trace", jobs=50)
    write_pod_list(trace, tmp_path / "t.csv")
    back = read_trace(tmp_path / "t.csv")
    assert [(r.name, r.num_gpu, r.gpu_milli, r.creation_s, r.deletion_s) for r in back] == [
        (r.name, r.num_gpu, r.gpu_milli, r.creation_s, r.deletion_s) for r in trace
    ]


def test_an_unknown_scenario_is_refused_by_name() -> None:
    with pytest.raises(TraceError, match="unknown scenario 'default-uniform'; known: default-poisson"):
        scenario("default-uniform")
