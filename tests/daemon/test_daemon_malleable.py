"""flexmigd's planner shrinks and grows a real malleable job (a process on a simulated node, jobs through ``flexmig``).

The torch DDP example runs on four 1g.35gb instances (every memory slice of the GPU) with ``ranks.min = 2``: it is
malleable. ``flexmig plan`` in mode advise says what the planner would do for a queued 3g.71gb and why; in mode act a
real 3g.71gb job is queued, the planner re-splits the DDP job 4 -> 2 (its data re-sharded over two ranks, resuming
exactly from its checkpoint), starts the queued job, and when that job is done re-splits the DDP job 2 -> 4. Each
decision reaches the fleet with its reason (MQTT, validated against the event schema).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from flexmig.mqtt.events import EventKind
from support.flexmigd import act_node, collect_events, open_session, short_base
from support.jobs import ROOT, Training, ddp_spec, flexmig, write_spec
from support.mosquitto import MOSQUITTO, Mosquitto
from support.wait import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.torch,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto (Debian package mosquitto)"),
]

SCHEMA = json.loads((ROOT / "schemas" / "event.v1.schema.json").read_text())
EVENTS = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base() as d:
        yield d


def short_job(base: Path) -> str:
    """The stdlib example on one 3g.71gb instance, done after 300 steps (a few seconds)."""
    return f"""\
name = "short"
argv = ["{sys.executable}", "{ROOT}/examples/hook_minimal.py", "--steps", "300", "--step-time", "0.02",
        "--log", "{base}/short.log", "--log-every", "10"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt-short"
[ranks]
min = 1
max = 1
start = 1
[need]
profile = "3g.71gb"
"""


def test_flexmigd_shrinks_a_malleable_ddp_job_for_a_queued_one_and_grows_it_back(base: Path, broker: Mosquitto) -> None:
    torch = pytest.importorskip("torch")
    open_session(broker.port, "mall-node", "mall-watcher")
    with act_node(base, "h200", node_name="mall-node", broker=broker.address) as node:
        out = flexmig(
            node.sock,
            "submit",
            str(write_spec(base / "ddp.toml", ddp_spec(base, ranks=4, min_ranks=2, profile="1g.35gb"))),
        )
        assert "job ddp: running on" in out and out.count("1g.35gb") == 4
        t = Training(base)
        assert t.wait_for(1, 10)["world"] == 4

        # advise: what the planner would do for a queued 3g.71gb, with the reason of each decision; nothing changes
        node.hup("advise")
        plan = node.cli_json("plan", "--request", "3g.71gb")
        assert plan["mode"] == "advise" and plan["executes"] is False
        resplit = [a for a in plan["actions"] if a["action"] == "resplit"]
        assert len(resplit) == 1 and resplit[0]["target"] == "job ddp"
        assert "shrink ddp to 2x1g.35gb (50% speed) to make room for what-if-1" in resplit[0]["reason"]
        start = [a for a in plan["actions"] if a["action"] == "start"]
        assert [a["target"] for a in start] == ["job what-if-1"] and "after shrinking ddp" in start[0]["reason"]
        assert node.layout() == {0: [(s, "1g.35gb") for s in (0, 2, 4, 6)]}, "advise changed the node"

        # act: a real 3g.71gb job queues; ddp is re-split 4 -> 2, the job starts, ends, and ddp grows 2 -> 4
        node.hup("act")
        out = flexmig(node.sock, "submit", str(write_spec(base / "short.toml", short_job(base))))
        assert "queued: no room now" in out
        assert t.wait_for(2, 5)["world"] == 2
        wait_until(lambda: node.jobs()["short"]["state"] in ("running", "done"), what="the short job ran")
        wait_until(lambda: node.jobs()["short"]["state"] == "done", 120, "the short job is done")
        grown = t.wait_for(3, 5)
        assert grown["world"] == 4
        t.check_resumed_exactly(torch, moves=2)
        jobs = node.jobs()
        assert jobs["ddp"]["state"] == "running" and jobs["ddp"]["ranks"] == 4 and jobs["ddp"]["generation"] == 3
        assert node.layout() == {0: sorted((i["start"], i["profile"]) for i in jobs["ddp"]["instances"])}
        assert node.metric("flexmig_actions_total", action="resplit", outcome="completed") == 2
        after = node.cli_json("plan")
        assert after["actions"] == [], "nothing left to do once ddp runs whole again"
        flexmig(node.sock, "stop", "ddp")

    events = collect_events(broker.port, "mall-node", client_id="mall-watcher")
    for e in events:
        assert [err.message for err in EVENTS.iter_errors(e.to_dict())] == []
    moves: list[dict[str, Any]] = [
        dict(e.payload) for e in events if e.kind is EventKind.ACTION_COMPLETED and e.payload.get("action") == "resplit"
    ]
    assert [m["origin"] for m in moves] == ["planner", "planner"]
    proposed = [
        a
        for e in events
        if e.kind is EventKind.PLAN_PROPOSED and e.payload.get("mode") == "act"
        for a in e.payload["actions"]
        if a["action"] == "resplit"
    ]
    reasons = [a["reason"] for a in proposed]
    assert len(reasons) == 2, reasons
    assert reasons[0].startswith("shrink ddp to 2x1g.35gb") and "for short" in reasons[0]
    assert reasons[1].startswith("grow ddp to 4x1g.35gb (100% speed, from 50%)")
