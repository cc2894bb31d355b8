"""The simulator's state file: like a driver, the node outlives the program that changed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexmig.errors import SimError
from flexmig.nvml import Nvml
from flexmig.sim import install, uninstall

SPEC = "h200x2:3g.71gb@0+2g.35gb@4"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_reinstall_restores_instances_uuids_ids_and_processes(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    node = install(SPEC, state_path=path)
    with Nvml.open() as nvml:
        nvml.destroy_instance(0, node.gpu(0).gi_id_at(4))
        created = nvml.create_instance(0, "1g.18gb", 6)
        nvml.set_mig_mode(1, False)
    fake = node.start_process(created.uuid, memory_bytes=3 << 30)
    mine = node.start_process(node.mig_uuids(0)[0], pid=os.getpid(), memory_bytes=1 << 30)
    before = node.gpus()
    uninstall()

    again = install(SPEC, state_path=path)
    assert again.gpus() == before
    assert {p.pid for p in again.gpu(0).processes} == {fake, mine}
    with Nvml.open() as nvml:
        inv = nvml.inventory()
    assert [d.uuid for d in inv.gpus[0].mig_devices] == list(before[0].mig_uuids)
    assert inv.gpus[1].mig_current is False


def test_fake_pids_keep_counting_after_a_restore(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    node = install(SPEC, state_path=path)
    first = node.start_process(node.mig_uuids(0)[0])
    uninstall()
    node = install(SPEC, state_path=path)
    assert node.start_process(node.mig_uuids(0)[1]) == first + 1


def test_new_mig_uuids_after_a_restore_never_repeat_old_ones(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    node = install(SPEC, state_path=path)
    with Nvml.open() as nvml:
        old = {d.uuid for _, d in nvml.inventory().mig_devices()}
        nvml.destroy_instance(1, node.gpu(1).gi_id_at(0))
    uninstall()
    install(SPEC, state_path=path)
    with Nvml.open() as nvml:
        new = nvml.create_instance(1, "3g.71gb", 0)
    assert new.uuid not in old


@pytest.mark.integration
def test_real_processes_that_died_meanwhile_are_dropped_at_load(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    node = install(SPEC, state_path=path)
    uuid = node.mig_uuids(0)[0]
    node.start_process(uuid, pid=os.getpid())
    gone = dead_pid()
    node.start_process(uuid, pid=gone)
    assert gone in {
        p["pid"]
        for g in json.loads(path.read_text())["gpus"]
        for gi in g["gpu_instances"]
        for c in gi["cis"]
        for p in c["processes"]
    }
    uninstall()
    again = install(SPEC, state_path=path)
    assert [p.pid for p in again.gpu(0).processes] == [os.getpid()]


def test_every_mutation_is_on_disk_at_once(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    node = install(SPEC, state_path=path)
    with Nvml.open() as nvml:
        nvml.destroy_instance(0, node.gpu(0).gi_id_at(4))
        on_disk = json.loads(path.read_text())["gpus"][0]["gpu_instances"]
        assert [gi["id"] for gi in on_disk] == [node.gpu(0).gi_id_at(0)]
    uuid = node.mig_uuids(1)[0]
    pid = node.start_process(uuid)
    cis = [c for gi in json.loads(path.read_text())["gpus"][1]["gpu_instances"] for c in gi["cis"]]
    assert pid in {p["pid"] for c in cis if c["uuid"] == uuid for p in c["processes"]}
    assert [p.name for p in tmp_path.iterdir()] == ["node.json"]  # the temporary file was renamed into place


def test_a_state_file_of_another_node_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    install(SPEC, state_path=path)
    uninstall()
    with pytest.raises(SimError, match=r"node.json holds a h200x2 node, not a100-40x2"):
        install("a100-40x2", state_path=path)


def test_a_corrupt_state_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text("{not json")
    with pytest.raises(SimError, match=r"cannot read simulator state file .*node\.json"):
        install(SPEC, state_path=path)
    path.write_text(json.dumps({"schema": 1, "model": "h200", "count": 2}))
    with pytest.raises(SimError, match=r"node\.json is malformed"):
        install(SPEC, state_path=path)


def test_a_state_file_breaking_placement_rules_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    install(SPEC, state_path=path)
    uninstall()
    raw = json.loads(path.read_text())
    raw["gpus"][0]["gpu_instances"][1]["start"] = 2  # 2g.35gb moved onto the 3g's slices
    path.write_text(json.dumps(raw))
    with pytest.raises(SimError, match=r"node\.json"):
        install(SPEC, state_path=path)
