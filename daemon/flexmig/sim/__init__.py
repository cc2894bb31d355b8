"""A simulated ``libnvidia-ml`` that sits under pynvml, so a machine without a GPU looks like a MIG node.

``install(spec)`` returns a :class:`SimNode` to change the node from tests and demos; ``uninstall()`` removes it.
:class:`SimProcessTable` registers the real processes of jobs on its MIG devices (a driver sees them by itself).
The real pynvml wrappers run against it, so ``flexmig.nvml`` and nvitop see the same GPUs and MIG devices.
"""

from flexmig.sim.install import install, installed, uninstall
from flexmig.sim.model import FAKE_PID_BASE, Activity
from flexmig.sim.node import SimNode
from flexmig.sim.process_table import SimProcessTable
from flexmig.sim.truth import ComputeInstanceTruth, GpuInstanceTruth, GpuTruth, ProcessTruth

__all__ = [
    "FAKE_PID_BASE",
    "Activity",
    "ComputeInstanceTruth",
    "GpuInstanceTruth",
    "GpuTruth",
    "ProcessTruth",
    "SimNode",
    "SimProcessTable",
    "install",
    "installed",
    "uninstall",
]
