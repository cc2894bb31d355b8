"""Property tests: random create/destroy sequences through pynvml on every GPU model.

Invariants, each checked after every step against an oracle written from NVIDIA's published placement table (not
from flexmig.mig, which the simulator itself uses):
the simulator never lets two instances overlap, refuses every start the table does not allow with
INSUFFICIENT_RESOURCES, keeps GI IDs unique, and flexmig.nvml's inventory always equals the simulator's truth.
"""

from __future__ import annotations

from ctypes import byref, c_uint
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexmig.mig import MODELS, GpuModel
from flexmig.nvml import Nvml
from flexmig.sim import SimNode, install, uninstall

# nvidia-smi mig -lgipp (same on A100-40/80, H100-80, H200): profile ID -> (allowed starts, size, max instances).
PUBLISHED = {
    19: ((0, 1, 2, 3, 4, 5, 6), 1, 7),
    20: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    15: ((0, 2, 4, 6), 2, 4),
    14: ((0, 2, 4), 2, 3),
    9: ((0, 4), 4, 2),
    5: ((0,), 4, 1),
    0: ((0,), 8, 1),
}
COMPUTE = {19: 1, 20: 1, 15: 1, 14: 2, 9: 3, 5: 4, 0: 7}

create_op = st.tuples(
    st.just("create"),
    st.sampled_from(sorted(PUBLISHED)),
    st.one_of(st.none(), st.integers(min_value=0, max_value=7)),  # None: let the driver place it
    st.booleans(),  # also create a compute instance spanning it
)
destroy_op = st.tuples(st.just("destroy"), st.integers(min_value=0, max_value=6), st.booleans(), st.booleans())
ops_strategy = st.lists(st.one_of(create_op, destroy_op), max_size=14)


def allowed(placed: dict[int, tuple[int, int]], profile_id: int, start: int) -> bool:
    """The published rules: a listed start, no shared memory slice, per-profile and per-GPU limits."""
    starts, size, most = PUBLISHED[profile_id]
    if start not in starts:
        return False
    held = {s for pid, st_ in placed.values() for s in range(st_, st_ + PUBLISHED[pid][1])}
    if held & set(range(start, start + size)):
        return False
    if sum(1 for pid, _ in placed.values() if pid == profile_id) >= most or len(placed) >= 7:
        return False
    return sum(COMPUTE[pid] for pid, _ in placed.values()) + COMPUTE[profile_id] <= 7


def check_invariants(model: GpuModel, nvml: Nvml, node: SimNode, placed: dict[int, tuple[int, int]]) -> None:
    truth = node.gpu(0)
    # no overlap, GI IDs unique, and exactly what the oracle accepted
    slices = [s for gi in truth.gpu_instances for s in range(gi.start, gi.start + gi.size)]
    assert len(slices) == len(set(slices))
    assert len(set(truth.gi_ids)) == len(truth.gi_ids)
    assert {gi.id: (gi.profile.profile_id, gi.start) for gi in truth.gpu_instances} == placed
    # the inventory read back through flexmig.nvml equals the ground truth
    gpu = nvml.inventory().gpus[0]
    assert gpu.errors == ()
    assert [(g.id, g.profile_id, g.profile_name, g.start, g.size) for g in gpu.gpu_instances] == [
        (g.id, g.profile.profile_id, g.profile.name, g.start, g.size) for g in truth.gpu_instances
    ]
    assert [[(c.id, c.profile_id, c.start, c.size) for c in g.compute_instances] for g in gpu.gpu_instances] == [
        [(c.id, c.profile_id, c.start, c.slices) for c in g.compute_instances] for g in truth.gpu_instances
    ]
    assert [(d.uuid, d.gpu_instance_id, d.compute_instance_id, d.memory_total_bytes) for d in gpu.mig_devices] == [
        (u, truth.mig_device(u)[0].id, truth.mig_device(u)[1].id, truth.mig_device(u)[0].memory_bytes)
        for u in truth.mig_uuids
    ]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops_strategy)
def test_random_create_destroy_sequences_keep_every_rule(model: GpuModel, ops: list[tuple[Any, ...]]) -> None:
    node = install(model.key)
    try:
        with Nvml.open() as nvml:
            dev = N.nvmlDeviceGetHandleByIndex(0)
            placed: dict[int, tuple[int, int]] = {}
            for op in ops:
                if op[0] == "create":
                    _, profile_id, start, with_ci = op
                    _create(dev, profile_id, start, with_ci, placed)
                else:
                    _, pick, cis_first, _ = op
                    _destroy(dev, pick, cis_first, placed)
                check_invariants(model, nvml, node, placed)
                probe_every_start(dev, placed)
    finally:
        uninstall()


def probe_every_start(dev: Any, placed: dict[int, tuple[int, int]]) -> None:
    """Every (profile, start) pair: created iff the published rules allow it now (then destroyed again)."""
    for profile_id, (_, size, _) in PUBLISHED.items():
        for start in range(8):
            ok = allowed(placed, profile_id, start)
            pl = N.c_nvmlGpuInstancePlacement_t(start, size)
            try:
                gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, byref(pl))
            except N.NVMLError_InvalidArgument:
                assert start not in PUBLISHED[profile_id][0], f"{profile_id}@{start} is a published start"
                continue
            except N.NVMLError_InsufficientResources:
                assert not ok, f"refused {profile_id}@{start} that the published table allows next to {placed}"
                assert start in PUBLISHED[profile_id][0], f"{profile_id}@{start} is no placement: INVALID_ARGUMENT"
                continue
            assert ok, f"accepted {profile_id}@{start} that the published table forbids next to {placed}"
            N.nvmlGpuInstanceDestroy(gi)


def _create(dev: Any, profile_id: int, start: int | None, with_ci: bool, placed: dict[int, tuple[int, int]]) -> None:
    size = PUBLISHED[profile_id][1]
    fits = [s for s in PUBLISHED[profile_id][0] if allowed(placed, profile_id, s)]
    expected = bool(fits) if start is None else allowed(placed, profile_id, start)
    try:
        if start is None:
            gi = N.nvmlDeviceCreateGpuInstance(dev, profile_id)
        else:
            pl = N.c_nvmlGpuInstancePlacement_t(start, size)
            gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, byref(pl))
    except N.NVMLError_InvalidArgument:
        assert start is not None, "INVALID_ARGUMENT without a placement"
        assert start not in PUBLISHED[profile_id][0], f"{profile_id}@{start} is a published start"
        return
    except N.NVMLError_InsufficientResources:
        assert not expected, f"refused {profile_id}@{start} that the published table allows"
        assert start is None or start in PUBLISHED[profile_id][0], f"{profile_id}@{start}: INVALID_ARGUMENT"
        return
    assert expected, f"accepted {profile_id}@{start} that the published table forbids"
    info = N.nvmlGpuInstanceGetInfo(gi)
    assert info.id not in placed, "GI id reused while its owner lives"
    assert info.placement.size == size
    assert info.placement.start in (fits if start is None else [start])
    placed[info.id] = (profile_id, info.placement.start)
    if with_ci:
        prof = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[COMPUTE[profile_id]], N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
        N.nvmlGpuInstanceCreateComputeInstance(gi, prof.id)


def _destroy(dev: Any, pick: int, cis_first: bool, placed: dict[int, tuple[int, int]]) -> None:
    if not placed:
        return
    gi_id = sorted(placed)[pick % len(placed)]
    gi = N.nvmlDeviceGetGpuInstanceById(dev, gi_id)
    cis: list[Any] = []
    for idx in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            prof = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, idx, 0)
        except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
            continue
        arr = (N.c_nvmlComputeInstance_t * prof.instanceCount)()
        count = c_uint(0)
        N.nvmlGpuInstanceGetComputeInstances(gi, prof.id, arr, byref(count))
        cis.extend(arr[i] for i in range(count.value))
    if cis and not cis_first:
        with pytest.raises(N.NVMLError_InUse):
            N.nvmlGpuInstanceDestroy(gi)
    for ci in cis:
        N.nvmlComputeInstanceDestroy(ci)
    N.nvmlGpuInstanceDestroy(gi)
    del placed[gi_id]
