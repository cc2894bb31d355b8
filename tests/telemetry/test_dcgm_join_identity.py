"""A dcgm-exporter row joins an instance only if it can be about that instance, not one that had its ID before.

dcgm-exporter keys rows by (``gpu``, ``GPU_I_ID``); drivers give the next instance on the same slices the ID of the
one destroyed there (and ``FLEXMIG_SIM_IDS=adversarial`` gives any instance any free ID of its size), so a row
keyed like ours can describe a destroyed instance. Rows are built here from the simulator's truth, with the
profile and scrape time a real exporter would have had.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flexmig.nvml import Nvml
from flexmig.sim import SimNode, install, uninstall
from flexmig.telemetry.dcgm import DcgmInstance, DcgmScrape
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import InstanceSnapshot, SamplingStats
from flexmig.telemetry.store import TelemetryStore

STATS = SamplingStats(1, 0.0, 0.0, 0.0, 1, {}, {})


@pytest.fixture
def node() -> Iterator[SimNode]:
    # ids="driver": the 2g.10gb at 2 and a 1g.10gb put there after it own the same quarter, so the same GI ID.
    yield install("a100-40:2g.10gb@2", ids="driver")
    uninstall()


def row(node: SimNode, start: int, profile: str, sm: float) -> DcgmInstance:
    g = node.gpu(0)
    return DcgmInstance(0, g.gi_id_at(start), g.uuid, profile, "legacy", sm_active=sm)


def instance(store: TelemetryStore, nvml: Nvml, now: float, scrape: DcgmScrape) -> InstanceSnapshot:
    inv = nvml.inventory()
    store.set_inventory(inv)
    snap = store.build(nvml.sample(), now=now, wall=1e9 + now, stats=STATS, dcgm=scrape)
    (inst,) = snap.gpus[0].instances
    return inst


def test_a_row_of_a_destroyed_instance_is_not_joined_to_the_one_that_took_its_id(node: SimNode) -> None:
    store = TelemetryStore(TelemetrySettings(), "node")
    with Nvml.open() as nvml:
        old = row(node, 2, "2g.10gb", 0.9)
        first = instance(store, nvml, 10.0, DcgmScrape(10.5, "legacy", {(0, old.gpu_instance_id): old}))
        assert first.activity is not None and first.activity.sm_active == pytest.approx(0.9)  # the right instance
        gi_id = first.gpu_instance_id
        nvml.destroy_instance(0, gi_id)
        new = nvml.create_instance(0, "1g.10gb", 2)
        assert new.gpu_instance_id == gi_id  # the driver gave the new instance the old one's ID
        # The exporter has not caught up: its newest row still describes the 2g.10gb, scraped after the change.
        stale = DcgmScrape(20.5, "legacy", {(0, gi_id): old})
        assert instance(store, nvml, 20.0, stale).activity is None
        # A row scraped before the 1g.10gb was first seen cannot be about it, whatever profile it names.
        early = row(node, 2, "1g.10gb", 0.4)
        assert instance(store, nvml, 21.0, DcgmScrape(19.0, "legacy", {(0, gi_id): early})).activity is None
        # Once the exporter lists the new instance, its row joins.
        fresh = instance(store, nvml, 22.0, DcgmScrape(21.5, "legacy", {(0, gi_id): early}))
        assert fresh.activity is not None and fresh.activity.sm_active == pytest.approx(0.4)
