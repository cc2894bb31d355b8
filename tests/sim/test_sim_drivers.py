"""A simulated node runs a driver release (``h200@550.90``) and answers as that release does: its version strings,
the profiles it offers, the memory it reports, and FunctionNotFound for entry points it does not have."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.errors import NodeSpecError, SimError
from flexmig.sim import SimNode, install, uninstall
from flexmig.sim.drivers import driver_release

Sim = Callable[[str], SimNode]


@pytest.fixture
def sim() -> Iterator[Sim]:
    def make(spec: str) -> SimNode:
        node = install(spec)
        N.nvmlInit()
        return node

    yield make
    uninstall()


def gpu() -> Any:
    return N.nvmlDeviceGetHandleByIndex(0)


def offered_ids() -> list[int]:
    """Profile IDs the GPU offers, through the v1 struct every release has (``nvidia-smi mig -lgip``)."""
    out = []
    for idx in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            out.append(int(N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(), idx, version=1).id))
        except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
            continue
    return out


def test_the_node_reports_the_drivers_version_strings(sim: Sim) -> None:
    sim("h200@550.90")
    assert N.nvmlSystemGetDriverVersion() == "550.90.07"
    assert N.nvmlSystemGetNVMLVersion() == "12.550.90.07"
    assert N.nvmlSystemGetCudaDriverVersion() == 12040


def test_an_a100_80_on_driver_470_offers_no_profile_15(sim: Sim) -> None:
    # NVIDIA/mig-parted issue #97: an older driver lists no 1g.20gb; nvml.h names 1_SLICE_REV2 from CUDA 12.0 (525).
    sim("a100-80@470.82.01")
    assert offered_ids() == [19, 14, 9, 5, 0, 20]
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceCreateGpuInstance(gpu(), 15)
    uninstall()
    sim("a100-80@535")
    assert 15 in offered_ids()


def test_calls_newer_than_the_driver_are_function_not_found(sim: Sim) -> None:
    sim("a100-40@470")
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetMemoryInfo(gpu(), version=N.nvmlMemory_v2)  # nvml.h from CUDA 11.6: branch 510
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetComputeRunningProcesses_v3(gpu())  # CUDA 11.6: branch 510; ..._v2 is there
    with pytest.raises(N.NVMLLibraryMismatchError):
        N.nvmlDeviceGetComputeRunningProcesses(gpu())  # pynvml's unversioned call says so in its own words
    assert N.nvmlDeviceGetComputeRunningProcesses_v2(gpu()) == []
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(), 0)  # pynvml's default is the V struct (510)
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlGpmQueryDeviceSupport(gpu())  # GPM came with CUDA 11.8 (520)
    assert N.nvmlDeviceGetMemoryInfo(gpu()).total == 40536 << 20  # the total old drivers report


def test_the_default_release_lacks_what_only_580_declares(sim: Sim) -> None:
    sim("h200")
    with pytest.raises(N.NVMLError_FunctionNotFound):
        N.nvmlDeviceGetGpuInstanceProfileInfoById(gpu(), 9)
    uninstall()
    sim("h200@580.65.06")
    assert N.nvmlDeviceGetGpuInstanceProfileInfoById(gpu(), 9).name == "MIG 3g.71gb"


def test_a_driver_older_than_the_gpu_or_than_the_simulator_is_refused() -> None:
    with pytest.raises(SimError, match=r"driver 535\.129\.03 does not support the NVIDIA H200"):
        install("h200@535")
    with pytest.raises(SimError, match="branches 470 and later"):
        install("a100-40@460.73.01")
    with pytest.raises(SimError, match=r"driver 470\.82\.01 offers no 1g\.20gb"):
        install("a100-80@470:1g.20gb@0")
    with pytest.raises(NodeSpecError, match="driver version"):
        install("h200@5.5")


def test_a_state_file_belongs_to_one_driver(tmp_path: Any) -> None:
    path = tmp_path / "node.json"
    install("h200@550:1g.18gb@0", state_path=path)
    uninstall()
    with pytest.raises(SimError, match=r"on driver 550\.90\.07, not 570\.124\.06"):
        install("h200:1g.18gb@0", state_path=path)
    assert install("h200@550:1g.18gb@0", state_path=path).gpu(0).gi_ids != ()
    uninstall()


def test_releases_name_their_first_branch_and_fill_in_the_published_version() -> None:
    assert [driver_release(t).version for t in ("550", "550.90", "535.104.05")] == [
        "550.90.07",
        "550.90.07",
        "535.104.05",
    ]
    assert driver_release("590").facts == 580  # a branch newer than the table answers as the newest modelled
