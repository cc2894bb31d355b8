"""Events and the retained state: every kind validates against the published JSON Schema, and round-trips."""

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from flexmig.detect import DetectSettings, DetectState, FragmentationSettings, InstanceUsage, Observation, observe
from flexmig.mig import H200, Layout
from flexmig.mqtt.events import Deduplicator, Event, EventFactory, EventKind, events_from_report
from flexmig.mqtt.state import state_document
from support.event_samples import actuator_events, slurm_events

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
EVENT_SCHEMA = json.loads((SCHEMAS / "event.v1.schema.json").read_text())
STATE_SCHEMA = json.loads((SCHEMAS / "state.v1.schema.json").read_text())
GIB = 2**30


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


EVENTS = validator(EVENT_SCHEMA)
STATE = validator(STATE_SCHEMA)


def factory() -> EventFactory:
    ids = (f"id-{n}" for n in itertools.count())
    return EventFactory("node-1", clock=lambda: 1_700_000_000.0, new_id=lambda: next(ids))


def scenario() -> tuple[list[Event], list[dict[str, Any]]]:
    """A short life of one H200: instances come and go, one idles, one is oversized, the GPU fragments and
    is repacked, another GPU is lost. Returns every event and the last state documents."""
    settings = DetectSettings(fragmentation=FragmentationSettings(enter=0.35, exit=0.25, enter_after_s=0))
    fac = factory()
    a = Layout.of(H200, [("3g.71gb", 0), ("2g.35gb", 4)])
    b = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    c = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 2)])

    def w(t: float, start: int, profile: str, activity: float, used_gib: float, procs: int) -> InstanceUsage:
        total = H200.profile(profile).memory_mib * 2**20
        return InstanceUsage(0, start, profile, t, 60.0, activity, activity, int(used_gib * GIB), total, procs)

    steps: list[tuple[float, dict[int, Layout], tuple[InstanceUsage, ...], frozenset[int]]] = [
        (0, {0: a, 1: c}, (), frozenset())
    ]
    steps += [
        (t, {0: a, 1: c}, (w(t, 0, "3g.71gb", 0.0, 0.1, 0), w(t, 4, "2g.35gb", 0.3, 6, 1)), frozenset())
        for t in range(60, 1201, 60)
    ]
    steps += [
        (1260, {0: b, 1: c}, (), frozenset({1})),
        (1320, {0: c}, (), frozenset({1})),
        (1380, {0: c}, (), frozenset({1})),
    ]
    state = DetectState()
    events: list[Event] = []
    docs: list[dict[str, Any]] = []
    for now, layouts, usage, lost in steps:
        state, report = observe(state, Observation(now=now, layouts=layouts, usage=usage, lost_gpus=lost), settings)
        events += events_from_report(report, fac, instance_uuids={(0, 0): "MIG-aaaa"}, gpu_uuids={1: "GPU-1"})
        docs.append(state_document("node-1", report, layouts, gpu_uuids={0: "GPU-0"}, lost=lost, mode="observe"))
    events += actuator_events(fac)  # the actuator's kinds, as the daemon makes them (tests/mqtt/test_action_events.py)
    events += slurm_events(fac)  # and the Slurm side's (tests/slurm/test_slurm_events.py)
    return events, docs


def test_every_event_kind_occurs_in_the_scenario_and_validates() -> None:
    events, _ = scenario()
    assert {e.kind for e in events} == set(EventKind)
    for e in events:
        errors = [err.message for err in EVENTS.iter_errors(json.loads(e.to_json()))]
        assert errors == [], (e.kind, errors)


def test_underuse_events_say_which_finding_and_why() -> None:
    events, _ = scenario()
    started = {e.payload["finding"]: e.payload for e in events if e.kind is EventKind.UNDERUSE_STARTED}
    assert set(started) == {"idle", "oversized"}
    assert started["idle"]["uuid"] == "MIG-aaaa"
    assert started["oversized"]["suggested_profile"] == "1g.18gb"
    assert "no process ran on 3g.71gb" in started["idle"]["reason"]


def test_every_state_document_validates() -> None:
    _, docs = scenario()
    for doc in docs:
        errors = [f"{list(err.path)}: {err.message}" for err in STATE.iter_errors(doc)]
        assert errors == []
    assert any(g["lost"] for g in docs[-1]["gpus"])


def test_the_schema_refuses_a_payload_of_the_wrong_shape() -> None:
    event = factory().make(EventKind.INSTANCE_CREATED, {"gpu": 0, "start": 9, "profile": "3g.71gb", "uuid": None})
    assert any("maximum" in err.message or "9" in err.message for err in EVENTS.iter_errors(event.to_dict()))
    event = factory().make(EventKind.GPU_LOST, {"gpu": 0})
    assert list(EVENTS.iter_errors(event.to_dict()))


def test_events_round_trip_through_json() -> None:
    for e in scenario()[0]:
        back = Event.from_json(e.to_json().encode())
        assert (back.id, back.kind, back.node, dict(back.payload)) == (e.id, e.kind, e.node, dict(e.payload))
        assert back.at == pytest.approx(e.at, abs=1e-3)


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (b"\xff", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"id": 1}', "'id'"),
        (b'{"id":"x","time":"t","node":"n","kind":"nope","payload":{},"schema_version":1}', "unknown kind"),
        (b'{"id":"x","time":"yesterday","node":"n","kind":"gpu_lost","payload":{},"schema_version":1}', "'time'"),
        (b'{"id":"x","time":"2025-01-01T00:00:00Z","node":"n","kind":"gpu_lost","payload":{}}', "schema_version"),
    ],
)
def test_a_malformed_event_is_refused_with_the_field_named(wire: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Event.from_json(wire)


def test_event_ids_are_unique_by_default() -> None:
    fac = EventFactory("n1")
    assert len({fac.make(EventKind.GPU_LOST, {}).id for _ in range(1000)}) == 1000


def test_a_node_name_must_be_one_topic_level() -> None:
    for bad in ("a/b", "+", "#", "", "-x"):
        with pytest.raises(ValueError, match="topic level"):
            EventFactory(bad)


def test_the_deduplicator_shows_each_id_once_within_its_memory() -> None:
    d = Deduplicator(capacity=2)
    assert [d.first_time(x) for x in ("a", "a", "b", "c", "a")] == [True, False, True, True, True]
