"""``flexmig nvml record``: a read-only walk of the driver; a node built from its document answers the same."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.cli.main import main
from flexmig.errors import SimError
from flexmig.nvml import Nvml
from flexmig.nvml.record import BY_MEMORY_CLOCK, BY_PROFILE_ID, DEVICE_PROBES, P2P, SYSTEM_PROBES, TOPOLOGY, record
from flexmig.sim import SimNode, install, uninstall
from flexmig.sim.entrypoints import MUTATING_PREFIXES, NOT_RECORDED, REFERENCE_SPEC, entry_points, render

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "simulator-entry-points.md"
Sim = Callable[..., SimNode]


def fixed_clock() -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def sim() -> Iterator[Callable[..., SimNode]]:
    nodes = []

    def make(spec: str = REFERENCE_SPEC) -> SimNode:
        node = install(spec)
        nodes.append(node)
        return node

    yield make
    uninstall()


class Spy:
    """Stands where pynvml looks its C symbols up, and notes every symbol looked up."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.seen: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.seen.add(name)
        return getattr(self._lib, name)


def symbols_looked_up_by_a_recording() -> set[str]:
    """Record the installed node with a spy where pynvml finds its C symbols; the symbols it looked up."""
    spy = Spy(N.nvmlLib)
    N.nvmlLib = spy
    N._nvmlGetFunctionPointer_cache.clear()
    try:
        record(clock=fixed_clock)
    finally:
        N.nvmlLib = spy._lib
        N._nvmlGetFunctionPointer_cache.clear()
    return spy.seen


def write(tmp_path: Path, doc: dict[str, Any], name: str = "rec.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


# ------------------------------------------------------------------------------------------ read-only
def test_the_recorder_calls_no_entry_point_that_changes_anything(sim: Sim) -> None:
    sim()
    seen = symbols_looked_up_by_a_recording()
    changing = {name for name in seen if name.startswith(MUTATING_PREFIXES)}
    assert changing == set()
    assert all(
        name.startswith(
            (
                "nvmlSystemGet",
                "nvmlDevice",
                "nvmlGpuInstanceGet",
                "nvmlComputeInstanceGet",
                "nvmlGpmQuery",
                "nvmlInit",
                "nvmlShutdown",
                "nvmlErrorString",
            )
        )
        for name in seen
    )


def test_the_recorder_asks_every_query_entry_point_the_simulator_implements(sim: Sim) -> None:
    sim()
    seen = symbols_looked_up_by_a_recording()
    queries = {n for n in entry_points() if not n.startswith(MUTATING_PREFIXES) and n not in NOT_RECORDED}
    assert queries - seen == set()
    probed = {p.name for p in (*DEVICE_PROBES, *SYSTEM_PROBES, *BY_PROFILE_ID, BY_MEMORY_CLOCK, P2P, TOPOLOGY)}
    assert probed - set(entry_points()) == set(), "a probe for an entry point the simulator does not have"
    assert set(NOT_RECORDED) <= set(entry_points()), "NOT_RECORDED names an entry point that does not exist"


# -------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("spec", [REFERENCE_SPEC, "a100-40x1:-", "h100-80x2:7g.80gb@0"])
def test_record_simulate_record_gives_the_same_document(sim: Sim, tmp_path: Path, spec: str) -> None:
    node = sim(spec)
    if node.mig_uuids():
        node.start_process(node.mig_uuids()[0], memory_bytes=3 << 30)
    first = record(clock=fixed_clock)
    uninstall()
    install(f"recording:{write(tmp_path, first)}")
    second = record(clock=fixed_clock)
    assert second == first
    if node.mig_uuids():  # flexmig's own NVML layer works on the rebuilt node (placements: NULL, then array)
        with Nvml.open() as nvml:
            profile = nvml.inventory().gpus[0].gpu_instances[0].profile_name
            assert profile is not None
            assert nvml.possible_placements(0, profile)


def test_the_document_holds_values_structs_lists_and_error_names(sim: Sim) -> None:
    node = sim()
    pid = node.start_process(node.mig_uuids(0)[0], memory_bytes=2 << 30)
    doc = record(clock=fixed_clock)
    gpu = doc["gpus"][0]
    calls = gpu["calls"]
    assert doc["system"]["nvmlSystemGetDriverVersion"] == {"value": "570.124.06"}
    assert calls["nvmlDeviceGetName"] == {"value": "NVIDIA H200"}
    assert calls["nvmlDeviceGetPciInfo_v3"]["value"]["busId"] == "00000000:18:00.0"
    assert calls["nvmlDeviceGetGpuInstancePossiblePlacements_v2(9)"] == {
        "value": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]
    }
    assert calls["nvmlDeviceGetClockInfo(2)"] == {"value": 3201}
    assert calls["nvmlDeviceGetUtilizationRates"] == {"error": "NOT_SUPPORTED"}
    assert calls["nvmlDeviceGetEccMode"] == {"value": [1, 1]}
    assert calls["nvmlDeviceGetMemoryInfo_v2"]["value"]["reserved"] == 700 << 20  # a figure, not padding
    mig = gpu["mig_devices"][0]
    gi, _ = node.gpu(0).mig_device(mig["uuid"])
    assert (mig["uuid"], mig["gpu_instance_id"]) == (node.mig_uuids(0)[0], gi.id)
    procs = mig["calls"]["nvmlDeviceGetComputeRunningProcesses_v3"]["value"]
    assert [(p["pid"], p["usedGpuMemory"], p["gpuInstanceId"]) for p in procs] == [(pid, 2 << 30, gi.id)]
    assert mig["calls"]["nvmlDeviceGetAttributes_v2"]["value"]["gpuInstanceSliceCount"] == gi.profile.compute_slices
    three_g = node.gpu(0).gi_at(0)
    assert next(g for g in gpu["layout"]["gpu_instances"] if g["start"] == 0) == {
        "id": three_g.id,
        "profile_id": 9,
        "profile_name": "3g.71gb",
        "start": 0,
        "size": 4,
        "compute_instances": [{"id": 0, "profile_id": 2, "start": 0, "size": 3}],
    }


def test_a_node_built_from_a_recording_answers_what_was_recorded_not_what_the_model_says(
    sim: Sim, tmp_path: Path
) -> None:
    sim()
    doc = record(clock=fixed_clock)
    uninstall()
    calls = doc["gpus"][0]["calls"]
    calls["nvmlDeviceGetSerial"] = {"value": "1320123456789"}  # as if a real board had answered
    calls["nvmlDeviceGetTemperatureThreshold(0)"] = {"error": "NOT_SUPPORTED"}
    mig = doc["gpus"][0]["mig_devices"][0]
    mig["calls"]["nvmlDeviceGetMemoryInfo_v2"]["value"]["used"] = 15 << 20
    install(f"recording:{write(tmp_path, doc)}")
    N.nvmlInit()
    try:
        dev = N.nvmlDeviceGetHandleByIndex(0)
        assert N.nvmlDeviceGetSerial(dev) == "1320123456789"
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetTemperatureThreshold(dev, 0)
        handle = N.nvmlDeviceGetHandleByUUID(mig["uuid"])
        assert N.nvmlDeviceGetMemoryInfo(handle, version=N.nvmlMemory_v2).used == 15 << 20
        assert (
            N.nvmlDeviceGetSerial(N.nvmlDeviceGetHandleByIndex(1))
            == doc["gpus"][1]["calls"]["nvmlDeviceGetSerial"]["value"]
        )
    finally:
        N.nvmlShutdown()


def test_after_a_change_the_recorded_gpu_is_answered_by_the_model(sim: Sim, tmp_path: Path) -> None:
    sim()
    doc = record(clock=fixed_clock)
    uninstall()
    doc["gpus"][0]["calls"]["nvmlDeviceGetSerial"] = {"value": "1320123456789"}
    node = install(f"recording:{write(tmp_path, doc)}")
    N.nvmlInit()
    try:
        dev = N.nvmlDeviceGetHandleByIndex(0)
        assert N.nvmlDeviceGetSerial(dev) == "1320123456789"
        node.start_process(node.mig_uuids(0)[0], memory_bytes=1 << 30)  # the recording described another state
        assert N.nvmlDeviceGetSerial(dev) != "1320123456789"
    finally:
        N.nvmlShutdown()


def test_a_file_that_is_not_a_recording_is_refused_naming_it(tmp_path: Path) -> None:
    bad = write(tmp_path, {"schema": 1, "gpus": []}, "state.json")
    with pytest.raises(SimError, match=r"state\.json is not a flexmig nvml recording"):
        install(f"recording:{bad}")
    missing = tmp_path / "nowhere.json"
    with pytest.raises(SimError, match="cannot read recording"):
        install(f"recording:{missing}")


def test_a_recording_of_a_gpu_model_without_a_mig_table_is_refused(sim: Sim, tmp_path: Path) -> None:
    sim("h200x1")
    doc = record(clock=fixed_clock)
    uninstall()
    doc["gpus"][0]["name"] = "NVIDIA B200"
    with pytest.raises(SimError, match="no MIG table for 'NVIDIA B200'"):
        install(f"recording:{write(tmp_path, doc)}")


# ------------------------------------------------------------------------------------------------- CLI
def test_cli_records_a_simulated_node_and_rebuilds_it_from_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    assert main(["nvml", "record", "--sim", REFERENCE_SPEC, str(out)]) == 0
    assert "2 GPU(s), 6 MIG device(s)" in capsys.readouterr().err
    again = tmp_path / "again.json"
    assert main(["nvml", "record", "--sim-from", str(out), str(again)]) == 0
    first, second = json.loads(out.read_text()), json.loads(again.read_text())
    first.pop("recorded_at")
    second.pop("recorded_at")
    assert first == second


def test_cli_refuses_to_overwrite_a_recording_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    out.write_text("keep me")
    assert main(["nvml", "record", "--sim", "h200", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert out.read_text() == "keep me"
    assert main(["nvml", "record", "--sim", "h200", "--force", str(out)]) == 0
    assert json.loads(out.read_text())["schema"] == "flexmig-nvml-record/1"


# ------------------------------------------------------------------------------------------------ docs
def test_the_entry_point_page_is_the_one_the_code_generates(sim: Sim) -> None:
    sim()
    page = render(record(clock=fixed_clock))
    assert DOC.read_text() == page, (
        "docs/simulator-entry-points.md is stale; regenerate with: "
        f"flexmig nvml record --sim {REFERENCE_SPEC} - | python -m flexmig.sim.entrypoints "
        "> docs/simulator-entry-points.md"
    )
    for name in entry_points():
        assert f"| `{name}` |" in page
