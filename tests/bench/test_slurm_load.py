"""bench/slurm_load.py, the load of flexmig hosts on slurmctld: the reads the counters ask for stay within
cluster_reads_per_s however many hosts, the timed reads do not (1,000 hosts at interval_s 10 read 100 times a
second), and an interval_s of hosts / cluster_reads_per_s brings them back within it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import slurm_load  # type: ignore[import-not-found]  # noqa: E402

HOST = slurm_load.Host(mean_nodes=20.0, most_nodes=28, changes_per_h=150.0)


def test_a_hundred_hosts_read_within_the_budget() -> None:
    r = slurm_load.row(100, HOST, 20.0)
    assert r.reads_per_s <= slurm_load.READS_PER_S
    assert r.nodes == pytest.approx(2000.0)


def test_a_thousand_hosts_break_the_budget_with_their_timed_reads_unless_interval_s_grows() -> None:
    assert slurm_load.row(1000, HOST, 20.0).reads_per_s == pytest.approx(100.0)
    assert slurm_load.row(1000, HOST, 20.0, interval_s=50.0).reads_per_s == pytest.approx(20.0)


def test_the_job_lock_grows_with_the_reads_and_the_queue() -> None:
    small = slurm_load.row(100, HOST, 20.0)
    big = slurm_load.row(100, HOST, 200.0)
    assert big.lock_ms_per_s > small.lock_ms_per_s
