"""bench/slurm_load.py, the load of flexmig hosts on slurmctld: before, the timed reads of 1,000 hosts (every
interval_s, whatever the budget) read 100 times a second and held the job lock about 5 s a second; now every read
waits for the spacing, and the spacing keeps the hosts' reads within cluster_reads_per_s and the job-lock share."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flexmig.slurm.shared_reads import JOB_LOCK_SHARE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import slurm_load  # type: ignore[import-not-found]  # noqa: E402

HOST = slurm_load.Host(mean_nodes=20.0, most_nodes=28, changes_per_h=150.0)


def test_a_hundred_hosts_read_within_the_budget() -> None:
    r = slurm_load.row(100, HOST, 20.0)
    assert r.reads_per_s <= slurm_load.READS_PER_S
    assert r.lock_ms_per_s <= JOB_LOCK_SHARE * 1000
    assert r.nodes == pytest.approx(2000.0)


def test_a_thousand_hosts_broke_the_budget_with_their_timed_reads_and_no_longer_do() -> None:
    before = slurm_load.row(1000, HOST, 20.0, before=True)
    assert before.reads_per_s == pytest.approx(100.0)
    assert before.lock_ms_per_s > 1000  # saturated: more than a second of job lock a second
    now = slurm_load.row(1000, HOST, 20.0)
    assert now.reads_per_s <= slurm_load.READS_PER_S
    assert now.lock_ms_per_s <= JOB_LOCK_SHARE * 1000 * (1 + 1e-9)
    assert now.every_s > 60  # the price: each host's view is minutes old


@pytest.mark.parametrize("hosts", [1, 20, 100, 300, 1000, 3000])
def test_every_size_stays_within_both_budgets(hosts: int) -> None:
    r = slurm_load.row(hosts, HOST, 20.0)
    assert r.reads_per_s <= slurm_load.READS_PER_S * (1 + 1e-9)
    assert r.lock_ms_per_s <= JOB_LOCK_SHARE * 1000 * (1 + 1e-9)


def test_a_longer_queue_is_read_less_often_not_with_more_of_the_lock() -> None:
    small = slurm_load.row(20, HOST, 20.0)
    big = slurm_load.row(20, HOST, 200.0)
    assert big.every_s > small.every_s
    assert big.lock_ms_per_s <= JOB_LOCK_SHARE * 1000
