"""Opening the node the daemon samples: the real NVML, or a simulated node installed under pynvml first.

Everything here runs on the NVML thread (the daemon calls :func:`open_backend` and :meth:`Backend.close` through
its :class:`~flexmig.nvml.worker.NvmlWorker`), so the simulator's state and NVML's are only ever touched from
that one thread by the daemon.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flexmig import sim
from flexmig.nvml import GpmWindows, GpuSample, Inventory, Nvml

__all__ = ["Backend", "NvmlReader", "open_backend"]


class NvmlReader:
    """The sampler's view of an NVML session: inventory, and sweeps that carry GPM windows from one to the next."""

    def __init__(self, nvml: Nvml, gpm: GpmWindows | None) -> None:
        self.nvml = nvml
        self.gpm = gpm

    def inventory(self) -> Inventory:
        """``Nvml.inventory``."""
        return self.nvml.inventory()

    def sample(self) -> tuple[GpuSample, ...]:
        """``Nvml.sample`` with this reader's GPM windows."""
        return self.nvml.sample(self.gpm)


@dataclass(slots=True)
class Backend:
    """An open NVML session (and the simulated node under it, if any)."""

    nvml: Nvml
    reader: NvmlReader
    node: sim.SimNode | None  # the simulated node, for the demo workload and for tests

    @property
    def workload_step(self) -> Callable[[float], None] | None:
        """The simulator's synthetic workload step (the demo), or None on real hardware."""
        return None if self.node is None else self.node.step_workload

    def close(self) -> None:
        """Free GPM samples, shut NVML down, and take the simulator away again."""
        try:
            if self.reader.gpm is not None:
                self.reader.gpm.close()
            self.nvml.close()
        finally:
            if self.node is not None:
                sim.uninstall()


def open_backend(
    sim_spec: str | None,
    gpm: bool,
    clock: Callable[[], float] = time.monotonic,
    sim_state: Path | None = None,
) -> Backend:
    """Install the simulated node ``sim_spec`` (if given), open NVML and set up GPM windows (if ``gpm``).

    ``sim_state``: the simulator's state file (restored if it exists, saved on every change), so a simulated
    node keeps its instances across daemon restarts. Raises NodeSpecError for a bad spec, SimError for an
    unreadable state file, NvmlUnavailableError when there is no driver and no simulator.
    """
    node = sim.install(sim_spec, clock=clock, state_path=sim_state) if sim_spec is not None else None
    try:
        nvml = Nvml.open()
    except BaseException:
        if node is not None:
            sim.uninstall()
        raise
    windows = GpmWindows(clock=clock) if gpm else None
    return Backend(nvml, NvmlReader(nvml, windows), node)
