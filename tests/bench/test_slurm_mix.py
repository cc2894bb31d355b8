"""bench/slurm_mix.py's figures on a node of several Slurm nodes (``per-gpu``): the closed share is the share of the
GPU nodes closed, each node's closed periods count apart, utilisation is over every GPU's slices, and a job that
ran on a GPU index instead of its own MIG device is caught."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from flexmig.slurm.sitecheck import version_problem  # noqa: E402
from slurm_mix import MixJob, Run, figures, slurm_version  # type: ignore[import-not-found]  # noqa: E402


def _run(devices: tuple[str, str]) -> tuple[Run, list[MixJob]]:
    jobs = [MixJob(0, 0.0, "7g.141gb", 10.0, 1), MixJob(1, 0.0, "7g.141gb", 10.0, 1)]
    r = Run("per-gpu", t0=100.0)
    r.jobs = {
        0: {"submit": 100.0, "starts": [100.0], "ends": [110.0], "devices": [devices[0]]},
        1: {"submit": 100.0, "starts": [105.0], "ends": [115.0], "devices": [devices[1]]},
    }
    # GPU node 0 closed for 1 s at 101 s, GPU node 1 closed for 2 s at 101 s (samples every 0.5 s)
    for k in range(30):
        t = 100.0 + 0.5 * k
        each = [101.0 <= t < 102.0, 101.0 <= t < 103.0]
        r.samples.append((t, sum(each) / 2, "7g | 7g", each))
    return r, jobs


def test_two_gpu_nodes_figures() -> None:
    r, jobs = _run(("MIG-a", "MIG-b"))
    f = figures(r, jobs, gpus=2)
    assert f["ran"] == 2 and f["makespan"] == 15.0
    assert sorted(f["closed_periods"]) == [1.0, 2.0]
    assert abs(f["closed_share"] - 3.0 / 30.0) < 1e-9  # 3 node-seconds closed of 15 s x 2 nodes
    # job 1 waited 5 s while job 0 held 7 of the 14 slices
    assert abs(f["util_waiting"] - 0.5) < 1e-9
    assert f["once"] and f["own_device"]


def test_a_job_on_a_gpu_index_or_a_shared_device_is_caught() -> None:
    r, jobs = _run(("0", "1"))
    assert not figures(r, jobs, gpus=2)["own_device"]
    r, jobs = _run(("MIG-a", "MIG-a"))  # both on one device at once (105-110 s)
    assert not figures(r, jobs, gpus=2)["own_device"]


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("slurmctld") is None, reason="needs root and Debian's Slurm")
def test_the_per_gpu_rival_on_a_slurm_older_than_23_11_is_refused_before_anything_starts() -> None:
    version = slurm_version(None)
    if version_problem(version) is None:
        pytest.skip(f"the distribution's Slurm is {version}: per-gpu runs on it")
    env = {k: v for k, v in os.environ.items() if k != "FLEXMIG_SLURM_BIN"}
    env["PYTHONPATH"] = str(ROOT / "daemon")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "slurm_mix.py"), "--rivals", "per-gpu", "--quick"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert f"the per-gpu rival needs Slurm 23.11 or later, this is {version}: " in done.stderr, done.stderr
    assert "set FLEXMIG_SLURM_BIN" in done.stderr and done.stdout == "", done


def test_every_hosts_instance_nodes_are_counted() -> None:
    """``--hosts``: the instance nodes of every host (``mix-h<I>-gpu<K>-<S>``, static ones with their profile) are
    the bed's, another node is not."""
    from slurm_mix import Bed  # noqa: PLC0415

    names = ["mix-h1-gpu0-0", "mix-h2-gpu1-4-3g71gb", "mix-gpu0-6", "mix-h1", "other-gpu0-0", "mix-h1-gpu0"]
    assert Bed.instance_names(dict.fromkeys(names)) == ["mix-gpu0-6", "mix-h1-gpu0-0", "mix-h2-gpu1-4-3g71gb"]


def test_two_hosts_utilisation_counts_both_hosts_slices() -> None:
    """Two jobs of 7g on two hosts of one GPU each, side by side: every slice busy, against 14 slices."""
    r, jobs = _run(("MIG-a", "MIG-b"))
    r.jobs[1]["starts"] = [100.0]
    r.jobs[1]["ends"] = [110.0]
    r.jobs[0]["submit"] = r.jobs[1]["submit"] = 99.0  # waiting from 99 s, both started at 100 s
    f = figures(r, jobs, gpus=2)
    assert f["util_run"] == pytest.approx(2 * 7 * 10 / (14 * 11))
    assert f["own_device"] and f["once"]


@pytest.mark.integration
def test_a_whole_node_rival_on_several_hosts_is_refused_before_anything_starts() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "slurm_mix.py"), "--hosts", "2", "--rivals", "now"],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "bench")},
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "--hosts" in done.stderr or "needs root" in done.stderr, done.stderr
