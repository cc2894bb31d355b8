"""Reading the Alibaba pod list and turning rows into MIG jobs; load thinning, gap compression, run-time cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexmig.errors import TraceError
from flexmig.mig import A100_40, H200
from flexmig.replay.load import cap_runtime, compress, natural_load, span_of, thin
from flexmig.replay.trace import ElasticRule, TraceJob, map_trace, profile_for_share, read_trace

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def write(tmp_path: Path, rows: list[str], header: str = HEADER, name: str = "pods.csv") -> Path:
    path = tmp_path / name
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("milli", "profile"),
    [
        (50, "1g.18gb"),
        (142, "1g.18gb"),
        (143, "1g.35gb"),  # 1/7 = 0.1428... no longer covers; two memory slices (0.25) do
        (250, "1g.35gb"),
        (251, "2g.35gb"),
        (285, "2g.35gb"),
        (286, "3g.71gb"),  # four memory slices cover up to 0.5
        (500, "3g.71gb"),
        (501, "4g.71gb"),
        (571, "4g.71gb"),
        (572, "7g.141gb"),
        (1000, "7g.141gb"),
    ],
)
def test_gpu_share_maps_to_the_smallest_profile_covering_it_in_compute_or_memory(milli: int, profile: str) -> None:
    assert profile_for_share(H200, milli).name == profile


def test_share_mapping_uses_the_models_own_profile_names() -> None:
    assert profile_for_share(A100_40, 460).name == "3g.20gb"


def test_rows_map_to_jobs_with_run_time_from_scheduled_to_deletion(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "a,1,1,1,460,,LS,Running,100,1100,150",
            "b,1,1,8,1000,,LS,Running,200,900,300",
        ],
    )
    mapped = map_trace(read_trace(path), H200)
    a, b = mapped.jobs
    assert (a.name, a.arrival_s, a.runtime_s, a.profile.name, a.ranks, a.elastic) == (
        "a",
        100.0,
        950.0,
        "3g.71gb",
        1,
        False,
    )
    assert (b.profile.name, b.ranks, b.elastic, b.compute_slices) == ("7g.141gb", 8, True, 56)


def test_rows_without_gpu_schedule_or_run_time_are_skipped_and_counted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            "cpu,1,1,0,0,,LS,Running,0,10,0",
            "pending,1,1,1,500,,LS,Pending,0,10,",
            "open,1,1,1,500,,LS,Running,0,,5",
            "zero,1,1,1,500,,LS,Failed,0,5,5",
            "ok,1,1,1,500,,LS,Running,0,10,5",
        ],
    )
    mapped = map_trace(read_trace(path), H200)
    assert [j.name for j in mapped.jobs] == ["ok"]
    assert mapped.skipped == {"never scheduled": 1, "no GPU": 1, "no deletion time": 1, "run time <= 0": 1}


@pytest.mark.parametrize(
    ("rule", "elastic"),
    [("whole", {"full", "multi"}), ("multi", {"multi"}), ("none", set()), ("all", {"full", "multi", "share"})],
)
def test_elastic_rule_picks_which_jobs_may_be_split(tmp_path: Path, rule: ElasticRule, elastic: set[str]) -> None:
    path = write(
        tmp_path,
        [
            "full,1,1,1,1000,,LS,Running,0,10,0",
            "multi,1,1,2,1000,,LS,Running,0,10,0",
            "share,1,1,1,300,,LS,Running,0,10,0",
        ],
    )
    mapped = map_trace(read_trace(path), H200, elastic=rule)
    assert {j.name for j in mapped.jobs if j.elastic} == elastic


def test_a_bad_number_is_reported_with_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, ["a,1,1,1,500,,LS,Running,0,10,0", "b,1,1,one,500,,LS,Running,0,10,0"])
    with pytest.raises(TraceError, match=r"pods\.csv:3: column 'num_gpu' is not a number: 'one'"):
        read_trace(path)


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, ["a,1,1,1,500"], header="name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    with pytest.raises(TraceError, match=r"missing column\(s\) creation_time, deletion_time, scheduled_time"):
        read_trace(path)


def test_a_share_above_one_gpu_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, ["a,1,1,1,1500,,LS,Running,0,10,0"])
    with pytest.raises(TraceError, match=r":2: column 'gpu_milli' is 1500"):
        read_trace(path)


def test_an_unreadable_trace_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "missing.csv")


def _jobs(tmp_path: Path, n: int = 200) -> tuple[TraceJob, ...]:
    rows = [
        f"j{i:03},1,1,1,{[100, 300, 1000][i % 3]},,LS,Running,{i * 100},{i * 100 + 50 + (i * 37) % 900},{i * 100}"
        for i in range(n)
    ]
    return map_trace(read_trace(write(tmp_path, rows)), H200).jobs


def test_thinning_reaches_the_load_asked_for_and_keeps_the_span(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    natural = natural_load(jobs, 14)
    kept = thin(jobs, natural / 2, 14, seed=3)
    assert span_of(kept) == span_of(jobs)
    work = sum(j.work for j in kept)
    target = natural / 2 * 14 * span_of(jobs)
    assert target <= work < target + max(j.work for j in jobs)
    assert len(kept) < len(jobs)


def test_thinning_is_seeded(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    rho = natural_load(jobs, 14) / 2
    assert thin(jobs, rho, 14, seed=1) == thin(jobs, rho, 14, seed=1)
    assert thin(jobs, rho, 14, seed=1) != thin(jobs, rho, 14, seed=2)


def test_a_load_above_what_the_trace_offers_is_refused(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    with pytest.raises(TraceError, match="thinning can only lower it"):
        thin(jobs, natural_load(jobs, 14) * 1.5, 14, seed=0)


def test_compression_cuts_only_the_long_gaps(tmp_path: Path) -> None:
    rows = [
        "a,1,1,1,500,,LS,Running,1000,2000,1000",
        "b,1,1,1,500,,LS,Running,1100,2000,1100",
        "c,1,1,1,500,,LS,Running,90000,99000,90000",
    ]
    jobs = map_trace(read_trace(write(tmp_path, rows)), H200).jobs
    assert [j.arrival_s for j in compress(jobs, 1800)] == [0.0, 100.0, 1900.0]
    assert [j.runtime_s for j in compress(jobs, 1800)] == [j.runtime_s for j in jobs]


def test_run_times_are_capped_and_zero_means_no_cap(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path, 10)
    assert max(j.runtime_s for j in cap_runtime(jobs, 100)) == 100
    assert cap_runtime(jobs, 0) == list(jobs)
