"""Static facts the simulated driver answers with: profile counts, compute-instance names, clocks.

These are the parts of a real driver's behaviour that are not in the pure MIG catalogue (``flexmig.mig``) because
nothing above the driver may rely on them: profile counts, clock tables (GPU-instance IDs are in
:mod:`flexmig.sim.gi_ids`, compute-instance profiles in :mod:`flexmig.sim.ciprofiles`, what each driver release
offers in :mod:`flexmig.sim.drivers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.mig import GpuModel, Profile

__all__ = [
    "CI_PROFILE_COUNT",
    "FAKE_PID_BASE",
    "GI_PROFILE_COUNT",
    "MAX_MIG_DEVICES",
    "MIB",
    "Activity",
    "ClockTable",
    "ci_name",
    "clock_table",
]

MIB = 1 << 20
GI_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT
CI_PROFILE_COUNT = 0x9  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT
MAX_MIG_DEVICES = 7
# Fake pids start above Linux's largest possible pid_max (2**22), so they can never name a real process.
FAKE_PID_BASE = 5_000_000


def ci_name(profile: Profile, slices: int) -> str:
    """NVML's compute-instance profile name: ``MIG 3g.71gb`` when it spans the GI, else ``MIG 1c.3g.71gb``."""
    if slices == profile.compute_slices:
        return profile.nvml_name
    return f"MIG {slices}c.{profile.name}"


@dataclass(frozen=True, slots=True)
class ClockTable:
    """Clocks of one GPU model in MHz: SM clock at idle and under load, memory clock."""

    sm_idle: int
    sm_max: int
    mem: int


_CLOCKS = {
    "a100-40": ClockTable(210, 1410, 1215),
    "a100-80": ClockTable(210, 1410, 1593),
    "h100-80": ClockTable(345, 1980, 2619),
    "h200": ClockTable(345, 1980, 3201),
}


def clock_table(model: GpuModel) -> ClockTable:
    """Clock table of ``model`` (a plausible default for a model without one)."""
    return _CLOCKS.get(model.key, ClockTable(300, 1500, 1500))


@dataclass(frozen=True, slots=True)
class Activity:
    """How busy a MIG device (or a GPU without MIG) is, each a fraction 0..1, as GPM would measure it."""

    sm: float = 0.0
    occupancy: float = 0.0
    dram: float = 0.0
    tensor: float = 0.0

    def as_tuple(self) -> tuple[float, float, float, float]:
        """(sm, occupancy, dram, tensor): the order of the simulator's GPM counters."""
        return (self.sm, self.occupancy, self.dram, self.tensor)
