"""systemd's own checks of a unit file (``systemd-analyze verify`` and ``security --offline``), and running a
``support.*`` module as a child process under a wrapper (``setpriv``, ``unshare``) as a service manager would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def systemd_analyze() -> str:
    """The ``systemd-analyze`` binary; the test fails (not skips) without it: CI installs the package."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze not found: apt-get install systemd (make debs does it)")
    return tool


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify --man=no UNIT`` (exit 0 on parse warnings: callers check stderr too)."""
    return subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=120, check=False
    )


def exposure(unit: Path) -> tuple[float, str]:
    """``systemd-analyze security --offline=true`` of ``unit`` (drop-ins beside it included): level and report."""
    done = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    m = re.search(r"Overall exposure level for flexmigd\.service: (\d+\.\d+)", text)
    assert m, done.stdout + done.stderr
    return float(m.group(1)), text


def run_support_module(
    wrapper: list[str], module: str, *args: str, timeout_s: float = 200
) -> subprocess.CompletedProcess[str]:
    """``WRAPPER... python -m support.MODULE ARGS...`` with tests/ on the child's path; its output, not checked."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [*wrapper, sys.executable, "-m", f"support.{module}", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
