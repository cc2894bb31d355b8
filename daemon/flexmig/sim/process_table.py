"""Telling the simulated node which real process runs on which MIG device.

On real hardware the CUDA driver does this by itself: a rank that opens its MIG device shows up in NVML's process
list for it. The simulated node cannot see CUDA contexts, so the supervisor registers each rank's real pid on its
MIG device, and NVML (ours, nvitop's) lists it there. :class:`SimProcessTable` does that; it has the shape of the
actuator's ``DeviceProcessTable`` Protocol (``flexmig.act.devices``), which the simulator does not import: the
wiring that chose the simulated node hands it to the actuator.
"""

from __future__ import annotations

import contextlib

from flexmig.errors import SimError
from flexmig.sim.node import SimNode
from flexmig.sim.state import pid_alive

__all__ = ["SimProcessTable"]


class SimProcessTable:
    """The simulated node's process table: registers real pids through :meth:`SimNode.start_process`.

    The simulator drops a real pid from its listings once it no longer runs, zombies included
    (:func:`~flexmig.sim.state.pid_alive`): rank processes left behind by a crashed daemon become zombies where
    PID 1 does not reap orphans (containers), while a driver would already have released their contexts.
    :meth:`prune` removes, and names, the registered real processes that fail the same test.
    """

    def __init__(self, node: SimNode) -> None:
        self.node = node

    def attach(self, uuid: str, pid: int) -> None:
        """Register ``pid`` on ``uuid``; a pid already registered there is left alone."""
        for gpu in self.node.gpus():
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    if ci.uuid == uuid and any(p.pid == pid for p in ci.processes):
                        return
        self.node.start_process(uuid, pid=pid, real=True)

    def detach(self, uuid: str, pid: int) -> None:
        """Remove ``pid`` from the node (already gone is fine)."""
        with contextlib.suppress(SimError):
            self.node.stop_process(pid)

    def prune(self) -> list[int]:
        """Remove registered real processes that have exited or are zombies; returns their pids."""
        gone = []
        for gpu in self.node.gpus():
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    for p in ci.processes:
                        if p.real and not pid_alive(p.pid):
                            gone.append(p.pid)
        for pid in gone:
            with contextlib.suppress(SimError):
                self.node.stop_process(pid)
        return gone
