"""Static facts the simulated driver answers with: compute-instance profiles, GI-ID numbering, clocks, versions.

These are the parts of a real driver's behaviour that are not in the pure MIG catalogue (``flexmig.mig``) because
nothing above the driver may rely on them: compute-instance placements, clock tables (GPU-instance IDs are in
:mod:`flexmig.sim.gi_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.mig import GpuModel, Profile

__all__ = [
    "CI_PROFILE_COUNT",
    "CUDA_DRIVER_VERSION",
    "DRIVER_VERSION",
    "FAKE_PID_BASE",
    "GI_PROFILE_COUNT",
    "MAX_MIG_DEVICES",
    "MIB",
    "NVML_VERSION",
    "Activity",
    "ClockTable",
    "ci_index",
    "ci_name",
    "ci_sizes",
    "ci_slices_for_index",
    "ci_starts",
    "clock_table",
]

MIB = 1 << 20
DRIVER_VERSION = "570.124.06"
NVML_VERSION = "12.570.124.06"
CUDA_DRIVER_VERSION = 12080
GI_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT
CI_PROFILE_COUNT = 0x9  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT
MAX_MIG_DEVICES = 7
# Fake pids start above Linux's largest possible pid_max (2**22), so they can never name a real process.
FAKE_PID_BASE = 5_000_000

# NVML_COMPUTE_INSTANCE_PROFILE_* index by compute-slice count; the CI profile ID equals the index.
_CI_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
# Compute-instance sizes a GPU instance of ``g`` compute slices offers (``nvidia-smi mig -lcip``).
_CI_SIZES = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}


def ci_sizes(gi_slices: int) -> tuple[int, ...]:
    """Compute-instance sizes (in compute slices) available inside a GPU instance of ``gi_slices``."""
    return _CI_SIZES[gi_slices]


def ci_index(slices: int) -> int:
    """The NVML compute-instance profile index (and ID) of a ``slices``-slice compute instance."""
    return _CI_INDEX[slices]


def ci_slices_for_index(index: int) -> int | None:
    """Compute slices of the compute-instance profile at ``index``, or None for an index we do not model."""
    for slices, idx in _CI_INDEX.items():
        if idx == index:
            return slices
    return None


def ci_starts(gi_slices: int, slices: int) -> tuple[int, ...]:
    """Allowed starts (in compute slices, inside the GPU instance) of a ``slices`` compute instance.

    Aligned to their size like GPU-instance placements; 3-slice instances sit at 0 and 4 as the 3g profile does.
    """
    if slices == gi_slices:
        return (0,)
    if slices == 3:
        return tuple(s for s in (0, 4) if s + 3 <= gi_slices)
    return tuple(range(0, gi_slices - slices + 1, slices))


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
