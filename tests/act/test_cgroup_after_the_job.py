"""A job's cgroup (``flexmig-jobs/job-<ID>``) is removed when the job ends: done, stopped, or moved (with standby
ranks) and then done.

flexmigd runs on a simulated H200 without the synthetic workload, with job cgroups where this host allows them;
the jobs are the stdlib example, bounded to a few hundred steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from flexmig.act.jobcgroups import probe
from support.flexmigd import ActNode, act_node, short_base
from support.jobs import counter_spec, job_uid, write_spec
from support.wait import wait_until

pytestmark = pytest.mark.integration

CGROUPS, WHY = probe()


@pytest.fixture
def node() -> Iterator[ActNode]:
    if CGROUPS is None:
        pytest.skip(f"no job cgroups here: {WHY}")
    with short_base("fm-cg-") as base, act_node(base, "h200:1g.18gb@0+1g.18gb@1", sim_workload=False) as n:
        yield n


def jobs(node: ActNode, *args: str) -> str:
    cli = [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(node.sock)]
    out = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def ended(node: ActNode, name: str) -> bool:
    state = {j["name"]: j["state"] for j in json.loads(jobs(node, "list", "--json"))}[name]
    return state in ("done", "stopped")


def gone(path: Path) -> bool:
    return not path.exists()


def test_the_cgroups_of_ended_jobs_are_removed(node: ActNode) -> None:
    assert CGROUPS is not None
    # "moved" runs ~30 s (0.01 s a step): long enough that it is still running when the move is asked on a loaded
    # machine (at 400 steps it could end first, and the move was cancelled: "the job is done").
    for name, steps in (("short", 50), ("moved", 3000), ("stopped", 10**6)):
        text = counter_spec(node.base, name).replace('"1"]', f'"1", "--steps", "{steps}"]')
        if name == "moved":
            text += "standby = true\n"  # [hook] is the spec's last table
        jobs(node, "submit", str(write_spec(node.base / f"{name}.toml", text)))
        uid = job_uid(node.journal, name)
        assert uid is not None
        cgroup = CGROUPS.path(uid)
        wait_until(cgroup.exists, timeout_s=30, what=f"{name}'s cgroup")
        if name == "moved":
            jobs(node, "migrate", name)
        if name == "stopped":
            jobs(node, "stop", name)
        wait_until(partial(ended, node, name), timeout_s=120, what=f"{name} ended")
        wait_until(partial(gone, cgroup), timeout_s=10, what=f"{name}'s cgroup removed")
