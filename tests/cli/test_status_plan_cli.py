"""``flexmig status`` and ``flexmig plan`` on a simulated node, and what the planner is shown of a node.

The JSON is checked against the simulator's ground truth (the same spec builds the same node: UUIDs, GI IDs and the
demo workload's roles are fixed by the spec and the seed); the human output is smoke-checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flexmig import sim
from flexmig.act.nodeview import InstanceView, NodeView
from flexmig.act.records import JobRecord, Slot
from flexmig.config import Config, ControlConfig, PlannerConfig, StateConfig, parse_config
from flexmig.errors import PlanRejectedError
from flexmig.jobspec.spec import JobPolicy, load_job_spec
from flexmig.mig import A100_40, H200, GpuModel
from flexmig.plan import Planner, PlannerSettings, validate_plan
from flexmig.service.actuator_host import ActuatorPaths
from flexmig.service.planning import parse_request, planner_settings, planning_state
from flexmig.sim.workload import SyntheticWorkload
from support.jobs import counter_spec, write_spec

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"


def flexmig(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def status() -> dict[str, object]:
    out = flexmig("status", "--sim", SPEC, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def truth() -> dict[int, list[tuple[int, int, str, str, int]]]:
    """GPU -> (GI ID, start, profile, MIG UUID, memory bytes) of every instance, straight from the simulator."""
    node = sim.install(SPEC)
    try:
        return {
            g.index: sorted(
                (gi.id, gi.start, gi.profile.name, ci.uuid, gi.memory_bytes)
                for gi in g.gpu_instances
                for ci in gi.compute_instances
            )
            for g in node.gpus()
        }
    finally:
        sim.uninstall()


@pytest.mark.integration
def test_status_json_lists_every_gpu_and_instance_as_the_simulator_holds_them(status: dict[str, Any]) -> None:
    got = {
        g["index"]: sorted(
            (i["gpu_instance_id"], i["start"], i["profile"], i["uuid"], i["memory_total_bytes"]) for i in g["instances"]
        )
        for g in status["gpus"]
    }
    assert got == truth()
    assert status["source"] == f"sim:{SPEC}" and status["mode"] is None
    for g in status["gpus"]:
        assert g["mig"] is True and g["lost"] is False
        assert g["layout"] == "3g.71gb@0+2g.35gb@4+1g.18gb@6" and g["slice_map"] == "3333221."
        assert (g["free_compute_slices"], g["free_memory_slices"]) == (1, 1)


@pytest.mark.integration
def test_status_shows_the_demo_workloads_processes_where_its_roles_put_them(status: dict[str, Any]) -> None:
    roles = SyntheticWorkload(seed=0)
    for g in status["gpus"]:
        for i in g["instances"]:
            busy = roles.role(g["index"], i["start"], i["profile"]).kind != "idle"
            assert len(i["processes"]) == (1 if busy else 0), (g["index"], i["profile"])
            assert (i["sm_active"] or 0) > 0 or not busy  # GPM activity over the two sweeps' window
            assert i["job"] is None


@pytest.mark.integration
def test_status_reports_fragmentation_and_the_findings_of_its_one_sweep(status: dict[str, Any]) -> None:
    frag = status["fragmentation"]
    assert frag["free_compute_slices"] == 2 and frag["external_score"] == 1.0
    kinds = sorted((f["kind"], f["gpu"]) for f in status["findings"])
    # the demo layout's one free slice fits nothing, yet a repack would gain a single 1g: no fragmentation finding
    assert "fragmentation" not in {kind for kind, _ in kinds}
    idle = {(f["gpu"], f["start"]) for f in status["findings"] if f["kind"] == "idle"}
    roles = SyntheticWorkload(seed=0)
    expected = {
        (g["index"], i["start"])
        for g in status["gpus"]
        for i in g["instances"]
        if roles.role(g["index"], i["start"], i["profile"]).kind == "idle"
    }
    assert idle == expected and idle


@pytest.mark.integration
def test_status_for_people_shows_each_gpu_its_instances_and_findings() -> None:
    out = flexmig("status", "--sim", SPEC)
    assert out.returncode == 0, out.stderr
    for uuid in (u for gpu in truth().values() for _, _, _, u, _ in gpu):
        assert uuid in out.stdout
    assert "GPU 0: NVIDIA H200" in out.stdout and "[3333221.]" in out.stdout
    assert "external fragmentation 1.00" in out.stdout and "finding: fragmentation" not in out.stdout
    assert "  idle GPU 0 3g.71gb@0: no process ran" in out.stdout


@pytest.mark.integration
def test_status_without_a_daemon_says_where_it_looked() -> None:
    out = flexmig("status", "--socket", "/nonexistent/flexmig.sock")
    assert out.returncode == 1
    assert "cannot reach the flexmig daemon at /nonexistent/flexmig.sock" in out.stderr


@pytest.mark.integration
def test_plan_on_a_simulated_node_places_what_if_requests_around_the_demo_workload() -> None:
    out = flexmig("plan", "--sim", SPEC, "--json", "--request", "2x1g.18gb", "--request", "2g.35gb")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["pending"] == [
        {"job": "what-if-1", "ranks": 2, "need": "1g.18gb"},
        {"job": "what-if-2", "ranks": 1, "need": "2g.35gb"},
    ]
    roles = SyntheticWorkload(seed=0)
    busy = {
        f"gpu{g}:{p}@{s}"
        for g, insts in truth().items()
        for _, s, p, _, _ in insts
        if roles.role(g, s, p).kind != "idle"
    }
    assert set(doc["blocked"]) == busy and all("no registered job" in why for why in doc["blocked"].values())
    touched = {a["target"] for a in doc["actions"] if a["action"] in ("create_instance", "destroy_instance")}
    touched |= {i for a in doc["actions"] for i in a.get("to", ())}
    assert not touched & busy, "the plan never touches an instance running a process of no registered job"
    started = {a["job"] for a in doc["actions"] if a["action"] == "start"}
    assert started == {"what-if-1", "what-if-2"}  # on GPU 0, in place of its idle 3g and beside its idle 1g
    assert all(a["reason"] and a["cost_s"] >= 0 for a in doc["actions"])
    assert doc["cost_s"] == sum(a["cost_s"] for a in doc["actions"]) and doc["executes"] is False


@pytest.mark.integration
def test_plan_for_people_lists_actions_reasons_and_what_is_left_alone() -> None:
    out = flexmig("plan", "--sim", SPEC, "--request", "1g.18gb")
    assert out.returncode == 0, out.stderr
    assert f"plan (simulated node {SPEC})" in out.stdout
    assert "start" in out.stdout and "job what-if-1" in out.stdout
    assert "left alone: gpu1:" in out.stdout and "no registered job" in out.stdout
    empty = flexmig("plan", "--sim", SPEC)
    assert empty.returncode == 0 and "nothing worth doing" in empty.stdout


@pytest.mark.integration
@pytest.mark.parametrize(
    ("request_", "why"),
    [
        ("9g.99gb", "expected [Nx]PROFILE"),
        ("1g.10gb", "has no profile 1g.10gb"),
        ("0x1g.18gb", "expected [Nx]PROFILE"),
        ("2x1g.18gb; rm -rf /", "expected [Nx]PROFILE"),
    ],
)
def test_a_bad_what_if_request_is_refused_naming_it(request_: str, why: str) -> None:
    out = flexmig("plan", "--sim", SPEC, "--request", request_)
    assert out.returncode == 2 and why in out.stderr and request_.split(";", maxsplit=1)[0] in out.stderr


# ------------------------------------------------------------------------------------ the planner's view


def view(
    *instances: InstanceView, gpus: int = 1, lost: frozenset[int] = frozenset(), model: GpuModel = H200
) -> NodeView:
    return NodeView(tuple(instances), tuple((g, model) for g in range(gpus)), lost)


def inst(
    gpu: int, start: int, profile: str, pids: frozenset[int] | None = frozenset(), uuid: str | None = "MIG-x"
) -> InstanceView:
    return InstanceView(gpu, start, profile, start + 1, uuid, pids)


def job(tmp_path: Path, name: str, state: str, *slots: Slot) -> JobRecord:
    spec = load_job_spec(write_spec(tmp_path / f"{name}.toml", counter_spec(tmp_path, name)), JobPolicy((tmp_path,)))
    return JobRecord(name=name, uid=name, spec=spec, state=state, slots=slots, submitted_s=1.0)  # type: ignore[arg-type]


def test_the_planner_leaves_alone_instances_with_foreign_or_unknown_processes_and_gpus_it_cannot_plan_for(
    tmp_path: Path,
) -> None:
    v = view(
        inst(0, 0, "1g.18gb", frozenset({4242})),  # a process of no registered job
        inst(0, 1, "1g.18gb", None),  # NVML will not list its processes
        inst(0, 2, "1g.18gb", uuid=None),  # a GPU instance without compute instance
        inst(0, 3, "1g.18gb", frozenset({100})),  # job a's rank
        inst(1, 0, "7g.141gb"),
        inst(2, 0, "7g.141gb"),
        gpus=4,
        lost=frozenset({1}),
    )
    given = planning_state(
        v,
        [job(tmp_path, "a", "running", Slot(0, 3, "1g.18gb"))],
        alive_pids={"a": {100}},
        now_s=10.0,
        mig_enabled={0: True, 1: True, 2: True, 3: False},
    )
    s = given.state
    assert s.blocked == {(0, 0), (0, 1), (0, 2)}
    assert s.blocked_gpus == {1, 3}
    assert given.blocked_why["gpu0:1g.18gb@0"] == "runs processes of no registered job (4242)"
    assert given.blocked_why["gpu1"] == "lost (GPU_IS_LOST)" and given.blocked_why["gpu3"] == "MIG is not enabled"
    assert [j.name for j in s.running] == ["a"] and s.running[0].instances[0].key == (0, 3)
    plan = Planner(H200).plan(s)
    validate_plan(s, plan)


def test_a_running_job_whose_instances_are_gone_is_left_out_and_its_place_blocked(tmp_path: Path) -> None:
    v = view(inst(0, 0, "1g.18gb", frozenset({7})))
    given = planning_state(
        v,
        [job(tmp_path, "a", "running", Slot(0, 0, "1g.18gb"), Slot(0, 5, "1g.18gb")), job(tmp_path, "q", "pending")],
        alive_pids={"a": {7}},
        now_s=10.0,
        mig_enabled={0: True},
    )
    assert given.left_out == {"a": "its instances gpu0:1g.18gb@5 are not as recorded"}
    assert given.state.running == () and (0, 0) in given.state.blocked
    assert [r.name for r in given.state.pending] == ["q"]


def test_a_node_of_another_model_is_planned_for_its_first_model_only() -> None:
    v = NodeView((), ((0, A100_40), (1, H200)), frozenset())
    given = planning_state(v, [], alive_pids={}, now_s=0.0, mig_enabled={0: True, 1: True})
    assert given.state.model == A100_40 and given.state.blocked_gpus == {1}
    assert "not the node's" in given.blocked_why["gpu1"]


def test_no_gpu_of_a_known_model_is_a_clear_refusal() -> None:
    with pytest.raises(PlanRejectedError, match="no usable MIG GPU"):
        planning_state(view(lost=frozenset({0})), [], alive_pids={}, now_s=0.0, mig_enabled={0: True})


def test_what_if_requests_are_queued_after_the_real_ones() -> None:
    r = parse_request("3x1g.18gb", 2, H200, 5.0)
    assert (r.name, r.ranks, r.need.profile, r.submitted_s) == ("what-if-2", 3, "1g.18gb", 5.0)


def test_the_planner_table_maps_onto_planner_settings() -> None:
    cfg = parse_config(
        "[planner]\ngain_margin = 0.5\nsettling_s = 10\ncheckpoint_s = 1\nrestart_s = 2\nresplit_enabled = false\n",
        "x.toml",
    ).planner
    s = planner_settings(cfg)
    assert s.gain_margin == 0.5
    assert (s.gain_ratio, s.settling_s, s.checkpoint_s, s.restart_s, s.resplit, s.migrate) == (
        1.5,
        10.0,
        1.0,
        2.0,
        False,
        True,
    )
    assert s.move_cost() == 3.0


def test_the_planner_cost_defaults_are_the_measured_ones() -> None:
    d = PlannerConfig()
    assert (d.checkpoint_s, d.restart_s) == (1.0, 5.0)  # bench/migration.py and the torch example, see PlannerSettings


def test_a_daemon_without_a_planner_table_plans_with_the_planners_own_defaults() -> None:
    assert planner_settings(parse_config("", "x.toml").planner) == PlannerSettings()
    assert PlannerSettings().gain_ratio == pytest.approx(1.1)


def test_a_simulated_node_keeps_its_journal_and_socket_apart_from_the_real_nodes(tmp_path: Path) -> None:
    paths = ActuatorPaths.of(Config.default(), simulated=True, tmp=tmp_path)
    assert paths.private is not None and paths.private.is_dir() and paths.private.parent == tmp_path
    assert paths.journal.parent == paths.private and paths.socket.parent == paths.private
    assert paths.journal != StateConfig().journal and paths.socket != ControlConfig().socket
    real = ActuatorPaths.of(Config.default(), simulated=False)
    assert (real.journal, real.socket, real.private) == (StateConfig().journal, ControlConfig().socket, None)
    cfg = parse_config(
        f'[state]\ndirectory = "{tmp_path}"\njournal = "{tmp_path}/j.sqlite3"\n[control]\nsocket = "{tmp_path}/s"\n',
        "x.toml",
    )
    mine = ActuatorPaths.of(cfg, simulated=True)
    assert (mine.journal, mine.socket, mine.private) == (tmp_path / "j.sqlite3", tmp_path / "s", None)
