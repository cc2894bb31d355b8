"""``flexmig jobs list`` and ``flexmig status`` print one job table, and a job that ended claims no instance: the
instance it ran on may be another job's by now."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.flexmigd import act_node, short_base
from support.jobs import counter_spec, flexmig, write_spec
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", *args],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_stopped_job_claims_no_instance_and_jobs_list_prints_status_job_table() -> None:
    with short_base() as base, act_node(base, "h200:1g.18gb@0") as node:
        flexmig(node.sock, "submit", str(write_spec(base / "first.toml", counter_spec(base, "first"))))
        flexmig(node.sock, "stop", "first", "--force")
        wait_until(lambda: node.jobs()["first"]["state"] == "stopped", what="first stopped")
        flexmig(node.sock, "submit", str(write_spec(base / "second.toml", counter_spec(base, "second"))))
        wait_until(lambda: node.jobs()["second"]["state"] == "running", what="second running")
        listed = cli("jobs", "list", "--socket", str(node.sock)).splitlines()
        status = cli("status", "--socket", str(node.sock)).splitlines()
        flexmig(node.sock, "stop", "second", "--force")
    head = listed[0]
    assert head.split() == ["name", "state", "ranks", "gen", "ack", "step", "instances"]
    table = status[status.index("jobs") + 1 :][: len(listed)]
    assert table == listed  # one table, the same lines
    first = next(line for line in listed if line.split()[0] == "first")
    second = next(line for line in listed if line.split()[0] == "second")
    assert first.split()[1] == "stopped" and first.split()[-1] == "-" and first.split()[2] == "0"
    assert second.split()[1] == "running" and second.split()[-1].startswith("gpu0:1g.18gb@")
