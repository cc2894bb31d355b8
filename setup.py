"""The build steps pyproject.toml cannot state: the operator's files and the simulator's .pth file go into the wheel.

The systemd unit and its act drop-in, the example configuration, the dashboards with their provisioning, the alert
rules, the JSON schemas and the LICENSE live at the repository's top level, where the tests and the docs use them.
This copies them into the built package as ``flexmig/share/``, where ``flexmig install-files`` finds them. The list
is ``flexmig.cli.shipped_files.SHIPPED``, loaded here by its path (the package is not importable while it builds).
An editable install reads the same files from the checkout instead, so it skips the copy.

``flexmig-sim.pth`` goes beside the package in site-packages, in a wheel and in an editable install alike: its one
line (``flexmig.simenv.PTH_LINE``) lets ``FLEXMIG_SIM_STATE`` put any Python process of the environment on a
simulated node, and does nothing when that variable is unset.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


PTH = "flexmig-sim.pth"


def _load(name: str, rel: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shipped_module() -> ModuleType:
    return _load("_flexmig_shipped", "daemon/flexmig/cli/shipped_files.py")


class BuildPyWithShare(build_py):
    """``build_py``, then the .pth file and the shipped files copied to ``flexmig/share/`` in the build tree."""

    def run(self) -> None:
        super().run()
        line = _load("_flexmig_simenv", "daemon/flexmig/simenv.py").PTH_LINE
        if getattr(self, "editable_mode", False):
            # An editable wheel is the install directory itself (setuptools' editable_wheel points install_lib there).
            site = Path(self.get_finalized_command("install").install_lib)
            (site / PTH).write_text(line, encoding="utf-8")
            return
        (Path(self.build_lib) / PTH).write_text(line, encoding="utf-8")
        files = _shipped_module().shipped_files(ROOT)
        if not any(p.as_posix() == "systemd/flexmigd.service" for p in files):
            raise SystemExit("setup.py: systemd/flexmigd.service is missing from the source tree")
        for rel in files:
            dest = Path(self.build_lib) / "flexmig" / "share" / rel
            self.mkpath(str(dest.parent))
            self.copy_file(str(ROOT / rel), str(dest))


setup(cmdclass={"build_py": BuildPyWithShare})
