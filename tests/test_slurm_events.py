"""The Slurm events as the daemon makes them (:mod:`flexmig.export.slurm_events`) validate against the schema."""

from __future__ import annotations

import itertools
import json

from flexmig.export.events import Event, EventFactory, EventKind
from flexmig.export.slurm_events import job_event, plan_event, reachable_event, unreachable_event
from flexmig.mig import H200
from flexmig.plan.reregistration import Verdict
from flexmig.plan.types import CreateInstance, DestroyInstance, Plan


def slurm_events(fac: EventFactory) -> list[Event]:
    """One of each Slurm event kind, with realistic payloads."""
    plan = Plan(
        (
            DestroyInstance(0, 0, H200.profile("7g.141gb"), "make room", 3.0),
            CreateInstance(0, 0, H200.profile("1g.18gb"), "start slurm-7", 3.0),
        )
    )
    verdict = Verdict(True, 7.0, 3582.0, 70.0, "serves 1 waiting job(s): drain ~7 s", ("slurm-7",))
    return [
        unreachable_event(fac, "n1", "squeue --json: no answer within 30 s (is slurmctld up?)"),
        reachable_event(fac, "n1", 42.0),
        plan_event(fac, "n1", "act", verdict, plan, checkpoint=[5]),
        job_event(fac, "n1", "slurm_job_signalled", {"slurm_job": 5, "signal": "USR1"}),
        job_event(fac, "n1", "slurm_job_requeued", {"slurm_job": 5, "step": 120}),
        job_event(fac, "n1", "slurm_job_released", {"slurm_job": 5}),
    ]


def test_each_slurm_event_kind_validates() -> None:
    from test_events_schema import EVENTS  # noqa: PLC0415 - the schema's validator, built once there

    ids = (f"id-{n}" for n in itertools.count())
    events = slurm_events(EventFactory("n1", clock=lambda: 1_700_000_000.0, new_id=lambda: next(ids)))
    assert {e.kind for e in events} == {k for k in EventKind if k.value.startswith("slurm_")}
    for e in events:
        errors = [err.message for err in EVENTS.iter_errors(json.loads(e.to_json()))]
        assert errors == [], (e.kind, errors)
    plan = next(e for e in events if e.kind is EventKind.SLURM_PLAN)
    assert plan.payload["changes"] == ["destroy gpu0:7g.141gb@0", "create gpu0:1g.18gb@0"]
