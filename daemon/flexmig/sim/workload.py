"""A small synthetic workload that makes the simulated node look alive in the demo.

Each MIG device gets a role drawn from the seed and its placement (GPU, start, profile), so the same node spec and
seed always show the same picture, and a role survives the instance being re-created at the same place. Values
are pure functions of the time passed in (smooth sines), so calling more or less often changes nothing.

Roles: ``idle`` (no process), ``light`` (a small job that underuses its instance, what the detector should flag),
``steady`` (a busy training job), ``bursty`` (alternates between busy and nearly idle).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from flexmig.sim.model import Activity

__all__ = ["DeviceRole", "SyntheticWorkload"]

_ROLES = (("idle", 0.2), ("light", 0.3), ("steady", 0.3), ("bursty", 0.2))


@dataclass(frozen=True, slots=True)
class DeviceRole:
    """What the synthetic workload does on one MIG device."""

    kind: str
    memory_base: float  # fraction of the instance's memory
    memory_amp: float
    sm_base: float
    sm_amp: float
    period_s: float
    phase: float

    def memory_fraction(self, now: float) -> float:
        """Fraction of the instance's memory the workload process holds at ``now``."""
        if self.kind == "idle":
            return 0.0
        return _clamp(self.memory_base + self.memory_amp * math.sin(self._angle(now) / 3))

    def activity(self, now: float) -> Activity:
        """GPM-style activity at ``now``."""
        if self.kind == "idle":
            return Activity()
        wave = math.sin(self._angle(now))
        if self.kind == "bursty":
            sm = self.sm_base + self.sm_amp if wave > 0 else 0.03
        else:
            sm = self.sm_base + self.sm_amp * wave
        sm = _clamp(sm)
        return Activity(sm=sm, occupancy=_clamp(0.55 * sm), dram=_clamp(0.5 * sm + 0.05), tensor=_clamp(0.7 * sm))

    def _angle(self, now: float) -> float:
        return 2 * math.pi * now / self.period_s + self.phase


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


class SyntheticWorkload:
    """Roles per MIG device, deterministic from ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def role(self, gpu_index: int, start: int, profile_name: str) -> DeviceRole:
        """The role of the instance of ``profile_name`` at memory slice ``start`` of GPU ``gpu_index``."""
        rng = random.Random(f"{self.seed}/{gpu_index}/{start}/{profile_name}")  # noqa: S311 (simulation, not crypto)
        kinds = [k for k, _ in _ROLES]
        kind = rng.choices(kinds, weights=[w for _, w in _ROLES])[0]
        period = rng.uniform(60.0, 300.0)
        phase = rng.uniform(0.0, 2 * math.pi)
        if kind == "light":
            return DeviceRole(kind, rng.uniform(0.1, 0.2), 0.05, rng.uniform(0.05, 0.12), 0.05, period, phase)
        if kind == "steady":
            return DeviceRole(kind, rng.uniform(0.55, 0.75), 0.1, rng.uniform(0.7, 0.85), 0.1, period, phase)
        if kind == "bursty":
            return DeviceRole(kind, rng.uniform(0.3, 0.5), 0.1, rng.uniform(0.6, 0.8), 0.15, period / 4, phase)
        return DeviceRole(kind, 0.0, 0.0, 0.0, 0.0, period, phase)
