"""A recording is how a user reproduces their node: ``--sim recording:FILE`` answers as the recorded driver did,
its errors and the entry points it lacks included, and ``flexmig inventory``, ``status`` and ``plan`` run on it
unchanged. The recordings under tests/data/recordings are built from published transcripts (their ``about``
says which, and what was assumed)."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest
from pytest import CaptureFixture

from flexmig.cli.main import main
from flexmig.nvml import Nvml
from flexmig.sim import SimNode, install, uninstall

DATA = Path(__file__).resolve().parents[1] / "data" / "recordings"
DCGM_138 = DATA / "a100-80-dcgm-138.json"
MIG_PARTED_31 = DATA / "a100-80-495-mig-parted-31.json"
GUIDE = DATA / "a100-40-mig-user-guide.json"


@pytest.fixture
def recorded(request: pytest.FixtureRequest) -> SimNode:
    return install(f"recording:{request.param}")


def inventory_json(capsys: CaptureFixture[str], path: Path) -> dict[str, object]:
    assert main(["inventory", "--sim", f"recording:{path}", "--json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_recording_says_where_it_comes_from(path: Path) -> None:
    about = " ".join(json.loads(path.read_text())["about"])
    assert "Built by hand" in about and "https://" in about and "ssumed" in about


def test_inventory_of_dcgm_138_lists_both_gpus_ids_as_published(capsys: CaptureFixture[str]) -> None:
    doc = inventory_json(capsys, DCGM_138)
    gpus = doc["gpus"]
    assert isinstance(gpus, list)
    placed = [{(gi["start"], gi["id"]) for gi in g["gpu_instances"]} for g in gpus]
    assert placed == [{(2, 9), (3, 10), (0, 3), (4, 2)}, {(2, 13), (3, 14), (0, 5), (4, 1)}]
    assert doc["driver_version"] == "535.104.05"


def test_an_instance_recreated_on_a_recorded_gpu_gets_the_id_that_gpu_gives() -> None:
    # GPU 1's recorded IDs say which of its compute slots is fused off (virtual 7 is physical 3), so a 1g.10gb
    # destroyed at 2 comes back as GI 13, as on that GPU, not as GPU 0's 9.
    node = install(f"recording:{DCGM_138}", ids="driver")
    try:
        assert [node.gpu(i).fused_slot for i in (0, 1)] == [7, 3]
        with Nvml.open() as nvml:
            nvml.destroy_instance(1, 13)
            assert nvml.create_instance(1, "1g.10gb", 2).gpu_instance_id == 13
            nvml.destroy_instance(0, 9)
            assert nvml.create_instance(0, "1g.10gb", 2).gpu_instance_id == 9
    finally:
        uninstall()


@pytest.mark.parametrize("recorded", [MIG_PARTED_31], indirect=True)
def test_a_495_recording_replays_its_answers_and_lacks_what_495_lacks(recorded: SimNode) -> None:
    N.nvmlInit()
    try:
        gpu = N.nvmlDeviceGetHandleByIndex(1)
        assert N.nvmlSystemGetDriverVersion() == "495.29.05"
        assert (N.nvmlDeviceGetPowerUsage(gpu), N.nvmlDeviceGetMemoryInfo(gpu).total) == (51000, 81251 << 20)
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetUtilizationRates(gpu)  # recorded as the error it was
        with pytest.raises(N.NVMLError_FunctionNotFound):
            N.nvmlDeviceGetMemoryInfo(gpu, version=N.nvmlMemory_v2)  # 510 brought it
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceCreateGpuInstance(gpu, 15)  # no 1g.20gb before 525
    finally:
        N.nvmlShutdown()


def test_status_and_plan_run_on_a_495_recording_and_offer_only_its_profiles(capsys: CaptureFixture[str]) -> None:
    spec = f"recording:{MIG_PARTED_31}"
    assert main(["status", "--sim", spec, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["driver_version"] == "495.29.05"
    assert [g["power_w"] for g in status["gpus"]] == [50.0, 51.0]
    assert "1g.20gb" not in status["gpus"][0]["creatable"] and status["gpus"][0]["creatable"]["2g.20gb"] == 3
    assert main(["plan", "--sim", spec, "--request", "1g.20gb", "--json"]) == 2
    assert "has no profile 1g.20gb" in capsys.readouterr().err
    assert main(["plan", "--sim", spec, "--request", "2x2g.20gb", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {a["action"] for a in plan["actions"]} >= {"create_instance"}
    assert all("1g.20gb" not in json.dumps(a) for a in plan["actions"])


def test_status_and_plan_run_on_the_mig_user_guides_layout(capsys: CaptureFixture[str]) -> None:
    spec = f"recording:{GUIDE}"
    assert main(["status", "--sim", spec, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    (gpu,) = status["gpus"]
    assert gpu["uuid"] == "GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0"
    assert sorted(i["gpu_instance_id"] for i in gpu["instances"]) == [5, 7, 8, 9, 10, 13]
    assert main(["plan", "--sim", spec, "--request", "1g.10gb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "NVIDIA A100-SXM4-40GB"
