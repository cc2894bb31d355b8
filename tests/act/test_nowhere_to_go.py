"""A move that could only land where the job already runs is refused, in one line, with nothing moved; ``--in-place``
asks for it.

flexmigd runs on a simulated H200 of seven 1g.18gb instances without the synthetic workload; a filler job holds five
of them and the moved job (two standby ranks of the stdlib example) the other two, so no instance is free. Every
request goes through the ``flexmig`` CLI, as an operator types it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from support.flexmigd import ActNode, act_node, short_base
from support.jobs import counter_spec, log_lines, write_spec
from support.wait import wait_until

pytestmark = pytest.mark.integration

SEVEN = "h200:" + "+".join(f"1g.18gb@{i}" for i in range(7))


@pytest.fixture
def node() -> Iterator[ActNode]:
    with short_base("fm-nowhere-") as base, act_node(base, SEVEN, sim_workload=False) as n:
        yield n


def jobs_cli(node: ActNode, *args: str) -> subprocess.CompletedProcess[str]:
    """``flexmig jobs ARGS... --socket SOCK``."""
    return subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "jobs", *args, "--socket", str(node.sock)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def submit(node: ActNode, name: str, ranks: int, *, standby: bool) -> None:
    text = counter_spec(node.base, name, ranks=ranks).replace(f"min = {ranks}\n", "min = 1\n")
    if standby:
        text += "standby = true\n"  # [hook] is the spec's last table
    out = jobs_cli(node, "submit", str(write_spec(node.base / f"{name}.toml", text)))
    assert out.returncode == 0, out.stdout + out.stderr


def started(node: ActNode, name: str, n: int) -> list[dict[str, object]]:
    """The ``start`` lines of job ``name``'s log, once it has ``n`` of them and stepped after the last."""

    def ready() -> list[dict[str, object]] | None:
        lines = log_lines(node.base / f"{name}.log")
        starts = [i for i, x in enumerate(lines) if x["event"] == "start"]
        if len(starts) >= n and any(x["event"] == "step" for x in lines[starts[-1] + 1 :]):
            return [lines[i] for i in starts]
        return None

    got: list[dict[str, object]] = wait_until(ready, timeout_s=60, what=f"{name} started {n} time(s) and stepping")
    return got


def test_a_move_with_nowhere_to_go_is_refused_and_in_place_asks_for_it(node: ActNode) -> None:
    submit(node, "filler", 5, standby=False)
    started(node, "filler", 1)
    submit(node, "train", 2, standby=True)
    first = started(node, "train", 1)
    before = node.jobs()["train"]
    assert before["state"] == "running" and before["generation"] == 1
    where = [(i["gpu"], i["start"]) for i in before["instances"]]
    moves_before = node.metric("flexmig_actions_total", action="migrate", outcome="done")

    out = jobs_cli(node, "migrate", "train")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "no free instance of 1g.18gb for 2 rank(s) of job train" in lines[0]
    assert "nothing moved (--in-place" in lines[0]
    assert out.stdout == ""

    out = jobs_cli(node, "resplit", "train", "--ranks", "1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no free instance of 1g.18gb for 1 rank(s) of job train" in out.stderr
    assert "the resplit could only restart it" in out.stderr

    after = node.jobs()["train"]
    assert after["generation"] == 1 and [(i["gpu"], i["start"]) for i in after["instances"]] == where
    assert len(started(node, "train", 1)) == 1, "nothing was relaunched"
    assert started(node, "train", 1)[0]["pid"] == first[0]["pid"]
    assert node.metric("flexmig_actions_total", action="migrate", outcome="done") == moves_before

    out = jobs_cli(node, "migrate", "train", "--in-place")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("migrate train: completed")
    starts = started(node, "train", 2)
    assert starts[-1]["generation"] == "2" and starts[-1]["standby"] is False, "in place: a cold start"
    again = node.jobs()["train"]
    assert [(i["gpu"], i["start"]) for i in again["instances"]] == where

    out = jobs_cli(node, "resplit", "train", "--ranks", "1", "--in-place")
    assert out.returncode == 0, out.stdout + out.stderr
    assert started(node, "train", 3)[-1]["world"] == 1
    assert node.jobs()["filler"]["generation"] == 1, "the other job was never touched"
