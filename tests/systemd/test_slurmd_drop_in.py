"""flexmig's drop-in for slurmd's own unit and its template unit for one slurmd per GPU node (``node_per_gpu``):
systemd accepts them, they pass the dynamic node's parameters to slurmd as one argument each, and the template's
files are where flexmig's ``{node}`` settings put them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flexmig.slurm.settings import SlurmSettings, gpu_node, slot_node
from flexmig.slurm.slurmd import ENV_CONF, ENV_MODE, ENV_NODE, read_env_file, render_env_file
from support.systemd import verify

ROOT = Path(__file__).resolve().parents[2]
DROP_IN = ROOT / "systemd" / "slurmd.service.d" / "flexmig.conf"
DEBIAN_UNIT = Path("/lib/systemd/system/slurmd.service")
TEMPLATE = ROOT / "systemd" / "slurmd@.service"


@pytest.mark.integration
@pytest.mark.skipif(not DEBIAN_UNIT.exists(), reason="Debian's slurmd package is not installed")
def test_systemd_accepts_the_drop_in_on_debians_slurmd_unit(tmp_path: Path) -> None:
    shutil.copy(DEBIAN_UNIT, tmp_path / "slurmd.service")
    (tmp_path / "slurmd.service.d").mkdir()
    shutil.copy(DROP_IN, tmp_path / "slurmd.service.d" / "flexmig.conf")
    result = verify(tmp_path / "slurmd.service")
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_the_conf_value_is_one_argument_and_the_environment_file_round_trips() -> None:
    text = DROP_IN.read_text()
    # ${VAR} keeps its spaces in one argument; $VAR would split "CPUs=64 Gres=..." into words
    assert f"--conf ${{{ENV_CONF}}}" in text and f"-N ${{{ENV_NODE}}}" in text
    env = render_env_file("gpu-7", "CPUs=64 RealMemory=500000 Gres=gpu:3g.71gb:2,gpu:1g.18gb:1")
    assert read_env_file(env) == {
        ENV_NODE: "gpu-7",
        ENV_CONF: "CPUs=64 RealMemory=500000 Gres=gpu:3g.71gb:2,gpu:1g.18gb:1",
    }


@pytest.mark.integration
def test_systemd_accepts_an_instance_of_the_per_gpu_template(tmp_path: Path) -> None:
    shutil.copy(TEMPLATE, tmp_path / "slurmd@.service")
    result = verify(tmp_path / "slurmd@fm-node-gpu3.service")
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_the_template_reads_the_files_flexmig_writes_for_each_gpu_node() -> None:
    text = TEMPLATE.read_text()
    assert f"--conf ${{{ENV_CONF}}}" in text and f"-N ${{{ENV_NODE}}}" in text and "-Z" in text
    for key in ("Delegate=yes", "KillMode=process"):  # as Debian's unit: jobs outlive a restart, cgroups delegated
        assert f"\n{key}\n" in text
    node = gpu_node("fm-node", 3)
    settings = SlurmSettings(
        slurmd_unit="slurmd@{node}.service",
        slurmd_env=Path("/run/flexmig/slurm/slurmd-{node}.env"),
        slurmd_pid_file=Path("/run/slurmd-{node}.pid"),
        node_per_gpu=True,
    ).for_node(node, port=6833)
    unit = settings.slurmd_unit.removesuffix(".service").split("@", 1)
    assert unit == ["slurmd", node]
    instance = text.replace("%i", node)  # what systemd reads for slurmd@fm-node-gpu3.service
    assert f"EnvironmentFile={settings.slurmd_env}\n" in instance
    assert f"ConditionPathExists={settings.slurmd_env}\n" in instance
    assert f"PIDFile={settings.slurmd_pid_file}\n" in instance
    assert "Port=6833" in settings.slurmd_conf


STATIC = ROOT / "systemd" / "slurmd-static@.service"


@pytest.mark.integration
def test_systemd_accepts_an_instance_of_the_static_node_template(tmp_path: Path) -> None:
    shutil.copy(STATIC, tmp_path / "slurmd-static@.service")
    result = verify(tmp_path / "slurmd-static@fm-node-gpu3-4-3g71gb.service")
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_the_static_template_starts_the_named_node_of_slurm_conf_without_z() -> None:
    text = STATIC.read_text()
    start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    # a static node: slurm.conf has its Port= and Gres=; -Z with a slurm.conf node's name is fatal ("Duplicated
    # NodeName"), and --conf is read only with -Z
    assert f"-N ${{{ENV_NODE}}}" in start and "-Z" not in start and "--conf" not in start
    for key in ("Delegate=yes", "KillMode=process"):
        assert f"\n{key}\n" in text
    node = slot_node("fm-node", 3, 4, "3g.71gb")
    settings = SlurmSettings(
        slurmd_unit="slurmd-static@{node}.service",
        slurmd_env=Path("/run/flexmig/slurm/slurmd-{node}.env"),
        slurmd_pid_file=Path("/run/slurmd-{node}.pid"),
        node_per_instance=True,
        instance_nodes="static",
    ).for_node(node)
    assert settings.slurmd_unit == "slurmd-static@fm-node-gpu3-4-3g71gb.service"
    instance = text.replace("%i", node)
    assert f"EnvironmentFile={settings.slurmd_env}\n" in instance
    assert f"PIDFile={settings.slurmd_pid_file}\n" in instance
    env = render_env_file(node, "Gres=gpu:3g.71gb:1", static=True)
    assert read_env_file(env) == {ENV_NODE: node, ENV_CONF: "Gres=gpu:3g.71gb:1", ENV_MODE: "static"}
