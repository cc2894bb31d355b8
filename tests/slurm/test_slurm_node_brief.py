"""A change's node polls ask slurmctld for one node (:mod:`flexmig.slurm.node_brief`): ``sinfo -N -h -n NAME -O ...``
is one ``REQUEST_NODE_INFO_SINGLE`` (sdiag counts it), never the every-node ``REQUEST_NODE_INFO`` that
``sinfo --json`` and ``scontrol show node NAME`` send, and it reads what the full record says of the node's state,
flags, GRES, partitions, CPUs and reason. Real slurmctld (22.05.8; 24.11.5 through ``make slurm-newer``)."""

from __future__ import annotations

import asyncio

import pytest

from flexmig.errors import SlurmError
from flexmig.slurm.node_brief import SEP, brief_format, parse_brief
from support.slurm import SlurmDaemon, per_gpu_capable, skip_reason, slurm_version

SPEC = "h200:3g.71gb@0+3g.71gb@4"
NODE = "fm-node-gpu0-4-3g71gb"
DYNAMIC = pytest.mark.skipif(not per_gpu_capable(), reason=f"dynamic nodes need Slurm 23.11+ ({slurm_version()})")


def line(*cells: str) -> str:
    return "".join(c + SEP for c in cells[:-1]) + cells[-1] + "\n"


def test_a_brief_answer_is_read_with_its_flags_partitions_and_a_reason_holding_anything() -> None:
    text = line("n1", "idle+drain+dynamic_norm", "gpu:1g.18gb:1(S:0)", "gpu:1g.18gb:0(IDX:N/A)", "mig*", "8",
                "maintenance | rack 4") + line("n1", "idle+drain+dynamic_norm", "gpu:1g.18gb:1", "gpu:0", "big", "8",
                                               "maintenance | rack 4")  # fmt: skip
    n = parse_brief(text, "n1")
    assert n is not None and n.state == "idle" and n.flags == {"DRAIN", "DYNAMIC_NORM"}, n
    assert n.drained and n.responding and n.partitions == ("mig", "big") and n.cpus == 8, n
    assert n.reason == "maintenance | rack 4" and n.gpu_counts() == {"1g.18gb": 1}, n
    down = parse_brief(line("n1", "down*+not_responding", "(null)", "(null)", "mig", "8", "none"), "n1")
    assert down is not None and not down.responding and down.reason == "" and down.gres == (), down
    assert parse_brief("", "n1") is None and parse_brief(line("n2", "idle", "", "", "mig", "8", "none"), "n1") is None
    with pytest.raises(SlurmError, match="expected 7 fields"):
        parse_brief("n1 idle\n", "n1")
    assert brief_format().count(SEP) == 7 and brief_format().startswith("nodelist:0")


@pytest.mark.integration
@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
def test_the_brief_read_is_one_single_node_rpc_and_agrees_with_the_full_record() -> None:
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=True, default_layout=True) as d:
        client = d.client()
        d.wait("the node registered", lambda: d.responding(NODE), timeout_s=60)
        d.stop_flexmigd()  # nobody else asks slurmctld for nodes while it is counted
        single, every = d.rpc_count("REQUEST_NODE_INFO_SINGLE"), d.rpc_count("REQUEST_NODE_INFO")
        brief = asyncio.run(client.node_brief(NODE))
        assert d.rpc_count("REQUEST_NODE_INFO_SINGLE") == single + 1
        assert d.rpc_count("REQUEST_NODE_INFO") == every  # no node list packed for it
        full = asyncio.run(client.node(NODE))
        assert brief is not None and full is not None
        for key in ("state", "flags", "gres", "partitions", "cpus", "reason"):
            assert getattr(brief, key) == getattr(full, key), (key, brief, full)
        asyncio.run(client.drain(NODE, "maintenance | rack 4"))
        brief, full = asyncio.run(client.node_brief(NODE)), asyncio.run(client.node(NODE))
        assert brief is not None and full is not None and brief.drained and full.drained
        assert (brief.state, brief.flags, brief.reason) == (full.state, full.flags, full.reason), (brief, full)
        assert asyncio.run(client.node_brief("fm-node-gpu0-9-1g18gb")) is None  # no such node


@pytest.mark.integration
@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
@pytest.mark.parametrize("static", [pytest.param(True, id="static"), pytest.param(False, id="dynamic", marks=DYNAMIC)])
def test_a_carvings_waits_poll_the_node_alone(static: bool) -> None:
    """A carving for a 1g job (a 3g retired, a 1g made and registered): the change's waits ask for their node alone
    (sdiag's REQUEST_NODE_INFO_SINGLE; before, every poll was a REQUEST_NODE_INFO of every node)."""
    with SlurmDaemon(SPEC, node_per_instance=True, static_nodes=static, default_layout=True) as d:
        single = d.rpc_count("REQUEST_NODE_INFO_SINGLE")
        every = d.rpc_count("REQUEST_NODE_INFO")
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script="#!/bin/sh\nsleep 60\n")
        d.wait_state(job, "RUNNING", timeout_s=60)
        polls = d.rpc_count("REQUEST_NODE_INFO_SINGLE") - single
        lists = d.rpc_count("REQUEST_NODE_INFO") - every
        assert polls > 0, (polls, lists)
        print(f"\nnode polls during a carving: {polls} single-node asks, {lists} node lists (rounds and checks)")
