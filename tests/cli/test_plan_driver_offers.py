"""The planner plans only profiles the GPU's driver offers, read from NVML, not from our catalogue.

An A100-80GB on driver 470 offers no 1g.20gb (profile 15: NVIDIA/mig-parted issue #97; nvml.h names it from CUDA
12.0, branch 525). A job whose memory a 1g.20gb holds gets a 2g.20gb there, and the actuator can create it; on a
535 driver the same job gets the 1g.20gb.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pytest import CaptureFixture

from flexmig.act.nodeview import NodeView
from flexmig.cli.main import main
from flexmig.config import Config
from flexmig.nvml import Nvml
from flexmig.plan import Planner
from flexmig.plan.types import CreateInstance, JobRequest, RankNeed
from flexmig.service.planning import planner_settings, planning_state
from flexmig.sim import install, uninstall

JOB = JobRequest(name="small", need=RankNeed(memory_mib=15 << 10), rank_memory_mib=15 << 10, submitted_s=0.0)


@pytest.fixture
def node_470() -> Iterator[None]:
    install("a100-80@470.82.01")
    yield
    uninstall()


def planned_profiles(nvml: Nvml) -> list[str]:
    inventory = nvml.inventory()
    given = planning_state(
        NodeView.of(inventory),
        (),
        alive_pids={},
        now_s=1.0,
        mig_enabled={g.index: g.mig_current for g in inventory.gpus},
        extra=[JOB],
    )
    plan = Planner(given.state.model, planner_settings(Config.default().planner)).plan(given.state)
    return [a.profile.name for a in plan.actions if isinstance(a, CreateInstance)]


def test_on_driver_470_a_small_job_gets_a_2g_the_driver_offers_and_it_can_be_created(node_470: None) -> None:
    with Nvml.open() as nvml:
        offered = {o.profile_id for o in nvml.inventory().gpus[0].offers or ()}
        assert 15 not in offered and {19, 14} <= offered
        profiles = planned_profiles(nvml)
        assert profiles == ["2g.20gb"]
        created = nvml.create_instance(0, profiles[0], 0)  # what the actuator would do with the plan
        assert created.memory_total_bytes == 19968 << 20


def test_on_driver_535_the_same_job_gets_a_1g_20gb() -> None:
    install("a100-80@535")
    try:
        with Nvml.open() as nvml:
            assert planned_profiles(nvml) == ["1g.20gb"]
    finally:
        uninstall()


def test_flexmig_plan_refuses_a_request_for_a_profile_the_driver_does_not_offer(capsys: CaptureFixture[str]) -> None:
    code = main(["plan", "--sim", "a100-80@470.82.01", "--request", "1g.20gb", "--json"])
    err = capsys.readouterr().err
    assert code == 2
    assert "has no profile 1g.20gb" in err and "2g.20gb" in err
    assert main(["plan", "--sim", "a100-80@470.82.01", "--request", "2g.20gb", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [a["action"] for a in doc["actions"]][:1] == ["create_instance"]
