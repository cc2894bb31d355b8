"""The simulated node for a whole process, from its environment: ``FLEXMIG_SIM_STATE=FILE``.

flexmig installs ``flexmig-sim.pth`` beside itself in site-packages. Python runs its one line at every interpreter
start; the line does nothing unless ``FLEXMIG_SIM_STATE`` is set (it imports nothing of flexmig otherwise). When it
is set, :func:`arm` makes the first ``import pynvml`` of the process put a live, read-only view of the node whose
state a daemon keeps in FILE under pynvml (:func:`flexmig.sim.follow.follow`), so any NVML program of this
environment (nvitop, gpustat, a job's own scripts, ``flexmig inventory``) sees the daemon's simulated GPUs. Programs
that never import pynvml pay nothing more than the check of one variable.

``flexmig sim exec -- CMD`` and ``flexmig sim shell`` set the variable, and also put :data:`SHIM` on
``PYTHONPATH`` for interpreters of other environments (an nvitop installed with pipx): it does the same from a
``sitecustomize`` module.

Never on a machine with a real NVIDIA driver (``/proc/driver/nvidia/version`` exists) unless
``FLEXMIG_SIM_ON_REAL_GPU=1`` asks for it: there, a stray variable must not hide the real GPUs from NVML programs; it
is ignored with one line on stderr.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["ENV", "ON_REAL_GPU_ENV", "PTH_LINE", "REAL_DRIVER", "SHIM", "arm", "attach", "real_driver"]

ENV = "FLEXMIG_SIM_STATE"
ON_REAL_GPU_ENV = "FLEXMIG_SIM_ON_REAL_GPU"
#: Present where the NVIDIA kernel driver is loaded.
REAL_DRIVER = Path("/proc/driver/nvidia/version")
#: The line of ``flexmig-sim.pth`` (setup.py writes it into the wheel and the editable install).
PTH_LINE = f'import os; os.environ.get("{ENV}") and __import__("flexmig.simenv").simenv.arm()\n'
#: The ``sitecustomize`` that ``flexmig sim exec`` puts first on PYTHONPATH, for interpreters without the .pth file.
#: ``{roots}`` are the directories that hold the ``flexmig`` and ``flexmig_hook`` packages (two in an editable install);
#: the module then runs the sitecustomize it hides.
SHIM = '''\
"""flexmig sim exec: this interpreter sees the simulated node of FLEXMIG_SIM_STATE (then the hidden sitecustomize)."""
import importlib.machinery as _m, os as _os, sys as _s
_here = _os.path.dirname(_os.path.abspath(__file__))
try:
    import flexmig.simenv as _f
except ImportError:
    _s.path.extend(r for r in {roots!r} if r not in _s.path)
    try:
        import flexmig.simenv as _f
    except ImportError as _e:
        _s.stderr.write("flexmig sim exec: cannot import flexmig here (%s); pynvml sees no simulated node\\n" % _e)
        _f = None
if _f is not None:
    _f.arm()
_rest = [p for p in _s.path if _os.path.abspath(p or ".") != _here]
_spec = _m.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _mod = type(_s)("sitecustomize")
    _mod.__file__ = _spec.origin
    _spec.loader.exec_module(_mod)
'''


def real_driver(environ: Mapping[str, str] = os.environ, driver: Path = REAL_DRIVER) -> bool:
    """True when this machine has a real NVIDIA driver and nobody asked for the simulated node anyway."""
    return driver.exists() and environ.get(ON_REAL_GPU_ENV) != "1"


def attach(path: str) -> bool:
    """Put the view of the node in ``path`` under pynvml now; True on success, else one line on stderr."""
    try:
        from flexmig.sim.follow import follow  # noqa: PLC0415  (only in processes that use NVML)

        follow(Path(path))
    except Exception as exc:  # an interpreter start must never fail for this
        sys.stderr.write(f"flexmig: {ENV}={path}: {exc}; pynvml sees no simulated node\n")
        return False
    return True


class _AttachingLoader(importlib.abc.Loader):
    """pynvml's own loader, then :func:`attach` once the module is executed."""

    def __init__(self, inner: importlib.abc.Loader, path: str) -> None:
        self._inner = inner
        self._path = path

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        attach(self._path)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._inner, name)


class _OnPynvmlImport(importlib.abc.MetaPathFinder):
    """Finds pynvml as the other finders do, with a loader that attaches the node after it ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pynvml":
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _AttachingLoader(spec.loader, self.path)
        return spec


def arm(environ: Mapping[str, str] = os.environ, driver: Path = REAL_DRIVER) -> bool:
    """Honour ``FLEXMIG_SIM_STATE`` in this process (see the module docstring); True when the node is (or will be, at
    the first ``import pynvml``) attached. Never raises."""
    path = environ.get(ENV)
    if not path:
        return False
    if real_driver(environ, driver):
        sys.stderr.write(
            f"flexmig: {ENV} is set but this machine has an NVIDIA driver ({REAL_DRIVER}): NVML programs see the real "
            f"GPUs (set {ON_REAL_GPU_ENV}=1 to see the simulated node instead)\n"
        )
        return False
    if any(isinstance(f, _OnPynvmlImport) for f in sys.meta_path):
        return True
    if "pynvml" in sys.modules:
        return attach(path)
    sys.meta_path.insert(0, _OnPynvmlImport(path))
    return True
