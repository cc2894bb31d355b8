"""Another NVML program in the same process, nvitop's API, sees the simulated node exactly as flexmig does."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pytest import CaptureFixture

from flexmig.cli.main import main
from flexmig.sim import SimNode, install, uninstall

nvitop = pytest.importorskip("nvitop")
from nvitop.api import libnvml  # noqa: E402

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"


@pytest.fixture
def nvitop_on_sim() -> Iterator[SimNode]:
    """Install the simulator for nvitop; afterwards shut nvitop's NVML context down, since nvitop keeps its own
    "initialised" flag and would otherwise skip nvmlInit against the next simulator."""
    node = install(SPEC)
    yield node
    with contextlib.suppress(libnvml.NVMLError):
        libnvml.nvmlShutdown()
    uninstall()


def flexmig_json(capsys: CaptureFixture[str]) -> dict[str, Any]:
    assert main(["inventory", "--sim", SPEC, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_nvitop_enumerates_the_same_mig_devices_as_flexmig_inventory_json(
    capsys: CaptureFixture[str], nvitop_on_sim: SimNode
) -> None:
    # The CLI installs its own simulator from the same spec (and removes it), so run it first.
    uninstall()
    ours = flexmig_json(capsys)
    install(SPEC)
    theirs = [(d.uuid(), d.memory_total()) for d in nvitop.MigDevice.all()]
    mine = [(d["uuid"], d["memory_total_bytes"]) for g in ours["gpus"] for d in g["mig_devices"]]
    assert len(mine) == 6
    assert theirs == mine


def test_nvitop_sees_gpus_mig_mode_and_processes_started_on_the_node(nvitop_on_sim: SimNode) -> None:
    node = nvitop_on_sim
    devices = nvitop.Device.all()
    assert [d.name() for d in devices] == ["NVIDIA H200", "NVIDIA H200"]
    assert all(d.is_mig_mode_enabled() for d in devices)
    uuid = node.mig_uuids(1)[0]
    gi, _ = node.gpu(1).mig_device(uuid)
    pid = node.start_process(uuid, memory_bytes=4 << 30)
    mig = nvitop.MigDevice(uuid)
    assert (mig.physical_index, mig.gpu_instance_id(), mig.compute_instance_id()) == (1, gi.id, 0)
    assert mig.memory_used() == (4 << 30) + gi.idle_used_bytes
    assert list(mig.processes()) == [pid]
    assert mig.gpu_utilization() is nvitop.NA  # NVML has no utilization rates on MIG devices
