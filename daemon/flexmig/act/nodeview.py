"""The node as the actuator reasons about it: instances by ``(gpu, start)``, with GI ID, MIG UUID and processes.

Built from one NVML :class:`~flexmig.nvml.types.Inventory`; GI IDs and UUIDs are read back, never assumed, and
a view is thrown away after every reconfiguration.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.errors import LayoutError
from flexmig.mig.catalogue import GpuModel, Profile, model_for
from flexmig.mig.layout import Layout
from flexmig.nvml.types import GpuInfo, Inventory

__all__ = ["InstanceView", "NodeView"]


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One GPU instance: place, profile, driver GI ID, its MIG device's UUID and the pids NVML lists on it.

    ``pids`` is None when NVML would not list processes (then nothing may assume the instance is idle).
    """

    gpu: int
    start: int
    profile: str
    gi_id: int
    uuid: str | None
    pids: frozenset[int] | None

    @property
    def key(self) -> tuple[int, int]:
        """``(gpu, start)``."""
        return (self.gpu, self.start)

    def spec(self) -> str:
        """``gpu0:1g.18gb@3``."""
        return f"gpu{self.gpu}:{self.profile}@{self.start}"


@dataclass(frozen=True, slots=True)
class NodeView:
    """Instances of every GPU, the GPUs' models, and which GPUs are lost."""

    instances: tuple[InstanceView, ...]
    models: tuple[tuple[int, GpuModel | None], ...]
    lost: frozenset[int]

    @classmethod
    def of(cls, inv: Inventory) -> NodeView:
        """Build the view of ``inv``."""
        out: list[InstanceView] = []
        models: list[tuple[int, GpuModel | None]] = []
        lost: set[int] = set()
        for g in inv.gpus:
            model = _model(g)
            models.append((g.index, model))
            if g.lost:
                lost.add(g.index)
            for gi in g.gpu_instances:
                name = gi.profile_name
                if name is None and model is not None:
                    name = model.profile_name(gi.profile_id)
                dev = next((d for d in g.mig_devices if d.gpu_instance_id == gi.id), None)
                pids = None
                if dev is not None and dev.processes is not None:
                    pids = frozenset(p.pid for p in dev.processes)
                out.append(
                    InstanceView(
                        gpu=g.index,
                        start=gi.start,
                        profile=name or f"profile-id-{gi.profile_id}",
                        gi_id=gi.id,
                        uuid=dev.uuid if dev is not None else None,
                        pids=pids,
                    )
                )
        return cls(tuple(sorted(out, key=lambda i: i.key)), tuple(models), frozenset(lost))

    def instance(self, gpu: int, start: int) -> InstanceView | None:
        """The instance at ``(gpu, start)``, if any."""
        for i in self.instances:
            if i.gpu == gpu and i.start == start:
                return i
        return None

    def model(self, gpu: int) -> GpuModel | None:
        """GPU ``gpu``'s model, None if unknown (or no such GPU)."""
        for idx, m in self.models:
            if idx == gpu:
                return m
        return None

    def gpus(self) -> tuple[int, ...]:
        """GPU indices, ascending."""
        return tuple(idx for idx, _ in self.models)

    def layout(self, gpu: int, without: frozenset[tuple[int, int]] = frozenset()) -> Layout | None:
        """GPU ``gpu``'s layout as the pure model sees it (minus instances at ``without``); None if unknown."""
        model = self.model(gpu)
        if model is None:
            return None
        items: list[tuple[Profile, int]] = []
        for i in self.instances:
            if i.gpu != gpu or i.key in without:
                continue
            try:
                items.append((model.profile(i.profile), i.start))
            except KeyError:
                return None
        try:
            return Layout.of(model, items)
        except LayoutError:
            return None


def _model(g: GpuInfo) -> GpuModel | None:
    """The GPU's model as its driver offers it (the planner plans no profile the driver lacks)."""
    return model_for(g.name, g.offers)
