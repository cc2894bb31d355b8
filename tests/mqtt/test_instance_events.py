"""instance_created / instance_destroyed events describe each instance as it was, even when an instance is destroyed
and another created at the same place between two sweeps (the destroyed one keeps its own MIG UUID and profile).

Pure detection first, then the daemon's own path: the real NVML code over the simulator, the telemetry store,
the detection enricher and the event publisher (whose outbox is read back; nothing is sent anywhere).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexmig.detect import DetectSettings, DetectState, Observation, observe
from flexmig.mig import H200, Layout
from flexmig.mqtt.events import EventFactory, EventKind, events_from_report
from flexmig.mqtt.findings import FindingsPublisher
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings
from flexmig.nvml import Nvml
from flexmig.service.detection import Detector
from flexmig.sim import SimNode, install, uninstall
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import SamplingStats, Snapshot
from flexmig.telemetry.store import TelemetryStore

S = DetectSettings()
THREE_G = Layout.of(H200, [("3g.71gb", 0)])
TWO_G = Layout.of(H200, [("2g.35gb", 0)])


def step(state: DetectState, now: float, layout: Layout, uuid: str) -> tuple[DetectState, Any]:
    return observe(state, Observation(now=now, layouts={0: layout}, uuids={(0, 0): uuid}), S)


# ------------------------------------------------------------------------------------------------ detection


def test_an_instance_replaced_by_one_of_the_same_profile_at_the_same_start_is_destroyed_and_created() -> None:
    state, _ = step(DetectState(), 0, THREE_G, "MIG-old")
    _, report = step(state, 1, THREE_G, "MIG-new")
    assert [(c.start, c.profile, c.uuid) for c in report.destroyed] == [(0, "3g.71gb", "MIG-old")]
    assert [(c.start, c.profile, c.uuid) for c in report.created] == [(0, "3g.71gb", "MIG-new")]


def test_an_instance_replaced_by_another_profile_at_the_same_start_keeps_its_own_uuid() -> None:
    state, _ = step(DetectState(), 0, THREE_G, "MIG-old")
    _, report = step(state, 1, TWO_G, "MIG-new")
    assert [(c.profile, c.uuid) for c in report.destroyed] == [("3g.71gb", "MIG-old")]
    assert [(c.profile, c.uuid) for c in report.created] == [("2g.35gb", "MIG-new")]


def test_an_unchanged_instance_is_not_reported_and_an_unknown_uuid_is_no_change() -> None:
    state, _ = step(DetectState(), 0, THREE_G, "MIG-old")
    state, report = step(state, 1, THREE_G, "MIG-old")
    assert report.destroyed == () and report.created == ()
    # a GPU instance seen once without a MIG device (no UUID) is the same instance
    _, report = observe(state, Observation(now=2, layouts={0: THREE_G}), S)
    assert report.destroyed == () and report.created == ()


def test_events_of_a_report_made_without_uuids_take_the_destroyed_ones_from_the_previous_sweep() -> None:
    state, _ = observe(DetectState(), Observation(now=0, layouts={0: THREE_G}), S)
    _, report = observe(state, Observation(now=1, layouts={0: TWO_G}), S)
    factory = EventFactory("node-1", clock=lambda: 0.0, new_id=lambda: "id")
    events = events_from_report(report, factory, instance_uuids={(0, 0): "MIG-new"}, previous_uuids={(0, 0): "MIG-old"})
    by_kind = {e.kind: dict(e.payload) for e in events}
    assert by_kind[EventKind.INSTANCE_DESTROYED] == {"gpu": 0, "start": 0, "profile": "3g.71gb", "uuid": "MIG-old"}
    assert by_kind[EventKind.INSTANCE_CREATED] == {"gpu": 0, "start": 0, "profile": "2g.35gb", "uuid": "MIG-new"}


# ------------------------------------------------------------------------------------------------ the daemon's path


@pytest.fixture
def node() -> Iterator[SimNode]:
    yield install("h200:3g.71gb@0+2g.35gb@4")
    uninstall()


class Pipeline:
    """What flexmigd runs per sweep, synchronously: NVML inventory and sample, snapshot, detection, events."""

    def __init__(self, nvml: Nvml, outbox: Outbox) -> None:
        self.nvml = nvml
        self.store = TelemetryStore(TelemetrySettings(), "node-1")
        self.detector = Detector(S)
        self.outbox = outbox
        publisher = MqttPublisher(PublisherSettings(broker="127.0.0.1:1", node="node-1"), outbox)
        self.events = FindingsPublisher(publisher, self.detector, "node-1")
        self.sweeps = 0

    def sweep(self) -> Snapshot:
        self.sweeps += 1
        self.store.set_inventory(self.nvml.inventory())
        stats = SamplingStats(self.sweeps, 0.0, 0.0, 0.0, self.sweeps, {}, {})
        snap = self.store.build(self.nvml.sample(), now=float(self.sweeps), wall=1e9 + self.sweeps, stats=stats)
        snap = self.detector.enrich(snap)
        self.events(snap)
        return snap

    def published(self, kind: EventKind) -> list[dict[str, Any]]:
        return [json.loads(e.body)["payload"] for e in self.outbox.peek(1000) if e.kind == kind.value]


@pytest.mark.parametrize("profile", ["3g.71gb", "4g.71gb"])
def test_a_destroy_then_a_create_at_the_same_start_within_one_sweep_window_publishes_each_instance_as_it_was(
    node: SimNode, tmp_path: Path, profile: str
) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    with Nvml.open() as nvml:
        pipeline = Pipeline(nvml, outbox)
        before = pipeline.sweep()
        (old,) = [i for i in before.instances() if i.start == 0]
        # between two sweeps: the 3g at slice 0 goes, and a new instance takes its place
        nvml.destroy_instance(0, old.gpu_instance_id)
        if profile == "4g.71gb":
            nvml.destroy_instance(0, next(i for i in before.instances() if i.start == 4).gpu_instance_id)
        created = nvml.create_instance(0, profile, 0)
        pipeline.sweep()
    destroyed = [p for p in pipeline.published(EventKind.INSTANCE_DESTROYED) if p["start"] == 0]
    assert destroyed == [{"gpu": 0, "start": 0, "profile": "3g.71gb", "uuid": old.mig_uuid}]
    assert pipeline.published(EventKind.INSTANCE_CREATED) == [
        {"gpu": 0, "start": 0, "profile": profile, "uuid": created.uuid}
    ]
    assert created.uuid != old.mig_uuid
    outbox.close()
