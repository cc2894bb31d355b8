"""flexmig's drop-in for slurmd's own unit: systemd accepts it on Debian's slurmd.service, and it passes the
dynamic node's parameters to slurmd as one argument each."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flexmig.slurm.slurmd import ENV_CONF, ENV_NODE, read_env_file, render_env_file
from support.systemd import verify

ROOT = Path(__file__).resolve().parents[2]
DROP_IN = ROOT / "systemd" / "slurmd.service.d" / "flexmig.conf"
DEBIAN_UNIT = Path("/lib/systemd/system/slurmd.service")


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
