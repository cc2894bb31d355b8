"""``flexmig inventory``: a table for people, JSON for programs, clear words when there is no driver."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pytest import CaptureFixture

from flexmig.cli.main import main
from flexmig.sim import installed

SPEC = "a100-40x2:3g.20gb@4+2g.10gb@0+1g.5gb@2"


def test_json_lists_every_gpu_instance_and_mig_device(capsys: CaptureFixture[str]) -> None:
    assert main(["inventory", "--sim", SPEC, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"] == f"sim:{SPEC}"
    assert data["driver_version"] == "570.124.06"
    assert [g["name"] for g in data["gpus"]] == ["NVIDIA A100-SXM4-40GB"] * 2
    gpu = data["gpus"][0]
    assert sorted((gi["start"], gi["profile_name"], gi["size"]) for gi in gpu["gpu_instances"]) == [
        (0, "2g.10gb", 2),
        (2, "1g.5gb", 1),
        (4, "3g.20gb", 4),
    ]
    ids = [gi["id"] for gi in gpu["gpu_instances"]]  # the driver's IDs, listed in ascending order
    assert ids == sorted(ids) and len(set(ids)) == 3
    profile = {gi["id"]: gi["profile_name"] for gi in gpu["gpu_instances"]}
    sizes = {"3g.20gb": 19968, "2g.10gb": 9856, "1g.5gb": 4864}
    # MIG devices in GI-ID order (nvidia-smi's "MIG Dev" column), each with its instance's memory
    assert [profile[d["gpu_instance_id"]] for d in gpu["mig_devices"]] == [profile[i] for i in ids]
    assert all(d["memory_total_bytes"] >> 20 == sizes[profile[d["gpu_instance_id"]]] for d in gpu["mig_devices"])
    assert all(d["uuid"].startswith("MIG-") for d in gpu["mig_devices"])
    assert not installed()  # the CLI took its simulator away again


def test_the_table_shows_each_mig_device_with_profile_and_placement(capsys: CaptureFixture[str]) -> None:
    assert main(["inventory", "--sim", SPEC]) == 0
    out = capsys.readouterr().out
    assert "GPU 1: NVIDIA A100-SXM4-40GB" in out
    assert out.count("MIG-") == 6
    assert "3g.20gb" in out and "4:4" in out


def test_the_table_says_when_mig_is_disabled(capsys: CaptureFixture[str]) -> None:
    assert main(["inventory", "--sim", "h100-80:-"]) == 0
    assert "MIG off" in capsys.readouterr().out


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVIDIA driver is installed")
def test_without_a_driver_it_says_so_and_how_to_use_sim(capsys: CaptureFixture[str]) -> None:
    assert main(["inventory"]) == 1
    err = capsys.readouterr().err
    assert "No NVIDIA driver was found" in err
    assert "flexmig inventory --sim h200x2:" in err
    assert "Traceback" not in err


def test_a_bad_spec_points_at_the_bad_item(capsys: CaptureFixture[str]) -> None:
    assert main(["inventory", "--sim", "h200:3g.71gb@0+2g.35gb@3"]) == 2
    err = capsys.readouterr().err
    assert "2g.35gb may start only at memory slice {0,2,4}" in err
    assert err.splitlines()[-1] == " " * len("  h200:3g.71gb@0+") + "^"
    assert not installed()


def test_sim_state_without_sim_is_refused(capsys: CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["inventory", "--sim-state", str(tmp_path / "s.json")]) == 2
    assert "--sim-state FILE needs --sim SPEC" in capsys.readouterr().err


def test_sim_state_keeps_the_node_between_runs(capsys: CaptureFixture[str], tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    assert main(["inventory", "--sim", "h200", "--sim-state", str(state), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert state.exists()
    assert main(["inventory", "--sim", "h200", "--sim-state", str(state), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == first


@pytest.mark.integration
def test_the_console_script_runs_as_a_separate_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "inventory", "--sim", "h200x2:7g.141gb@0", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    data = json.loads(out.stdout)
    assert [len(g["mig_devices"]) for g in data["gpus"]] == [1, 1]
