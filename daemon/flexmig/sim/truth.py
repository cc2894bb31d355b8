"""Ground truth of the simulated node, as immutable values: what tests compare NVML read-backs against."""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.mig import GpuModel, Layout, Profile
from flexmig.sim.model import Activity

__all__ = ["ComputeInstanceTruth", "GpuInstanceTruth", "GpuTruth", "ProcessTruth"]


@dataclass(frozen=True, slots=True)
class ProcessTruth:
    """A process on the node: pid, GPU memory held, and whether its pid is a real one (checked for liveness)."""

    pid: int
    memory_bytes: int
    real: bool


@dataclass(frozen=True, slots=True)
class ComputeInstanceTruth:
    """A compute instance, i.e. a MIG device: its ID, size and start in compute slices, UUID and processes."""

    id: int
    profile_id: int
    slices: int
    start: int
    uuid: str
    processes: tuple[ProcessTruth, ...]
    activity: Activity


@dataclass(frozen=True, slots=True)
class GpuInstanceTruth:
    """A GPU instance: its driver-chosen ID, profile, start in memory slices, compute instances."""

    id: int
    profile: Profile
    start: int
    compute_instances: tuple[ComputeInstanceTruth, ...]
    idle_used_bytes: int = 0  # what its MIG devices show as used with no process (a few MiB, as on hardware)

    @property
    def size(self) -> int:
        """Placement size in memory slices."""
        return self.profile.memory_slices

    @property
    def memory_bytes(self) -> int:
        """Memory of the instance (what its MIG devices report as total)."""
        return self.profile.memory_mib << 20


@dataclass(frozen=True, slots=True)
class GpuTruth:
    """One GPU as the simulated driver holds it."""

    index: int
    uuid: str
    model: GpuModel
    mig_current: bool
    mig_pending: bool
    lost: bool
    layout: Layout | None  # None with MIG disabled
    gpu_instances: tuple[GpuInstanceTruth, ...]  # by GI id
    mig_uuids: tuple[str, ...]  # in MIG-device index order
    processes: tuple[ProcessTruth, ...]  # every process on the GPU, MIG devices included
    fused_slot: int = 7  # the memory slice behind the chip's fused-off compute slot (flexmig.sim.gi_ids)

    @property
    def gi_ids(self) -> tuple[int, ...]:
        """GPU-instance IDs, ascending."""
        return tuple(gi.id for gi in self.gpu_instances)

    def gi_at(self, start: int) -> GpuInstanceTruth:
        """The GPU instance placed at memory slice ``start``; KeyError if none starts there.

        The way to learn a GI's ID in a test: the driver chooses it (``flexmig.sim.gi_ids``), so no test may
        compute it from the placement."""
        for gi in self.gpu_instances:
            if gi.start == start:
                return gi
        raise KeyError(f"no GPU instance starts at memory slice {start} on GPU {self.index}")

    def gi_id_at(self, start: int) -> int:
        """The ID of the GPU instance placed at memory slice ``start``."""
        return self.gi_at(start).id

    def mig_uuid_at(self, start: int) -> str:
        """The MIG UUID of the (first) compute instance of the GPU instance at memory slice ``start``."""
        return self.gi_at(start).compute_instances[0].uuid

    def mig_device(self, uuid: str) -> tuple[GpuInstanceTruth, ComputeInstanceTruth]:
        """The GI and CI behind MIG device ``uuid``; KeyError if it is not on this GPU."""
        for gi in self.gpu_instances:
            for ci in gi.compute_instances:
                if ci.uuid == uuid:
                    return gi, ci
        raise KeyError(f"no MIG device {uuid} on GPU {self.index}")
