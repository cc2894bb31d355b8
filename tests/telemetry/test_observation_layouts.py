"""Detection's layouts from snapshots: a GPU made as at the last sweep gets its last layout back without the layout
being worked out again, and any change of what a layout is made of shows in the very next observation."""

from __future__ import annotations

import dataclasses

from flexmig.mig import Offer
from flexmig.telemetry.observation import LayoutCache, observation_of
from flexmig.telemetry.ring import WindowStats
from flexmig.telemetry.snapshot import GpuInstanceSnapshot, GpuSnapshot, InstanceSnapshot, SamplingStats, Snapshot

GIB = 2**30
# 3g.71gb is profile 9 (4 memory slices), 1g.18gb profile 19 (1), 2g.35gb profile 14 (2) on an H200.
SIZES = {9: ("3g.71gb", 4, 3), 19: ("1g.18gb", 1, 1), 14: ("2g.35gb", 2, 2)}
OFFERS = (Offer(19, 18_176, 7), Offer(14, 35_840, 3), Offer(9, 71_680, 2))


def _gi(gi_id: int, profile_id: int, start: int) -> GpuInstanceSnapshot:
    name, memory, compute = SIZES[profile_id]
    return GpuInstanceSnapshot(gi_id, profile_id, name, start, memory, compute, 1)


def _instance(gpu: int, gi_id: int, profile_id: int, start: int, processes: int = 0) -> InstanceSnapshot:
    name, memory, compute = SIZES[profile_id]
    window = WindowStats(60.0, 60, 59.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return InstanceSnapshot(
        gpu_index=gpu, gpu_uuid=f"GPU-{gpu}", model_name="NVIDIA H200", mig_uuid=f"MIG-{gpu}-{gi_id}",
        mig_index=gi_id, gpu_instance_id=gi_id, compute_instance_id=0, profile_id=profile_id, profile_name=name,
        start=start, memory_slices=memory, compute_slices=compute, memory_total_bytes=18 * GIB * memory,
        memory_used_bytes=0, processes=(), activity=None, sm_active_window=window, memory_used_window=window,
        idle_seconds=2.0 + processes, first_seen=0.0,
    )  # fmt: skip


def _gpu(index: int, instances: tuple[InstanceSnapshot, ...], gis: tuple[GpuInstanceSnapshot, ...]) -> GpuSnapshot:
    return GpuSnapshot(
        index=index, uuid=f"GPU-{index}", model_name="NVIDIA H200", memory_total_bytes=None, power_w=None,
        temperature_c=None, sm_clock_mhz=None, mem_clock_mhz=None, mig_current=True, lost=False,
        free_compute_slices=None, free_memory_slices=None, creatable={}, instances=instances, gpu_instances=gis,
        offers=OFFERS,
    )  # fmt: skip


def _snapshot(t: float, *gpus: GpuSnapshot) -> Snapshot:
    return Snapshot(
        taken_at=1e9 + t, monotonic=t, hostname="node-1", driver_version=None, nvml_version=None, window_s=60.0,
        gpus=gpus, stats=SamplingStats(1, 0.0, 0.0, 0.0, 1, {}, {}),
    )  # fmt: skip


def _specs(snap: Snapshot, cache: LayoutCache) -> dict[int, str]:
    layouts = observation_of(snap, snap.monotonic, cache).observation.layouts
    fresh = observation_of(snap, snap.monotonic).observation.layouts  # no cache: worked out from scratch
    got = {i: layout.spec() for i, layout in layouts.items()}
    assert got == {i: layout.spec() for i, layout in fresh.items()}
    return got


def test_a_gpu_made_as_at_the_last_sweep_gets_its_last_layout_back() -> None:
    gis = (_gi(1, 9, 0), _gi(2, 19, 4))
    cache = LayoutCache()
    first = observation_of(_snapshot(1.0, _gpu(0, (_instance(0, 1, 9, 0), _instance(0, 2, 19, 4)), gis)), 1.0, cache)
    # The next sweep: new instance objects (their readings changed), the inventory's GPU instances the same objects.
    again = _snapshot(2.0, _gpu(0, (_instance(0, 1, 9, 0, processes=1), _instance(0, 2, 19, 4)), gis))
    second = observation_of(again, 2.0, cache)
    assert second.observation.layouts[0] is first.observation.layouts[0]
    assert second.observation.layouts[0].spec() == "3g.71gb@0+1g.18gb@4"


def test_a_mig_device_at_a_placement_the_inventory_has_not_seen_shows_in_the_very_next_layout() -> None:
    gis = (_gi(1, 9, 0),)
    cache = LayoutCache()
    assert _specs(_snapshot(1.0, _gpu(0, (_instance(0, 1, 9, 0),), gis)), cache) == {0: "3g.71gb@0"}
    # A device sampled before the next inventory, on the same inventory objects: its slices are taken at once...
    grown = (_instance(0, 1, 9, 0), _instance(0, 3, 19, 5))
    assert _specs(_snapshot(2.0, _gpu(0, grown, gis)), cache) == {0: "3g.71gb@0+1g.18gb@5"}
    # ...another one in its place shows too, and its going away as well.
    moved = (_instance(0, 1, 9, 0), _instance(0, 3, 19, 6))
    assert _specs(_snapshot(3.0, _gpu(0, moved, gis)), cache) == {0: "3g.71gb@0+1g.18gb@6"}
    assert _specs(_snapshot(4.0, _gpu(0, (_instance(0, 1, 9, 0),), gis)), cache) == {0: "3g.71gb@0"}


def test_a_new_inventory_with_another_layout_shows_in_the_very_next_layout() -> None:
    gis = (_gi(1, 9, 0),)
    cache = LayoutCache()
    assert _specs(_snapshot(1.0, _gpu(0, (_instance(0, 1, 9, 0),), gis)), cache) == {0: "3g.71gb@0"}
    created = (_gi(1, 9, 0), _gi(2, 14, 4))  # a GPU instance without a MIG device yet holds its slices
    assert _specs(_snapshot(2.0, _gpu(0, (_instance(0, 1, 9, 0),), created)), cache) == {0: "3g.71gb@0+2g.35gb@4"}
    destroyed = (_gi(2, 14, 4),)
    assert _specs(_snapshot(3.0, _gpu(0, (), destroyed)), cache) == {0: "2g.35gb@4"}


def test_two_gpus_on_the_same_inventory_objects_keep_their_own_layouts() -> None:
    gis = (_gi(1, 9, 0),)
    cache = LayoutCache()
    two = _snapshot(1.0, _gpu(0, (_instance(0, 1, 9, 0),), gis), _gpu(1, (_instance(1, 2, 19, 4),), gis))
    assert _specs(two, cache) == {0: "3g.71gb@0", 1: "3g.71gb@0+1g.18gb@4"}
    swapped = _snapshot(2.0, _gpu(0, (_instance(0, 2, 19, 4),), gis), _gpu(1, (_instance(1, 1, 9, 0),), gis))
    assert _specs(swapped, cache) == {0: "3g.71gb@0+1g.18gb@4", 1: "3g.71gb@0"}


def test_other_offers_make_another_layout_at_once() -> None:
    gis = (_gi(1, 9, 0),)
    cache = LayoutCache()
    gpu = _gpu(0, (_instance(0, 1, 9, 0),), gis)
    assert _specs(_snapshot(1.0, gpu), cache) == {0: "3g.71gb@0"}
    no_3g = dataclasses.replace(gpu, offers=OFFERS[:2])  # a driver that offers no 3g.71gb: the layout is unmodelled
    assert _specs(_snapshot(2.0, no_3g), cache) == {}
