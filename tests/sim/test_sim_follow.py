"""Another process's view of a daemon's simulated node (``flexmig.sim.follow``): the node in the daemon's state file,
read-only and live. Here the "daemon" is a node built with a state file in this process and taken off pynvml again:
its changes go on reaching the file, which the follower under pynvml reads."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.errors import SimError
from flexmig.nvml import Nvml
from flexmig.sim import SimNode, install, uninstall
from flexmig.sim.follow import MAX_STATE_BYTES, RECHECK_S, follow
from flexmig.sim.persist import load_state, state_to_dict

SPEC = "h200x2:3g.71gb@0+2g.35gb@4"
GPM_SM_UTIL = 2


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[SimNode, Path]]:
    """A node that keeps its state in a file (as ``flexmigd --sim-state``), not under pynvml in this process."""
    path = tmp_path / "sim-state.json"
    node = install(SPEC, state_path=path)
    uninstall()
    yield node, path
    uninstall()


def mig_handle(gpu: int, index: int) -> Any:
    return N.nvmlDeviceGetMigDeviceHandleByIndex(N.nvmlDeviceGetHandleByIndex(gpu), index)


def test_a_follower_sees_the_daemons_gpus_mig_devices_and_processes(daemon: tuple[SimNode, Path]) -> None:
    node, path = daemon
    pid = node.start_process(node.mig_uuids(1)[1], pid=os.getpid(), memory_bytes=4 << 30)
    follow(path)
    with Nvml.open() as nvml:
        inv = nvml.inventory()
    assert [d.uuid for g in inv.gpus for d in g.mig_devices] == list(node.mig_uuids())
    assert [g.uuid for g in inv.gpus] == [g.uuid for g in node.gpus()]
    N.nvmlInit()
    procs = N.nvmlDeviceGetComputeRunningProcesses(mig_handle(1, 1))
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(pid, 4 << 30)]
    N.nvmlShutdown()


def test_what_the_daemon_changes_shows_at_the_next_call_after_a_recheck_and_handles_stay_valid(
    daemon: tuple[SimNode, Path],
) -> None:
    node, path = daemon
    clock = Clock()
    followed = follow(path, clock=clock)
    N.nvmlInit()
    handle = mig_handle(0, 0)
    assert N.nvmlDeviceGetComputeRunningProcesses(handle) == []
    pid = node.start_process(node.mig_uuids(0)[0], memory_bytes=2 << 30)
    assert N.nvmlDeviceGetComputeRunningProcesses(handle) == []  # not looked at again yet
    clock.t += RECHECK_S
    assert [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(handle)] == [pid]  # the same handle
    assert followed.problem is None
    node.lose_gpu(1)
    clock.t += RECHECK_S
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetMigMode(N.nvmlDeviceGetHandleByIndex(1))
    N.nvmlShutdown()


def gpm_sm(handle: Any, gi_id: int, clock: Clock, seconds: float) -> float:
    first, second = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    try:
        N.nvmlGpmMigSampleGet(handle, gi_id, first)
        clock.t += seconds
        N.nvmlGpmMigSampleGet(handle, gi_id, second)
        mg = N.c_nvmlGpmMetricsGet_t()
        mg.version = N.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 1
        mg.metrics[0].metricId = GPM_SM_UTIL
        mg.sample1, mg.sample2 = first, second
        N.nvmlGpmMetricsGet(mg)
        return float(mg.metrics[0].value)
    finally:
        N.nvmlGpmSampleFree(first)
        N.nvmlGpmSampleFree(second)


def test_the_activity_the_daemon_sets_is_what_gpm_measures_in_the_follower(daemon: tuple[SimNode, Path]) -> None:
    node, path = daemon
    uuid = node.mig_uuids(0)[0]
    node.start_process(uuid, memory_bytes=1 << 30)
    node.set_activity(uuid, sm=0.75)
    node.save()  # the daemon's workload step saves after setting activity
    clock = Clock()
    follow(path, clock=clock)
    N.nvmlInit()
    gpu = N.nvmlDeviceGetHandleByIndex(0)
    gi_id = node.gpu(0).gpu_instances[0].id
    assert gpm_sm(gpu, gi_id, clock, 10.0) == pytest.approx(75.0)
    node.set_activity(uuid, sm=0.25)
    node.save()
    clock.t += RECHECK_S  # the follower looks at the file again from now on
    assert gpm_sm(gpu, gi_id, clock, 10.0) == pytest.approx(25.0)  # rebuilt from the file, counters kept
    N.nvmlShutdown()


def test_a_follower_refuses_every_change_with_no_permission_and_never_writes_the_file(
    daemon: tuple[SimNode, Path],
) -> None:
    _, path = daemon
    before = path.read_bytes()
    follow(path)
    N.nvmlInit()
    gpu = N.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceCreateGpuInstance(gpu, 19)
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceSetMigMode(gpu, 0)
    N.nvmlShutdown()
    assert path.read_bytes() == before


def test_a_broken_file_keeps_the_last_node_and_says_why_until_a_good_one_comes(daemon: tuple[SimNode, Path]) -> None:
    node, path = daemon
    clock = Clock()
    followed = follow(path, clock=clock)
    N.nvmlInit()
    good = path.read_bytes()
    broken = path.with_name("broken")
    broken.write_text("{not json")
    broken.replace(path)  # as the daemon replaces it: a new file, whole
    clock.t += RECHECK_S
    assert N.nvmlDeviceGetCount() == 2
    assert followed.problem is not None and "is not JSON" in followed.problem
    path.write_bytes(good)
    clock.t += RECHECK_S
    assert N.nvmlDeviceGetCount() == 2 and followed.problem is None
    N.nvmlShutdown()
    del node


def test_the_state_file_is_read_without_following_a_symlink_and_within_a_size_bound(
    daemon: tuple[SimNode, Path], tmp_path: Path
) -> None:
    _, path = daemon
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(SimError, match="symlink"):
        follow(link)
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_STATE_BYTES + 1))
    with pytest.raises(SimError, match="at most"):
        follow(big)


def test_the_state_file_keeps_each_mig_devices_activity(daemon: tuple[SimNode, Path]) -> None:
    node, path = daemon
    uuid = node.mig_uuids(1)[0]
    node.start_process(uuid, memory_bytes=1 << 30)
    node.set_activity(uuid, sm=0.5, dram=0.25, tensor=0.125, occupancy=0.3)
    node.save()
    raw = json.loads(path.read_text())
    cis = [c for g in raw["gpus"] for gi in g["gpu_instances"] for c in gi["cis"]]
    assert [c["activity"] for c in cis if c["uuid"] == uuid] == [[0.5, 0.3, 0.25, 0.125]]
    back = load_state(path, node.spec.model, node.spec.count, Clock())
    assert state_to_dict(back)["gpus"] == raw["gpus"]
