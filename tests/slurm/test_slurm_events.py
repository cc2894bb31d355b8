"""The Slurm events as the daemon makes them (:mod:`flexmig.mqtt.slurm_events`) validate against the schema."""

from __future__ import annotations

import itertools
import json

from flexmig.mqtt.events import EventFactory, EventKind
from support.event_samples import slurm_events
from support.schemas import validator


def test_each_slurm_event_kind_validates() -> None:
    events_schema = validator("event.v1.schema.json")
    ids = (f"id-{n}" for n in itertools.count())
    events = slurm_events(EventFactory("n1", clock=lambda: 1_700_000_000.0, new_id=lambda: next(ids)))
    assert {e.kind for e in events} == {k for k in EventKind if k.value.startswith("slurm_")}
    for e in events:
        errors = [err.message for err in events_schema.iter_errors(json.loads(e.to_json()))]
        assert errors == [], (e.kind, errors)
    plan = next(e for e in events if e.kind is EventKind.SLURM_PLAN)
    assert plan.payload["changes"] == ["destroy gpu0:7g.141gb@0", "create gpu0:1g.18gb@0"]
