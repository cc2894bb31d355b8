"""The job's own downtime in a move is exported (``flexmig_job_downtime_seconds``) as the job's log shows it, beside
flexmig's share (``flexmig_move_pause_seconds``), and logged in a ``job_resumed`` line.

flexmigd runs on a simulated H200 without the synthetic workload; the job is the stdlib example (rank 0 logs every
step with its time), moved once through the CLI, with standby ranks and without.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from support.flexmigd import ActNode, act_node, short_base
from support.jobs import counter_spec, log_lines, write_spec
from support.wait import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def node() -> Iterator[ActNode]:
    with short_base("fm-downtime-") as base, act_node(base, "h200:1g.18gb@0", sim_workload=False) as n:
        yield n


def job_log(node: ActNode) -> list[dict[str, Any]]:
    return log_lines(node.base / "train.log")


def stepping(node: ActNode, generation: str) -> list[dict[str, Any]]:
    """The log, once generation ``generation`` of the job has logged a few steps."""

    def ready() -> list[dict[str, Any]] | None:
        lines = job_log(node)
        starts = [i for i, x in enumerate(lines) if x["event"] == "start" and x["generation"] == generation]
        if starts and sum(x["event"] == "step" for x in lines[starts[-1] :]) >= 5:
            return lines
        return None

    got: list[dict[str, Any]] = wait_until(ready, timeout_s=60, what=f"generation {generation} stepping")
    return got


def downtime_in_log(lines: list[dict[str, Any]]) -> float:
    """From the last step generation 1 logged (its step boundary before the checkpoint) to the first step
    generation 2 logged: the job's own downtime, as its log tells it."""
    second = next(i for i, x in enumerate(lines) if x["event"] == "start" and x["generation"] == "2")
    last = [x for x in lines[:second] if x["event"] == "step"][-1]
    first = next(x for x in lines[second:] if x["event"] == "step")
    return float(first["t"]) - float(last["t"])


def lines_step(lines: list[dict[str, Any]]) -> int:
    """The step generation 1 checkpointed."""
    return int(next(x for x in lines if x["event"] == "checkpoint")["step"])


@pytest.mark.parametrize("standby", [True, False], ids=["standby", "cold"])
def test_the_exported_job_downtime_is_the_one_in_the_jobs_log(node: ActNode, standby: bool) -> None:
    text = counter_spec(node.base, "train") + ("standby = true\n" if standby else "")  # [hook] is the last table
    cli = [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(node.sock)]
    done = subprocess.run([*cli, "submit", str(write_spec(node.base / "train.toml", text))], check=False)
    assert done.returncode == 0
    stepping(node, "1")
    out = subprocess.run([*cli, "migrate", "train"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = stepping(node, "2")

    def exported() -> float | None:
        n = node.metric("flexmig_job_downtime_seconds_count", action="migrate")
        return node.metric("flexmig_job_downtime_seconds_sum", action="migrate") if n == 1 else None

    job_s = wait_until(exported, timeout_s=30, what="the job's downtime exported")
    pause_s = node.metric("flexmig_move_pause_seconds_sum", action="migrate")
    assert pause_s is not None and node.metric("flexmig_move_pause_seconds_count", action="migrate") == 1
    logged = downtime_in_log(lines)
    assert abs(job_s - logged) <= 0.1, (job_s, logged)
    assert job_s > pause_s, "the job loses its save, start-up and first step beyond flexmig's share"
    daemon_log = node.log.read_text()
    m = re.search(r"job_resumed job train generation 2 after migrate #\d+: job downtime ([0-9.]+) s .*"
                  r"flexmig's share ([0-9.]+) s\)", daemon_log)  # fmt: skip
    assert m is not None, daemon_log[-2000:]
    assert abs(float(m.group(1)) - job_s) < 0.01 and abs(float(m.group(2)) - pause_s) < 0.01
    assert re.search(r"action_completed #\d+ migrate .*flexmig's share of the pause [0-9.]+ s", daemon_log)
    assert not (node.base / "ckpt-train" / "flexmig-ack.json.first-step").exists(), "the report is removed once read"
    second = [x for x in daemon_log.splitlines() if "job_started job train: generation 2" in x]
    resumed = [x for x in second if f"resuming after step {lines_step(lines)}" in x]
    assert len(resumed) == 1 and len(second) == (2 if standby else 1), second
    assert not any("first start" in x for x in second), second
    assert any("standby ranks waiting" in x for x in second) == standby, second
