"""How often one host of a cluster reads Slurm's queue (:mod:`flexmig.slurm.shared_reads`) and how many hosts it counts
(:func:`flexmig.slurm.nodes.gpu_hosts`): pure, time as an argument."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexmig.slurm.gres import parse_gres
from flexmig.slurm.nodes import SlurmNode, gpu_hosts, host_of
from flexmig.slurm.shared_reads import JOB_LOCK_SHARE, job_lock_s, read_spacing, round_due


def node(name: str, address: str = "127.0.0.1", gres: str = "gpu:1g.18gb:1") -> SlurmNode:
    return SlurmNode(name, "idle", frozenset(), "", parse_gres(gres), (), (), 8, address=address)


# --------------------------------------------------------------------------------------------------- the spacing
def test_a_read_holds_the_job_lock_as_measured() -> None:
    """0.29 ms with a short queue, 5.2 ms with 2,000 jobs (22.05.8), linear beyond."""
    assert job_lock_s(0) == pytest.approx(0.29e-3)
    assert job_lock_s(2000) == pytest.approx(5.2e-3)
    assert job_lock_s(20_000) == pytest.approx(0.29e-3 + 10 * (5.2e-3 - 0.29e-3))


def test_a_long_queue_on_many_hosts_is_read_within_the_job_lock_share() -> None:
    """1,000 hosts with 20,000 jobs: a read holds the lock 49 ms, so the hosts together read about twice a second
    (each every ~494 s), not the 20 a second the read budget alone allows (a second of job lock every second)."""
    spacing = read_spacing(1000, 0.02, reads_per_s=20.0, probe_s=1.0, jobs=20_000)
    assert spacing == pytest.approx(1000 * job_lock_s(20_000) / JOB_LOCK_SHARE)
    assert 1000 / spacing * job_lock_s(20_000) == pytest.approx(JOB_LOCK_SHARE)
    # 100 hosts, 2,000 jobs: the lock share (5.2 s) and the read budget (5 s) nearly agree
    assert read_spacing(100, 0.02, reads_per_s=20.0, probe_s=1.0, jobs=2000) == pytest.approx(5.2)
    # one host, a short queue: every probe, as before
    assert read_spacing(1, 0.014, reads_per_s=20.0, probe_s=1.0, jobs=20) == 1.0
    assert read_spacing(0, 0.0, reads_per_s=20.0, probe_s=1.0, jobs=5000) == 1.0


SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared, loaded machine


@SETTINGS
@given(
    hosts=st.integers(1, 5000),
    jobs=st.integers(0, 200_000),
    read_s=st.floats(0.0, 5.0),
    reads_per_s=st.floats(0.01, 1000.0),
)
def test_the_hosts_together_never_exceed_either_budget(
    hosts: int, jobs: int, read_s: float, reads_per_s: float
) -> None:
    spacing = read_spacing(hosts, read_s, reads_per_s=reads_per_s, probe_s=1.0, jobs=jobs)
    assert hosts / spacing <= reads_per_s * (1 + 1e-9)
    assert hosts / spacing * job_lock_s(jobs) <= JOB_LOCK_SHARE * (1 + 1e-9)
    assert spacing >= max(1.0, 10 * read_s) - 1e-9


def test_the_timed_read_waits_for_the_spacing_too() -> None:
    """interval_s 10 on 1,000 hosts whose spacing is 50 s: no read at 10 s (it was one every 10 s: 100 reads a second
    for the cluster), one at 50 s; a moved queue is read once the spacing passed, a still one at interval_s."""
    assert not round_due(10.0, spacing_s=50.0, interval_s=10.0)
    assert not round_due(49.9, spacing_s=50.0, interval_s=10.0, moved=True)
    assert round_due(50.0, spacing_s=50.0, interval_s=10.0)
    assert round_due(2.0, spacing_s=1.0, interval_s=10.0, moved=True)
    assert not round_due(2.0, spacing_s=1.0, interval_s=10.0)
    assert round_due(10.0, spacing_s=1.0, interval_s=10.0)
    assert round_due(float("inf"), spacing_s=0.0, interval_s=10.0)  # the first round


@SETTINGS
@given(since=st.floats(0.0, 1e6), spacing=st.floats(0.0, 1e4), interval=st.floats(0.1, 1e4), moved=st.booleans())
def test_no_read_comes_before_the_spacing_and_none_later_than_both(
    since: float, spacing: float, interval: float, moved: bool
) -> None:
    due = round_due(since, spacing_s=spacing, interval_s=interval, moved=moved)
    if since < spacing:
        assert not due
    if since >= max(spacing, interval):
        assert due


# --------------------------------------------------------------------------------------------------- the hosts
def test_dynamic_nodes_that_share_an_address_count_by_their_host() -> None:
    """Slurm 24.11 gives a dynamic node the address its slurmd registered from: on the testbed every host's is
    127.0.0.1, and the two hosts below counted as one."""
    nodes = [
        node("h0-gpu0-0"), node("h0-gpu0-4"), node("h0-gpu1-0-7g141gb"),
        node("h1-gpu0-0"), node("h1-gpu1"),
        node("cpu1", gres=""),
    ]  # fmt: skip
    assert gpu_hosts(nodes) == 2
    assert [host_of(n) for n in nodes[:5]] == ["h0", "h0", "h0", "h1", "h1"]


def test_nodes_without_a_flexmig_name_count_by_address_then_name() -> None:
    nodes = [
        node("b", "10.0.0.2", "gpu:1g.18gb:7"),
        node("b2", "10.0.0.2", "gpu:1g.18gb:7"),
        node("c", "", "gpu:7g.141gb:1"),
        node("gpu-west-3", "10.0.0.3"),  # not <host>-gpu<K>: a site's own name
        node("a-gpu", "10.0.0.4"),
    ]
    assert gpu_hosts(nodes) == 4
    assert host_of(node("a-gpu1234-0", "10.0.0.5")) == "10.0.0.5"  # GPU numbers have three digits at most


def test_the_operators_lock_share_is_honoured() -> None:
    """``[slurm] cluster_job_lock_share = 1`` leaves 1,000 hosts with 20,000 jobs to cluster_reads_per_s (50 s each)."""
    assert read_spacing(1000, 0.02, reads_per_s=20.0, probe_s=1.0, jobs=20_000, lock_share=1.0) == 50.0
    assert read_spacing(1000, 0.02, reads_per_s=20.0, probe_s=1.0, jobs=20_000, lock_share=0.01) == pytest.approx(
        1000 * job_lock_s(20_000) / 0.01
    )
