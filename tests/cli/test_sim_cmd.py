"""``flexmig sim``: other processes on a daemon's simulated node, through ``FLEXMIG_SIM_STATE`` (the .pth file the
package installs), ``flexmig sim exec``/``shell`` (also for interpreters of other environments) and the simulator's
``nvidia-smi`` on PATH. The node's state file is written by a node built here, as ``flexmigd --sim-state`` writes it.
What tools show during the demo is in test_demo.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.nvml import Nvml
from flexmig.sim import SimNode, install, uninstall

pytestmark = pytest.mark.integration

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
BIN = Path(sys.executable).parent
COUNT_AND_UUIDS = (
    "import pynvml as N; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0); "
    "print(N.nvmlDeviceGetCount(), *[N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)) "
    "for i in range(3)])"
)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[SimNode, Path]]:
    path = tmp_path / "sim-state.json"
    built = install(SPEC, state_path=path)
    uninstall()
    yield built, path
    uninstall()


def env_without_sim() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("FLEXMIG_SIM_STATE", "PYTHONPATH")}


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, check=False, env=env or env_without_sim()
    )


def flexmig(*args: str) -> list[str]:
    return [str(BIN / "flexmig"), *args]


def test_exec_runs_the_command_with_the_variable_and_the_look_alike_first_on_path(
    node: tuple[SimNode, Path],
) -> None:
    built, path = node
    shown = run(flexmig("sim", "--state", str(path), "exec", "--", "sh", "-c",
                        'echo "$FLEXMIG_SIM_STATE"; command -v nvidia-smi; nvidia-smi -L; exit 7'))  # fmt: skip
    assert shown.returncode == 7, shown.stderr
    state, smi, *listing = shown.stdout.splitlines()
    assert state == str(path)
    assert smi.endswith("/bin/nvidia-smi") and not Path(smi).exists()  # its private directory is gone
    assert listing[0] == f"GPU 0: NVIDIA H200 (UUID: {built.gpu(0).uuid})"
    assert [line.rsplit("UUID: ", 1)[1].rstrip(")") for line in listing if "MIG" in line] == list(built.mig_uuids())


def test_a_python_of_this_environment_sees_the_node_from_the_variable_alone(node: tuple[SimNode, Path]) -> None:
    built, path = node
    got = run([sys.executable, "-c", COUNT_AND_UUIDS], {**env_without_sim(), "FLEXMIG_SIM_STATE": str(path)})
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["2", *built.mig_uuids(0)]


def test_without_the_variable_a_python_start_imports_nothing_of_flexmig() -> None:
    probe = "import sys; import pynvml; print('flexmig' in sys.modules, pynvml.nvmlLib)"
    got = run([sys.executable, "-c", probe])
    assert (got.returncode, got.stdout) == (0, "False None\n"), got.stderr


def test_an_interpreter_of_another_environment_sees_the_node_under_exec(
    node: tuple[SimNode, Path], tmp_path: Path
) -> None:
    built, path = node
    other = tmp_path / "other"
    venv.EnvBuilder(with_pip=False).create(other)
    # Its packages come from this environment's site-packages on PYTHONPATH, where .pth files are not read: it has
    # pynvml (as nvitop's environment would), and flexmig only through what flexmig sim exec gives it.
    site = sysconfig.get_path("purelib")
    probe = f"import sys; sys.path.append({site!r}); exec({COUNT_AND_UUIDS!r})"
    alone = run([str(other / "bin" / "python"), "-c", probe])
    assert alone.returncode != 0  # no simulator and no driver there
    got = run(flexmig("sim", "--state", str(path), "exec", "--", str(other / "bin" / "python"), "-c", probe))
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["2", *built.mig_uuids(0)]


def test_gpustat_and_nvitop_under_exec_show_the_nodes_gpus_instances_and_processes(
    node: tuple[SimNode, Path],
) -> None:
    built, path = node
    built.start_process(built.mig_uuids(0)[0], pid=os.getpid(), memory_bytes=8 << 30)
    stat = run(flexmig("sim", "--state", str(path), "exec", "--", str(BIN / "gpustat"), "--json"))
    assert stat.returncode == 0, stat.stderr
    doc = json.loads(stat.stdout)
    assert [g["uuid"] for g in doc["gpus"]] == [g.uuid for g in built.gpus()]
    assert [p["pid"] for p in doc["gpus"][0]["processes"]] == [os.getpid()]
    top = run(flexmig("sim", "--state", str(path), "exec", "--", str(BIN / "nvitop"), "-1"))
    assert top.returncode == 0, top.stderr
    assert top.stdout.count("3g.71gb @ GI/CI") == 2 and f" {os.getpid()} " in top.stdout


def test_exec_without_a_state_file_says_how_to_name_one() -> None:
    got = run(flexmig("sim", "exec", "--", "true"))
    assert got.returncode == 2 and "flexmig sim --state FILE, or set FLEXMIG_SIM_STATE" in got.stderr


WATCH = """
import sys, time
import pynvml as N
N.nvmlInit()
seen = None
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    h = N.nvmlDeviceGetHandleByIndex(0)
    names = []
    for i in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            names.append(N.nvmlDeviceGetName(N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)).split()[-1])
        except N.NVMLError:
            pass
    if names != seen:
        print(" ".join(sorted(names)), flush=True)
        seen = names
        if "4g.71gb" in names:
            sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
"""


def test_a_process_started_before_a_change_sees_the_change_live(node: tuple[SimNode, Path]) -> None:
    _, path = node
    watcher = subprocess.Popen(
        flexmig("sim", "--state", str(path), "exec", "--", sys.executable, "-c", WATCH),
        stdout=subprocess.PIPE,
        text=True,
        env=env_without_sim(),
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline() == "1g.18gb 2g.35gb 3g.71gb\n"  # the node as it was
        again = install(SPEC, state_path=path)  # the daemon again, from its file: it re-lays GPU 0
        with Nvml.open() as nvml:
            nvml.destroy_instance(0, again.gpu(0).gi_id_at(0))  # the 3g.71gb, whatever ID the driver gave it
            nvml.create_instance(0, "4g.71gb", 0)
        uninstall()
        assert watcher.stdout.readline() == "1g.18gb 2g.35gb 4g.71gb\n"
        assert watcher.wait(60) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(10)
