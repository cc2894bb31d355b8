"""The actuator's events as fleet events, and its actions as Prometheus families: schema, content, promtool."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from flexmig.act.events import ActEvent
from flexmig.metrics.actions import ACTIONS, OUTCOMES, ActionMetrics
from flexmig.metrics.collector import SnapshotCollector
from flexmig.mqtt.events import EventFactory, EventKind
from flexmig.telemetry.snapshot import SamplingStats, Snapshot
from support.event_samples import act_events, actuator_events, facts

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "event.v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
T0 = 1_700_000_000.0


def factory() -> EventFactory:
    ids = (f"id-{n}" for n in itertools.count())
    return EventFactory("node-1", clock=lambda: T0, new_id=lambda: next(ids))


def test_every_actuator_event_becomes_a_fleet_event_that_validates_against_the_schema() -> None:
    events = actuator_events(factory())
    assert len(events) == len(act_events()) + 1
    for e in events:
        errors = [err.message for err in VALIDATOR.iter_errors(json.loads(e.to_json()))]
        assert errors == [], (e.kind, errors)
    assert {e.kind for e in events} == {
        EventKind.RECONCILED,
        EventKind.ACTION_STARTED,
        EventKind.ACTION_COMPLETED,
        EventKind.ACTION_FAILED,
        EventKind.ACTION_CANCELLED,
        EventKind.ACTION_SKIPPED,
        EventKind.JOB_STARTED,
        EventKind.JOB_EXITED,
        EventKind.JOB_FAILED,
        EventKind.PLAN_PROPOSED,
    }


def test_a_completed_move_says_its_target_plan_origin_steps_and_downtime() -> None:
    by_id = {(e.kind, e.payload.get("action_id")): e.payload for e in actuator_events(factory())}
    done = by_id[(EventKind.ACTION_COMPLETED, "2")]
    assert done["target"] == "job train" and done["job"] == "train"
    assert done["plan_id"] == 1 and done["origin"] == "planner"
    assert done["downtime_s"] == 0.031
    assert [s["step"] for s in done["steps"]] == ["clear_ack", "request", "await_ack", "await_exit", "launch"]
    created = by_id[(EventKind.ACTION_COMPLETED, "1")]
    assert created["target"] == "gpu0:1g.18gb@2" and created["job"] is None


def test_an_action_started_without_a_reason_says_who_asked_and_whether_it_resumes() -> None:
    started = [e.payload for e in actuator_events(factory()) if e.kind is EventKind.ACTION_STARTED]
    migrate = next(p for p in started if p["action"] == "migrate")
    assert migrate["reason"] == "migrate asked by planner" and migrate["resumed"] is True


def test_cancelled_and_skipped_actions_keep_their_own_kinds_and_reasons() -> None:
    events = actuator_events(factory())
    cancelled = next(e.payload for e in events if e.kind is EventKind.ACTION_CANCELLED)
    assert "did not acknowledge" in cancelled["error"]
    skipped = next(e.payload for e in events if e.kind is EventKind.ACTION_SKIPPED)
    assert skipped["reason"] == "an earlier action of the plan did not complete"


def test_job_events_say_what_happened_in_words() -> None:
    events = actuator_events(factory())
    started = next(e.payload for e in events if e.kind is EventKind.JOB_STARTED)
    assert started["reason"] == "generation 2 on gpu0:1g.18gb@2, gpu0:1g.18gb@3, resuming after step 41"
    exits = [e.payload for e in events if e.kind is EventKind.JOB_EXITED]
    assert exits[0]["reason"] == "rank 0 of job train exited with status 0"
    assert exits[1]["state"] == "done" and "is done" in exits[1]["reason"]
    reconciled = next(e.payload for e in events if e.kind is EventKind.RECONCILED)
    assert reconciled["adopted"] == {"train": [101, 102]} and reconciled["resumed_plans"] == 1


def test_a_proposed_plan_lists_each_action_with_its_reason_and_cost() -> None:
    plan = next(e.payload for e in actuator_events(factory()) if e.kind is EventKind.PLAN_PROPOSED)
    assert [(a["action"], a["target"], a["cost_s"]) for a in plan["actions"]] == [
        ("create_instance", "gpu0:1g.18gb@2", 5.0),
        ("start", "job queued", 0.0),
        ("migrate", "job train", 9.0),
    ]
    assert plan["actions"][2]["from"] == ["gpu0:1g.18gb@0"] and plan["actions"][2]["to"] == ["gpu0:1g.18gb@2"]
    assert plan["cost_s"] == 14.0 and plan["mode"] == "advise" and plan["notes"] == ["queued waits"]


def test_the_schema_refuses_an_action_event_without_its_error() -> None:
    bad = factory().make(
        EventKind.ACTION_CANCELLED, {"action_id": "1", "action": "migrate", "target": "job x", "duration_s": 1.0}
    )
    assert list(VALIDATOR.iter_errors(json.loads(bad.to_json())))


# -------------------------------------------------------------------------------------------------- metrics


def snapshot(host: str = "node-1") -> Snapshot:
    stats = SamplingStats(1, 0.01, 0.01, 0.01, 1, {}, {})
    return Snapshot(T0, 1.0, host, "570", "12", 60.0, (), stats)


def exposition(metrics: ActionMetrics) -> str:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(snapshot, [metrics]))
    return generate_latest(registry).decode()


def test_action_counters_exist_at_zero_before_any_action_and_histograms_once_an_action_ran() -> None:
    text = exposition(ActionMetrics())
    for action in ACTIONS:
        for outcome in OUTCOMES:
            assert f'flexmig_actions_total{{Hostname="node-1",action="{action}",outcome="{outcome}"}} 0.0' in text
    assert 'flexmig_actions_in_progress{Hostname="node-1"} 0.0' in text
    assert 'flexmig_jobs{Hostname="node-1",state="running"} 0.0' in text
    assert "# TYPE flexmig_job_downtime_seconds histogram" in text  # declared, with no series until a move ran
    assert "flexmig_job_downtime_seconds_count{" not in text and "flexmig_action_duration_seconds_count{" not in text


def test_actions_are_counted_by_outcome_with_their_durations_and_move_downtimes() -> None:
    m = ActionMetrics()
    translate_free = act_events()
    for e in translate_free:
        m.record(e, facts(e.action_id or 0).downtime_s if e.kind in ("action_completed", "action_failed") else None)
    m.set_jobs({"running": 2, "pending": 1})
    text = exposition(m)
    assert 'flexmig_actions_total{Hostname="node-1",action="migrate",outcome="completed"} 1.0' in text
    assert 'flexmig_actions_total{Hostname="node-1",action="resplit",outcome="failed"} 1.0' in text
    assert 'flexmig_actions_total{Hostname="node-1",action="migrate",outcome="cancelled"} 1.0' in text
    assert 'flexmig_actions_total{Hostname="node-1",action="destroy_instance",outcome="skipped"} 1.0' in text
    assert 'flexmig_action_duration_seconds_count{Hostname="node-1",action="migrate"} 2.0' in text
    assert 'flexmig_action_duration_seconds_sum{Hostname="node-1",action="migrate"} 32.2' in text
    assert 'flexmig_move_pause_seconds_bucket{Hostname="node-1",action="migrate",le="0.1"} 1.0' in text
    assert 'flexmig_move_pause_seconds_sum{Hostname="node-1",action="resplit"} 0.5' in text
    assert "flexmig_job_downtime_seconds_sum" not in text, "the job's own downtime comes from the job, not the move"
    m.record_job_downtime("migrate", 0.18)
    text = exposition(m)
    assert 'flexmig_job_downtime_seconds_bucket{Hostname="node-1",action="migrate",le="0.25"} 1.0' in text
    assert 'flexmig_job_downtime_seconds_count{Hostname="node-1",action="migrate"} 1.0' in text
    assert 'flexmig_jobs{Hostname="node-1",state="pending"} 1.0' in text
    # the started-but-unfinished migrate of action 2 finished; nothing runs now
    assert 'flexmig_actions_in_progress{Hostname="node-1"} 0.0' in text


def test_an_action_is_in_progress_from_its_start_to_its_end() -> None:
    m = ActionMetrics()
    m.record(ActEvent("action_started", T0, action="migrate", action_id=7, job="x"))
    assert m.in_progress() == 1
    m.record(ActEvent("action_completed", T0 + 1, action="migrate", action_id=7, job="x", duration_s=1.0))
    assert m.in_progress() == 0


def test_planner_rounds_and_the_last_plan_are_exported() -> None:
    m = ActionMetrics()
    m.record_plan(["create_instance", "start"], 5.0)
    m.record_plan_failure()
    text = exposition(m)
    assert 'flexmig_planner_runs_total{Hostname="node-1"} 2.0' in text
    assert 'flexmig_planner_failures_total{Hostname="node-1"} 1.0' in text
    assert 'flexmig_planned_actions{Hostname="node-1",action="start"} 1.0' in text
    assert 'flexmig_planned_actions{Hostname="node-1",action="migrate"} 0.0' in text
    assert 'flexmig_plan_cost_seconds{Hostname="node-1"} 5.0' in text


@pytest.mark.integration
@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool (Debian package prometheus)")
def test_the_action_families_pass_promtool_check_metrics() -> None:
    m = ActionMetrics()
    for e in act_events():
        m.record(e, 0.2 if e.kind == "action_completed" and e.action == "migrate" else None)
    m.record_plan(["start"], 1.0)
    out = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=exposition(m), capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and out.stdout == "" and out.stderr == "", out.stdout + out.stderr
