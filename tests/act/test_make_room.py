"""An explicit request gets the planner's full help (issue 20, point 5): ``flexmig jobs migrate train --to 2g.35gb``
destroys an idle instance in the way, as ``flexmig plan --request 2g.35gb`` does on the same node, and never one
that a job holds or that runs a process.

A live actuator on a simulated H200 laid out 1g.18gb at 0-3 and an idle 3g.71gb at 4: job ``counter`` on the 1g at
0, three more jobs on the other 1g instances, so no slice is free and 2g.35gb fits only where the idle 3g is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flexmig.act.nodeview import NodeView
from flexmig.config import Config
from flexmig.plan import Planner
from flexmig.plan.types import CreateInstance, DestroyInstance
from flexmig.service.planning import parse_request, planner_settings, planning_state
from support.actuator import LiveNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SPEC = "h200:1g.18gb@0+1g.18gb@1+1g.18gb@2+1g.18gb@3+3g.71gb@4"
FILLERS = ("fill-1", "fill-2", "fill-3")
WAIT = 60.0


@pytest.fixture
def node() -> Iterator[LiveNode]:
    with LiveNode(SPEC) as n:
        for name in FILLERS:
            submit(n, name)
        yield n


def submit(node: LiveNode, name: str, profile: str = "1g.18gb") -> None:
    """One more job like ``counter`` (checkpointing), named ``name``, on ``profile``."""
    text = (node.base / "counter.toml").read_text().replace('"counter', f'"{name}').replace("/counter", f"/{name}")
    text = text.replace('profile = "1g.18gb"', f'profile = "{profile}"')
    path = node.base / f"{name}.toml"
    path.write_text(text)
    path.chmod(0o644)
    answer = request(node, "jobs.submit", path=str(path))
    assert answer["ok"], answer
    deadline = time.monotonic() + WAIT
    while len(node.act.supervisor.alive(name)) != 1:
        assert time.monotonic() < deadline, f"job {name} did not start"
        time.sleep(0.02)


def request(node: LiveNode, op: str, **args: Any) -> dict[str, Any]:
    return node.call(node.control.dispatch(json.dumps({"op": op, "args": args}).encode()))


def layout(node: LiveNode) -> str:
    return str(node.truth()["gpus"][0]["layout"])


def planner_answer(node: LiveNode) -> list[str]:
    """What the planner does with a 2g.35gb request on this node (``flexmig plan --request 2g.35gb``)."""

    async def plan() -> list[str]:
        ex = node.act.executor
        inventory = await ex.mig.inventory()
        view = NodeView.of(inventory)
        jobs = node.act.journal.jobs()
        model = view.models[0][1]
        assert model is not None
        given = planning_state(
            view,
            jobs,
            alive_pids={r.name: node.act.supervisor.pids(r.name) for r in jobs},
            now_s=time.time(),
            mig_enabled={g.index: g.mig_current for g in inventory.gpus},
            extra=(parse_request("2g.35gb", 1, model, time.time()),),
        )
        settings = planner_settings(Config.default().planner)
        actions = Planner(model, settings).plan(given.state).actions
        return [
            f"{type(a).__name__} {a.profile.name}@{a.start}"
            for a in actions
            if isinstance(a, CreateInstance | DestroyInstance)
        ]

    return node.call(plan())


def test_migrate_destroys_an_idle_instance_in_the_way_as_the_planner_does(node: LiveNode) -> None:
    assert planner_answer(node)[:2] == ["DestroyInstance 3g.71gb@4", "CreateInstance 2g.35gb@4"]
    others = {name: node.truth()["jobs"][name] for name in FILLERS}
    answer = request(node, "jobs.migrate", name="counter", to="2g.35gb")
    assert answer["ok"], answer
    result = answer["result"]
    assert result["plan"][0] == "DestroyInstance gpu0:3g.71gb@4: operator request: make room", result["plan"]
    assert [a["outcome"] for a in result["actions"]] == ["completed"] * len(result["actions"])
    state, _generation, slots, _uid = node.truth()["jobs"]["counter"]
    assert state == "running" and [s[0] for s in slots] == [0]
    assert layout(node).count("2g.35gb") == 1 and "3g.71gb" not in layout(node)
    assert {name: node.truth()["jobs"][name] for name in FILLERS} == others, "the other jobs never moved"


def test_an_instance_that_runs_a_process_is_never_destroyed_to_make_room(node: LiveNode) -> None:
    big = next(gi for gi in node.node.gpus()[0].gpu_instances if gi.profile.name == "3g.71gb")
    foreign = node.node.start_process(big.compute_instances[0].uuid)
    before = layout(node)
    answer = request(node, "jobs.migrate", name="counter", to="2g.35gb")
    assert answer["type"] == "PlanRejectedError", answer
    assert "no room for 1 x 2g.35gb" in answer["error"]
    assert "destroying idle instances would not make room either" in answer["error"]
    assert layout(node) == before
    assert foreign in node.truth()["gpus"][0]["pids"]["3g.71gb@4"]


def test_an_instance_another_job_holds_is_never_destroyed_to_make_room(node: LiveNode) -> None:
    submit(node, "big", "3g.71gb")  # on the 3g that was idle
    assert node.truth()["jobs"]["big"][2] == ((0, 4),)
    before = layout(node)
    answer = request(node, "jobs.migrate", name="counter", to="2g.35gb")
    assert answer["type"] == "PlanRejectedError", answer
    assert "destroying idle instances would not make room either" in answer["error"]
    assert layout(node) == before
