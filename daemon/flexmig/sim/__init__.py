"""A simulated ``libnvidia-ml`` that sits under pynvml, so a machine without a GPU looks like a MIG node.

``install(spec)`` returns a :class:`SimNode` to change the node from tests and demos; ``uninstall()`` removes it.
:class:`SimProcessTable` registers the real processes of jobs on its MIG devices (a driver sees them by itself), and
:class:`JobLoad` gives them a training job's memory and activity. :mod:`flexmig.sim.follow` is another process's
live, read-only view of a node a daemon keeps in its state file; :mod:`flexmig.sim.smi` the simulator's nvidia-smi.
The real pynvml wrappers run against it, so ``flexmig.nvml`` and nvitop see the same GPUs and MIG devices.
"""

from flexmig.sim.install import install, installed, uninstall
from flexmig.sim.jobload import JobLoad
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
    "JobLoad",
    "ProcessTruth",
    "SimNode",
    "SimProcessTable",
    "install",
    "installed",
    "uninstall",
]
