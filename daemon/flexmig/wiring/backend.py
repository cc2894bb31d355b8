"""Opening the node the daemon runs on: the real NVML, or a simulated node installed under pynvml first.

This is the one place that chooses between the driver and the simulator. :func:`open_backend` returns what the
layers below need of the node, so none of them knows which it has: the NVML session, the reader the sampler sweeps,
the process table the actuator registers ranks in, and, on a simulated node only, the demo workload.

Everything here runs on the NVML thread (:class:`NodeComponent`, the daemon's first component, calls
:func:`open_backend` and :meth:`Backend.close` through its :class:`~flexmig.nvml.worker.NvmlWorker`), so the
simulator's state and NVML's are only ever touched from that one thread by the daemon.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from flexmig import sim
from flexmig.act.devices import DeviceProcessTable, DriverProcessTable
from flexmig.config import Config
from flexmig.errors import FlexmigError
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.nvml import GpmWindows, Nvml, NvmlWorker
from flexmig.storage import DirectoryLock
from flexmig.telemetry.reader import NvmlReader
from flexmig.wiring.component import idle

__all__ = ["Backend", "DemoWorkload", "NodeComponent", "open_backend"]


class DemoWorkload(Protocol):
    """The simulated node's synthetic workload (``SimNode.step_workload``): what ``flexmigd --sim`` shows."""

    def __call__(self, now: float, *, exclude: Collection[tuple[int, int]] = ()) -> None:
        """Advance the workload to ``now``, leaving alone the instances at ``exclude`` (GPU index, first slice)."""


@dataclass(slots=True)
class Backend:
    """An open NVML session, with what the daemon's layers need of the node it runs on."""

    nvml: Nvml
    reader: NvmlReader
    devices: DeviceProcessTable
    """Where the actuator registers rank processes: the driver's own table, or the simulated node's."""
    workload: DemoWorkload | None
    """What to step on the NVML thread of a simulated node: the jobs' footprint on their instances
    (:class:`~flexmig.sim.JobLoad`), after the demo workload unless the caller asked for none; None on real
    hardware."""
    node: sim.SimNode | None
    """The simulated node under pynvml, None on real hardware (tests reach into it)."""
    lock: DirectoryLock | None = None
    """Held while a simulated node keeps its state in a file: a second daemon on that file is refused."""

    @property
    def simulated(self) -> bool:
        """True when NVML reads a simulated node."""
        return self.node is not None

    def close(self) -> None:
        """Free GPM samples, shut NVML down, and take the simulator away again."""
        try:
            if self.reader.gpm is not None:
                self.reader.gpm.close()
            self.nvml.close()
        finally:
            if self.node is not None:
                sim.uninstall()
            if self.lock is not None:
                self.lock.release()


def open_backend(
    sim_spec: str | None,
    gpm: bool,
    clock: Callable[[], float] = time.monotonic,
    sim_state: Path | None = None,
    *,
    sim_workload: bool = True,
) -> Backend:
    """Install the simulated node ``sim_spec`` (if given), open NVML and set up GPM windows (if ``gpm``).

    ``sim_state``: the simulator's state file (restored if it exists, saved on every change), so a simulated
    node keeps its instances across daemon restarts. ``sim_workload``: whether a simulated node comes with its demo
    workload (the jobs' footprint on their instances is stepped either way). Raises NodeSpecError for a bad spec,
    SimError for an unreadable state file, NvmlUnavailableError when there is no driver and no simulator,
    StateInUseError when another daemon runs on the same state file (its lock, ``FILE.lock``, is taken before the
    file is read: two daemons on one simulated node would each rewrite it).
    """
    lock = None
    if sim_spec is not None and sim_state is not None:
        lock = DirectoryLock.acquire(Path(f"{sim_state}.lock"), f"simulated node {sim_state}")
    try:
        node = sim.install(sim_spec, clock=clock, state_path=sim_state) if sim_spec is not None else None
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    try:
        nvml = Nvml.open()
    except BaseException:
        if node is not None:
            sim.uninstall()
        if lock is not None:
            lock.release()
        raise
    windows = GpmWindows(clock=clock) if gpm else None
    if node is None:
        return Backend(nvml, NvmlReader(nvml, windows), DriverProcessTable(), None, None)
    jobs = sim.JobLoad(node)
    workload: DemoWorkload = _Both(node.step_workload, jobs) if sim_workload else jobs
    return Backend(nvml, NvmlReader(nvml, windows), sim.SimProcessTable(node), workload, node, lock)


class _Both:
    """The synthetic workload, then the jobs' own footprint, in one step."""

    def __init__(self, first: DemoWorkload, second: DemoWorkload) -> None:
        self.first, self.second = first, second

    def __call__(self, now: float, *, exclude: Collection[tuple[int, int]] = ()) -> None:
        self.first(now, exclude=exclude)
        self.second(now, exclude=exclude)


class NodeComponent:
    """The daemon's first component, ``nvml``: opens the node (:func:`open_backend`) at start and closes it last, both
    on the NVML thread. :attr:`backend` is what the components after it sample, reconfigure and launch ranks on."""

    name = "nvml"
    restart = False

    def __init__(
        self,
        worker: NvmlWorker,
        sim_spec: str | None,
        *,
        gpm: bool,
        clock: Callable[[], float] = time.monotonic,
        sim_state: Path | None = None,
        sim_workload: bool = True,
    ) -> None:
        self.worker = worker
        self.sim_spec = sim_spec
        self.gpm = gpm
        self.clock = clock
        self.sim_state = sim_state
        self.sim_workload = sim_workload
        self.backend: Backend | None = None
        """The open node, from start to close."""

    async def start(self) -> None:
        """Install the simulated node (with ``sim_spec``) and open NVML."""
        self.backend = await self.worker.call(
            open_backend, self.sim_spec, self.gpm, self.clock, self.sim_state, sim_workload=self.sim_workload
        )

    async def run(self) -> None:
        """No loop: the node is read and changed by the components after this one."""
        await idle()

    async def drain(self) -> None:
        """Nothing in flight of its own."""

    async def close(self) -> None:
        """Shut NVML down and take the simulated node away (after every other component closed)."""
        backend, self.backend = self.backend, None
        if backend is not None:
            with contextlib.suppress(FlexmigError):
                await self.worker.call(backend.close)

    def reload(self, config: Config) -> None:
        """Nothing to apply: the node and its GPM setting are the start's (``sampling.gpm`` is a restart key)."""

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """None of its own (the sampler exports what NVML reports)."""
        return ()
