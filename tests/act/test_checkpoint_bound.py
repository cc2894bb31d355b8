"""A job moved many times leaves at most ``[hook] keep`` checkpoints and the node's layout as it found it.

flexmigd runs on a simulated H200 of three free 1g.18gb instances without the synthetic workload; the stdlib
example (one rank, standby) is migrated 100 times through the control socket, each time onto a free instance that
exists. Its rank 0 prunes the older checkpoints after each acknowledgement (the default ``keep = 2``), and each
move leaves the instance it came from as a free instance (docs/jobs.md, "What a move leaves behind").
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from flexmig.act.client import ControlClient
from support.flexmigd import ActNode, act_node, short_base
from support.jobs import counter_spec, log_lines, write_spec
from support.wait import wait_until

pytestmark = pytest.mark.integration

MOVES = 100
THREE = "h200:1g.18gb@0+1g.18gb@1+1g.18gb@2"


@pytest.fixture
def node() -> Iterator[ActNode]:
    with short_base("fm-bound-") as base, act_node(base, THREE, sim_workload=False) as n:
        yield n


def test_a_hundred_moves_leave_at_most_keep_checkpoints_and_the_layout_as_it_was(node: ActNode) -> None:
    spec = write_spec(node.base / "c.toml", counter_spec(node.base, "c") + "standby = true\n")  # [hook] is last
    client = ControlClient(node.sock, timeout_s=120)
    assert client.call("jobs.submit", path=str(spec))["ok"]
    log = node.base / "c.log"
    wait_until(lambda: any(e["event"] == "step" for e in log_lines(log)), timeout_s=60, what="the job's first step")
    layout = node.layout()
    ckpt = node.base / "ckpt-c"
    series = re.compile(r"rank0-step\d+\.json")
    most = 0
    for i in range(MOVES):
        res = client.call("jobs.migrate", name="c")
        assert res["ok"], (i, res)
        most = max(most, sum(1 for p in ckpt.iterdir() if series.fullmatch(p.name)))
    job = client.call("jobs.list")[0]
    assert job["generation"] == MOVES + 1
    kept = sorted(p.name for p in ckpt.iterdir() if series.fullmatch(p.name))
    assert len(kept) <= 2 and most <= 2, (kept, most)
    assert job["last_ack"]["checkpoint"].endswith(kept[-1]), "the last acknowledged checkpoint is kept"
    assert node.layout() == layout, "every move swapped a free instance for the one it left"
    events = log_lines(log)
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    starts = [e for e in events if e["event"] == "start"]
    assert len(checkpoints) == MOVES and len(starts) == MOVES + 1
    for ckpt_line, start in zip(checkpoints, starts[1:], strict=True):
        assert start["step"] == ckpt_line["step"] + 1 and start["total"] == ckpt_line["total"]
