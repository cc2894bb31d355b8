"""What the jobs that run on a simulated node use of their instances: memory and activity, as a driver would show.

On hardware a job's rank holds GPU memory and keeps its instance's SMs busy, and NVML (GPM on Hopper, the process
list, memory info) shows it. On the simulated node the actuator registers each rank's real pid on its MIG device
(:class:`~flexmig.sim.process_table.SimProcessTable`), but the rank runs no CUDA: without this module the node shows
every running job at 0 % SM and a few MiB. :class:`JobLoad` gives each real process a training job's footprint: it
holds 55-75 % of its instance's memory and keeps the instance's SMs 70-85 % busy, with a slow drift; values are pure
functions of the seed, the pid and the time passed in (so calling more or less often changes nothing), like the
synthetic workload of :mod:`flexmig.sim.workload`. Synthetic processes (fake pids) are that workload's, not this one's.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Collection

from flexmig.errors import SimError
from flexmig.sim.model import Activity
from flexmig.sim.node import SimNode

__all__ = ["JobLoad", "JobUsage"]

_MEMORY_STEP = 64 << 20  # memory moves in 64 MiB steps, so the state file is not rewritten for every byte


class JobUsage:
    """The footprint of one job process: deterministic from the seed and its pid."""

    def __init__(self, seed: int, pid: int) -> None:
        rng = random.Random(f"{seed}/job/{pid}")  # noqa: S311 (simulation, not crypto)
        self.memory = rng.uniform(0.55, 0.75)
        self.sm = rng.uniform(0.7, 0.85)
        self.period_s = rng.uniform(60.0, 180.0)
        self.phase = rng.uniform(0.0, 2 * math.pi)

    def memory_fraction(self, now: float) -> float:
        """Fraction of its instance's memory the process holds at ``now``."""
        return max(0.0, min(1.0, self.memory + 0.05 * math.sin(2 * math.pi * now / self.period_s + self.phase)))

    def activity(self, now: float) -> Activity:
        """Its instance's GPM-style activity at ``now``."""
        sm = max(0.0, min(1.0, self.sm + 0.08 * math.sin(2 * math.pi * now / (self.period_s / 3) + self.phase)))
        return Activity(sm=sm, occupancy=0.55 * sm, dram=min(1.0, 0.5 * sm + 0.05), tensor=0.7 * sm)


class JobLoad:
    """Steps the footprint of every real process on the node's MIG devices (the daemon's job ranks).

    Called like the demo workload (``load(now, exclude=...)``, on the NVML thread); ``exclude`` is accepted for that
    shape and ignored: the instances it names are exactly the jobs' own.
    """

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self._usage: dict[int, JobUsage] = {}

    def __call__(self, now: float, *, exclude: Collection[tuple[int, int]] = ()) -> None:
        del exclude
        node = self.node
        seen: set[int] = set()
        changed = False
        for gpu in node.gpus():
            for gi in gpu.gpu_instances:
                procs = [(ci, p) for ci in gi.compute_instances for p in ci.processes]
                real = [p for _, p in procs if p.real]
                if not real:
                    continue
                others = sum(p.memory_bytes for _, p in procs if not p.real)
                share = max(0, (gi.profile.memory_mib << 20) - others) // len(real)
                for p in real:
                    seen.add(p.pid)
                    usage = self._usage.setdefault(p.pid, JobUsage(node.seed, p.pid))
                    want = int(usage.memory_fraction(now) * share) // _MEMORY_STEP * _MEMORY_STEP
                    if want != p.memory_bytes:
                        # Gone meanwhile, no room beside another's, or a state file it cannot write now: a footprint
                        # is a measurement, tried again at the next step, never a reason for the daemon to fail.
                        with contextlib.suppress(SimError, OSError):
                            node.set_process_memory(p.pid, want)
                            changed = True
                for ci in gi.compute_instances:
                    first = next((p for p in ci.processes if p.real), None)
                    if first is None:
                        continue
                    act = self._usage[first.pid].activity(now)
                    node.set_activity(ci.uuid, sm=act.sm, dram=act.dram, tensor=act.tensor, occupancy=act.occupancy)
                    changed = True
        for pid in set(self._usage) - seen:
            del self._usage[pid]
        if changed:
            with contextlib.suppress(OSError):  # a full disk under the state file: the next step saves again
                node.save()
