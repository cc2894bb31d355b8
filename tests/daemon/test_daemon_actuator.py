"""flexmigd with its actuator and planner, as a process on a simulated node, jobs submitted through ``flexmig``.

* the torch DDP example is migrated and re-split 2 -> 4 -> 2 under the real daemon in mode act: it resumes at the
  acknowledged step + 1 with the checkpoint's parameters and its loss keeps falling; every action is counted on
  /metrics with its outcome, duration and the job's downtime, and arrives over MQTT (a real mosquitto) as events
  that validate against the published schema;
* the planner in mode act moves a running job to start a queued one that did not fit;
* observe never plans; advise publishes the plan and changes nothing (the simulator's ground truth and the
  journal stay as they were); after a reload into act the same plan is executed;
* SIGTERM while a migration runs lets it finish (or, past ``jobs.shutdown_grace_s``, leaves it to the journal,
  which the next start finishes): either way the job runs once, from its checkpoint, and no instance leaks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from flexmig.act import jobcgroups
from flexmig.act.client import ControlClient, ControlError, ControlRequestError
from flexmig.act.journal import Journal
from flexmig.act.procs import PsutilScanner
from flexmig.act.records import JobRecord
from flexmig.jobspec.spec import JobPolicy, load_job_spec
from flexmig.mqtt.events import Event, EventKind
from support.flexmigd import ActNode, act_node, collect_events, open_session, short_base
from support.jobs import Training, counter_spec, ddp_spec, flexmig, job_uid, log_lines, write_spec
from support.mosquitto import MOSQUITTO, Mosquitto
from support.wait import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto (Debian package mosquitto)"),
]

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "event.v1.schema.json").read_text())
EVENTS = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())


@pytest.fixture
def base() -> Iterator[Path]:
    """A short, world-traversable directory (unix socket paths are limited to 107 bytes)."""
    with short_base() as d:
        yield d


def valid(events: list[Event]) -> list[Event]:
    for e in events:
        errors = [err.message for err in EVENTS.iter_errors(e.to_dict())]
        assert errors == [], (e.kind, e.payload, errors)
    return events


def of_kind(events: list[Event], kind: EventKind, **payload: object) -> list[dict[str, object]]:
    return [
        dict(e.payload) for e in events if e.kind is kind and all(e.payload.get(k) == v for k, v in payload.items())
    ]


def started_twice(path: Path) -> list[dict[str, Any]]:
    """The log of an ``examples/hook_minimal.py`` job once it has started a second time (after one move)."""

    def probe() -> list[dict[str, object]]:
        lines = log_lines(path)
        return lines if sum(e["event"] == "start" for e in lines) == 2 else []

    return wait_until(probe, what=f"a second start in {path.name}")  # type: ignore[no-any-return]


def instances_of(status: dict[str, object], gpu: int) -> set[tuple[int, str, str, str | None]]:
    g = next(x for x in status["gpus"] if x["index"] == gpu)  # type: ignore[attr-defined]
    return {(i["start"], i["profile"], i["uuid"], i["job"]) for i in g["instances"]}


# ------------------------------------------------------------------------------------------- issue 6, in flexmigd


@pytest.mark.torch
def test_ddp_job_under_flexmigd_migrates_and_resplits_exactly_with_action_metrics_and_events(
    base: Path, broker: Mosquitto
) -> None:
    torch = pytest.importorskip("torch")
    open_session(broker.port, "ddp-node", "ddp-watcher")
    with act_node(base, "h200", node_name="ddp-node", broker=broker.address) as node:
        spec = write_spec(base / "train.toml", ddp_spec(base))
        out = flexmig(node.sock, "submit", str(spec))
        assert "job ddp: running on gpu0:1g.18gb@0, gpu0:1g.18gb@1" in out
        t = Training(base)
        first = t.wait_for(1, 15)
        assert first["world"] == 2 and first["resume"] is None

        flexmig(node.sock, "migrate", "ddp")
        assert t.wait_for(2, 10)["world"] == 2
        assert [(i["gpu"], i["start"]) for i in node.jobs()["ddp"]["instances"]] == [(0, 2), (0, 3)]
        flexmig(node.sock, "resplit", "ddp", "--ranks", "4")
        assert t.wait_for(3, 10)["world"] == 4
        flexmig(node.sock, "resplit", "ddp", "--ranks", "2")
        assert t.wait_for(4, 10)["world"] == 2
        t.check_resumed_exactly(torch, moves=3)
        live = PsutilScanner().find(job_uid(node.journal, "ddp") or "")
        assert sorted(f.slot for f in live) == [0, 1] and {f.generation for f in live} == {4}

        # /metrics: every action with its outcome; durations; the job's downtime per move
        for action, n in (("start", 1), ("migrate", 1), ("resplit", 2)):
            assert node.metric("flexmig_actions_total", action=action, outcome="completed") == n
            assert node.metric("flexmig_action_duration_seconds_count", action=action) == n
        for outcome in ("failed", "cancelled", "skipped"):
            assert node.metric("flexmig_actions_total", action="migrate", outcome=outcome) == 0
        # the job reports its first step after a move, read at the next sweep: each move's, none lost to the next
        wait_until(
            lambda: node.metric("flexmig_job_downtime_seconds_count", action="resplit") == 2,
            what="the job's downtime of both re-splits on /metrics",
        )
        assert node.metric("flexmig_job_downtime_seconds_count", action="migrate") == 1
        assert 0 < (node.metric("flexmig_job_downtime_seconds_sum", action="resplit") or 0) < 60
        assert node.metric("flexmig_jobs", state="running") == 1
        assert node.metric("flexmig_actions_in_progress") == 0

        # flexmig status: the job's instances, as the simulator holds them
        status = node.cli_json("status")
        truth = {g.index: g for g in node.truth()}
        expected = {
            (gi.start, gi.profile.name, ci.uuid) for gi in truth[0].gpu_instances for ci in gi.compute_instances
        }
        got = instances_of(status, 0)
        assert {(s, p, u) for s, p, u, _ in got} == expected
        held = sorted(s for s, _, _, job in got if job == "ddp")
        assert held == sorted(i["start"] for i in node.jobs()["ddp"]["instances"])
        assert [j["name"] for j in status["jobs"]] == ["ddp"] and status["mode"] == "act"
        cgroups, why = jobcgroups.probe()  # what this machine allows the daemon too (root, cgroup v2 writable)
        assert status["job_cgroups"] == {"base": str(cgroups.base) if cgroups else None, "off": why}
        people = node.cli("status")
        assert people.returncode == 0 and "job ddp: " in people.stdout and "mode act" in people.stdout

        out = flexmig(node.sock, "stop", "ddp")
        assert "stop ddp: completed" in out
        wait_until(lambda: node.metric("flexmig_jobs", state="stopped") == 1, what="the stop counted")

    events = valid(collect_events(broker.port, "ddp-node", client_id="ddp-watcher"))
    moves = of_kind(events, EventKind.ACTION_COMPLETED, job="ddp")
    assert [m["action"] for m in moves] == ["start", "migrate", "resplit", "resplit", "stop"]
    for m in moves[1:4]:
        assert m["origin"] == "control" and m["target"] == "job ddp"
        assert 0 < m["downtime_s"] < m["duration_s"]  # type: ignore[operator]
        assert [s["step"] for s in m["steps"]][:4] == ["clear_ack", "request", "await_ack", "await_exit"]  # type: ignore[attr-defined]
    started = of_kind(events, EventKind.JOB_STARTED, job="ddp")
    checkpoints = [e["step"] for e in t.log() if e["event"] == "checkpoint"]  # 3 moves, then the stop's
    assert [s["resume_step"] for s in started] == [None, *checkpoints[:3]]
    assert [len(s["instances"]) for s in started] == [2, 2, 4, 2]  # type: ignore[arg-type]
    assert len(of_kind(events, EventKind.ACTION_STARTED, action="migrate")) == 1
    # the instances a move left behind are destroyed by actions of their own, as events too
    assert of_kind(events, EventKind.ACTION_COMPLETED, action="destroy_instance")


# ------------------------------------------------------------------------------------------ the planner, act


def test_the_planner_moves_a_running_job_to_start_a_queued_one_that_did_not_fit(base: Path, broker: Mosquitto) -> None:
    open_session(broker.port, "plan-node", "plan-watcher")
    with act_node(base, "h200", node_name="plan-node", broker=broker.address) as node:
        flexmig(node.sock, "submit", str(write_spec(base / "small.toml", counter_spec(base, "small"))))
        wait_until(lambda: len(log_lines(base / "small.log")) >= 3, what="small runs")
        out = flexmig(
            node.sock, "submit", str(write_spec(base / "big.toml", counter_spec(base, "big", profile="4g.71gb")))
        )
        assert "queued: no room now" in out and "job big: pending" in out

        jobs = wait_until(
            lambda: (j := node.jobs())["big"]["state"] == "running" and j, what="big started by the planner"
        )
        assert [(i["gpu"], i["start"], i["profile"]) for i in jobs["big"]["instances"]] == [(0, 0, "4g.71gb")]
        small = [(i["gpu"], i["start"], i["profile"]) for i in jobs["small"]["instances"]]
        assert small != [(0, 0, "1g.18gb")] and jobs["small"]["state"] == "running"
        assert jobs["small"]["generation"] == 2  # moved once, resumed from its checkpoint
        lines = started_twice(base / "small.log")
        (ckpt,) = [e for e in lines if e["event"] == "checkpoint"]
        resumed = [e for e in lines if e["event"] == "start"][1]
        assert resumed["step"] == ckpt["step"] + 1 and resumed["total"] == ckpt["total"]
        assert node.layout() == {0: sorted([(0, "4g.71gb"), (small[0][1], "1g.18gb")])}  # nothing leaked
        assert node.metric("flexmig_actions_total", action="migrate", outcome="completed") == 1
        # the jobs gauge is counted at each sweep: the one after big started
        wait_until(lambda: node.metric("flexmig_jobs", state="running") == 2, what="both jobs counted running")
        for name in ("big", "small"):
            flexmig(node.sock, "stop", name)

    events = valid(collect_events(broker.port, "plan-node", client_id="plan-watcher"))
    plans = of_kind(events, EventKind.PLAN_PROPOSED, mode="act")
    assert plans, "the plan is published before it runs"
    kinds = [a["action"] for a in plans[0]["actions"]]  # type: ignore[attr-defined]
    assert kinds == ["create_instance", "migrate", "destroy_instance", "create_instance", "start"]
    migrated = of_kind(events, EventKind.ACTION_COMPLETED, action="migrate", job="small")
    assert len(migrated) == 1 and migrated[0]["origin"] == "planner"


# ------------------------------------------------------------------------------------- observe, advise, act


def register_pending(node: ActNode, base: Path, name: str) -> None:
    """A job queued in the journal (as ``jobs submit`` leaves one that found no room), before the daemon starts."""
    spec = load_job_spec(write_spec(base / f"{name}.toml", counter_spec(base, name)), JobPolicy((base,)))
    j = Journal(node.journal)
    try:
        j.put_job(JobRecord(name=name, uid="0" * 32, spec=spec, state="pending", submitted_s=time.time()))
    finally:
        j.close()


def test_observe_never_plans_advise_publishes_the_plan_and_changes_nothing_and_act_runs_it(
    base: Path, broker: Mosquitto
) -> None:
    node = ActNode(base, "h200", mode="observe", node_name="modes-node", broker=broker.address)
    register_pending(node, base, "queued")
    open_session(broker.port, "modes-node", "modes-watcher")
    with act_node(base, "h200", mode="observe", node_name="modes-node", broker=broker.address) as node:
        # observe: a pending job, yet no planning round in three intervals
        sweeps = node.metric("flexmig_sweeps_total") or 0
        wait_until(lambda: (node.metric("flexmig_sweeps_total") or 0) >= sweeps + 3, what="3 s of sweeps")
        assert node.metric("flexmig_planner_runs_total") == 0
        assert node.metric("flexmig_planned_actions", action="start") == 0
        # ... though `flexmig plan` says what the planner would do, and changes nothing either
        plan = node.cli_json("plan")
        assert plan["mode"] == "observe" and plan["executes"] is False
        assert [a["action"] for a in plan["actions"]] == ["create_instance", "start"]
        where = plan["actions"][0]["target"]  # gpu0:1g.18gb@S, where the planner wants the queued job
        start = int(where.rsplit("@", 1)[1])
        what_if = node.cli_json("plan", "--request", "2x2g.35gb")
        assert {a["job"] for a in what_if["actions"] if a["action"] == "start"} == {"queued", "what-if-1"}
        client = ControlClient(node.sock, timeout_s=30)
        with pytest.raises(ControlRequestError, match="status takes no arguments"):
            client.call("status", verbose=True)
        with pytest.raises(ControlRequestError, match="'requests' must be a list"):
            client.call("plan", requests="1g.18gb")
        with pytest.raises(ControlRequestError, match=r"expected \[Nx\]PROFILE"):
            client.call("plan", requests=["1g.18gb; reboot"])
        other = write_spec(base / "other.toml", counter_spec(base, "other"))
        with pytest.raises(ControlError, match="mode is 'observe'"):
            client.call("jobs.submit", path=str(other))
        assert plan["pending"] == [{"job": "queued", "ranks": 1, "need": "1g.18gb"}]

        node.hup("advise")
        wait_until(lambda: (node.metric("flexmig_planner_runs_total") or 0) >= 3, what="3 advise rounds")
        assert node.metric("flexmig_planned_actions", action="start") == 1
        assert node.metric("flexmig_planned_actions", action="create_instance") == 1
        assert node.metric("flexmig_plan_cost_seconds") == 5.0  # reconfigure_s of the create
        assert node.layout() == {0: []}, "advise changed the node"
        assert node.jobs()["queued"]["state"] == "pending"
        assert node.metric("flexmig_actions_total", action="start", outcome="completed") == 0

        node.hup("act")
        wait_until(lambda: node.jobs()["queued"]["state"] == "running", what="the planner starts the queued job")
        assert node.layout() == {0: [(start, "1g.18gb")]}, "act ran the plan advise published"
        wait_until(
            lambda: node.metric("flexmig_actions_total", action="start", outcome="completed") == 1, what="counted"
        )
        flexmig(node.sock, "stop", "queued")

    events = valid(collect_events(broker.port, "modes-node", client_id="modes-watcher"))
    advised = of_kind(events, EventKind.PLAN_PROPOSED, mode="advise")
    assert len(advised) == 1, "an unchanged plan is published once"
    actions = advised[0]["actions"]
    assert [(a["action"], a["target"]) for a in actions] == [  # type: ignore[attr-defined]
        ("create_instance", f"gpu0:1g.18gb@{start}"),
        ("start", "job queued"),
    ]
    assert all(a["reason"] for a in actions)  # type: ignore[attr-defined]
    assert of_kind(events, EventKind.PLAN_PROPOSED, mode="act")
    first_action = next(i for i, e in enumerate(events) if e.kind is EventKind.ACTION_STARTED)
    first_plan = next(i for i, e in enumerate(events) if e.kind is EventKind.PLAN_PROPOSED)
    assert first_plan < first_action, "nothing acted before mode act"


# ----------------------------------------------------------------------------------------------- SIGTERM


def start_migration(node: ActNode, job: str) -> subprocess.Popen[str]:
    """``flexmig jobs migrate JOB`` in the background, returned once the daemon logged the move's start."""
    cli = subprocess.Popen(
        [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(node.sock), "migrate", job],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_until(lambda: f"migrate job {job}" in node.log.read_text(), what="the migration started")
    return cli


def test_sigterm_during_a_migration_lets_it_finish_before_the_daemon_exits(base: Path) -> None:
    with act_node(base, "h200") as node:
        flexmig(node.sock, "submit", str(write_spec(base / "slow.toml", counter_spec(base, "slow", step_time=1.5))))
        wait_until(lambda: len(log_lines(base / "slow.log")) >= 2, what="slow runs")
        cli = start_migration(node, "slow")
        assert node.stop() == 0
        cli.communicate(timeout=30)
        log = node.log.read_text()
        assert "stopping: waiting up to 60 s for the action in flight" in log
        assert node.unfinished_plans() == [], log
        job = node.jobs()["slow"]
        assert job["state"] == "running" and job["generation"] == 2
        live = PsutilScanner().find(job_uid(node.journal, "slow") or "")
        assert [f.generation for f in live] == [2], "the job runs once, on its new instance"
        (new,) = [(i["start"], i["profile"]) for i in job["instances"]]
        assert node.layout() == {0: [new]}, "the move's old instance was destroyed before the daemon exited"

        node.start()  # the next start adopts the running rank (the control socket answers from before that)
        wait_until(lambda: "adopted" in node.log.read_text(), what="the running rank adopted")
        status = node.cli_json("status")
        assert [(s, j) for s, _, _, j in instances_of(status, 0)] == [(new[0], "slow")]
        flexmig(node.sock, "stop", "slow")


def test_sigterm_past_the_grace_time_leaves_the_move_to_the_journal_and_the_next_start_finishes_it(
    base: Path,
) -> None:
    with act_node(base, "h200", grace_s=0.2) as node:
        flexmig(node.sock, "submit", str(write_spec(base / "slow.toml", counter_spec(base, "slow", step_time=3.0))))
        wait_until(lambda: len(log_lines(base / "slow.log")) >= 2, what="slow runs")
        cli = start_migration(node, "slow")
        assert node.stop() == 0
        cli.communicate(timeout=30)
        first_log = node.log.read_text()
        assert "an action is still running after 0 s" in first_log and "Traceback" not in first_log
        assert node.unfinished_plans() != [], "the move is left to the journal"

        node.start()  # reconciliation finishes the move from its first step not done
        wait_until(lambda: node.unfinished_plans() == [], what="the move finished")
        job = node.jobs()["slow"]
        assert job["state"] == "running" and job["generation"] == 2
        live = PsutilScanner().find(job_uid(node.journal, "slow") or "")
        assert [f.generation for f in live] == [2], "the job runs once"
        (new,) = [(i["start"], i["profile"]) for i in job["instances"]]
        assert node.layout() == {0: [new]}, "no instance leaked or missing"
        lines = started_twice(base / "slow.log")
        (ckpt,) = [e for e in lines if e["event"] == "checkpoint"]
        resumed = [e for e in lines if e["event"] == "start"][1]
        assert resumed["step"] == ckpt["step"] + 1 and resumed["total"] == ckpt["total"]
        flexmig(node.sock, "stop", "slow")
