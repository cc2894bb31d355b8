"""``FLEXMIG_SIM_STATE`` at interpreter start (``flexmig.simenv``): nothing without it, never over a real driver unless
asked. What it does in a process that sets it is in tests/cli/test_sim_cmd.py (other processes, the .pth file)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flexmig.simenv import ENV, ON_REAL_GPU_ENV, PTH_LINE, arm, real_driver


def test_without_the_variable_nothing_happens() -> None:
    finders = list(sys.meta_path)
    assert arm({}) is False
    assert sys.meta_path == finders


def test_on_a_machine_with_a_real_driver_the_variable_is_ignored_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06\n")
    finders = list(sys.meta_path)
    assert arm({ENV: str(tmp_path / "state.json")}, driver=driver) is False
    assert sys.meta_path == finders
    assert f"set {ON_REAL_GPU_ENV}=1" in capsys.readouterr().err
    assert real_driver({ON_REAL_GPU_ENV: "1"}, driver) is False  # asked for it
    assert real_driver({}, tmp_path / "absent") is False


def test_the_pth_line_reads_the_variable_before_it_imports_anything_of_flexmig() -> None:
    assert PTH_LINE.startswith("import os; ") and PTH_LINE.endswith("\n") and PTH_LINE.count("\n") == 1
    assert PTH_LINE.index(f'os.environ.get("{ENV}")') < PTH_LINE.index("flexmig.simenv")
