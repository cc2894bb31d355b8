"""External fragmentation of a GPU and a node: free capacity, stranded capacity, and a demand-weighted score.

**External fragmentation score** (FGD, Weng et al., ATC '23, adapted to MIG's placements). For a GPU
``g`` with ``free(g)`` free compute slices and a request shape ``m`` (a profile):

* ``F_g(m) = free(g)`` when no instance of ``m`` can be created on ``g`` now, else ``0``: free capacity that a
  request of shape ``m`` cannot use is a fragment for it;
* ``F_g(M) = sum_m p_m * F_g(m)`` over the demand mix ``M`` with weights ``p_m`` summing to 1 (compute slices);
* score ``F_g(M) / free(g)`` (0 when nothing is free): the probability that a request drawn from the mix finds
  no place on this GPU although it has free compute. A node sums fragments and free slices over its GPUs.

Worked example (H200, default mix 1g .35, 2g .25, 3g .20, 4g .10, 7g .10): ``2g.35gb@0 + 1g.18gb@4`` has four
free compute slices; 1g and 2g fit, 3g, 4g and 7g do not: ``F = (0.20 + 0.10 + 0.10) * 4 = 1.6`` slices, score
0.4. An empty GPU scores 0; a GPU with four ``1g.35gb`` instances (three compute slices free, no memory) scores 1.

Free compute slices count compute no instance holds (7 minus those held); free memory slices count memory no
instance holds. Stranded capacity is defined in ``detect.capacity``.

**Recoverable capacity** (what the fragmentation finding and alert use): the GPU's *recoverable compute slices*
``R_g = max_m stranded(m) * compute_slices(m)`` over the profiles ``m`` the demand mix asks for (weight > 0), the
most compute slices that repacking the running instances would make usable by one profile there is demand for;
its *recoverable score* is ``R_g / 7``. The external score alone says whether free capacity is unusable now, not
whether anything can be done about it: the demo's ``3g.71gb@0 + 2g.35gb@4 + 1g.18gb@6`` scores 1.0 (its one free
compute slice fits nothing) although a repack gains one 1g (``R = 1``, score 1/7), while ``2g.35gb@0 +
1g.18gb@4`` scores only 0.4 although a repack makes room for a 4g (``R = 4``, score 4/7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from flexmig.detect.capacity import RepackKey, StrandedCapacity, repack_key, repacked_capacity, stranded_capacity
from flexmig.detect.demand import DemandMix
from flexmig.mig import Layout

__all__ = ["GpuFragmentation", "NodeFragmentation", "extend_memo", "gpu_fragmentation", "node_fragmentation"]


@dataclass(frozen=True, slots=True)
class GpuFragmentation:
    """Free, stranded and demand-unusable capacity of one GPU at one moment."""

    gpu: int
    model: str
    layout: str
    compute_slices: int
    memory_slices: int
    free_compute_slices: int
    free_memory_slices: int
    capacity: tuple[StrandedCapacity, ...]
    external_fragment: float
    """``F_g(M)``, in compute slices."""
    unfit: tuple[str, ...]
    """Profiles of the demand mix that cannot be created now (the ``m`` with ``F_g(m) > 0``)."""
    demanded: tuple[str, ...] = ()
    """Profiles of the demand mix with a positive weight on this model, in the mix's order."""

    @property
    def stranded_compute_slices(self) -> int:
        """The most compute slices that repacking would make usable by one profile."""
        return max((c.stranded_compute_slices for c in self.capacity), default=0)

    @property
    def stranded_score(self) -> float:
        """Stranded compute slices over the GPU's compute slices, 0..1."""
        return self.stranded_compute_slices / self.compute_slices

    @property
    def recoverable(self) -> StrandedCapacity | None:
        """The demanded profile whose stranded instances hold the most compute slices (None: repacking gains no
        demanded profile anything); ties go to the larger profile, then the mix's order."""
        wanted = set(self.demanded)
        best: StrandedCapacity | None = None
        for c in self.capacity:
            if c.profile not in wanted or c.stranded <= 0:
                continue
            key = (c.stranded_compute_slices, c.compute_slices)
            if best is None or key > (best.stranded_compute_slices, best.compute_slices):
                best = c
        return best

    @property
    def recoverable_compute_slices(self) -> int:
        """``R_g``: the most compute slices repacking would make usable by one profile the demand mix asks for."""
        best = self.recoverable
        return 0 if best is None else best.stranded_compute_slices

    @property
    def recoverable_score(self) -> float:
        """``R_g`` over the GPU's compute slices, 0..1 (what the fragmentation finding compares)."""
        return self.recoverable_compute_slices / self.compute_slices

    @property
    def external_score(self) -> float:
        """``F_g(M) / free(g)``, 0..1 (0 when nothing is free)."""
        return self.external_fragment / self.free_compute_slices if self.free_compute_slices else 0.0

    def creatable(self) -> dict[str, int]:
        """Profile name -> instances creatable now."""
        return {c.profile: c.creatable_now for c in self.capacity}

    def stranded(self) -> dict[str, int]:
        """Profile name -> stranded instances (only profiles with some)."""
        return {c.profile: c.stranded for c in self.capacity if c.stranded}

    def reason(self) -> str:
        """The figures in words, for a person reading an event."""
        text = f"GPU {self.gpu} ({self.model}) has {self.free_compute_slices} free compute slice(s)"
        if self.unfit:
            text += f" that cannot host {', '.join(self.unfit)}"
        stranded = self.stranded()
        if stranded:
            items = ", ".join(f"{n} {p}" for p, n in stranded.items())
            text += f"; repacking the running instances would free room for {items}"
        return text


def gpu_fragmentation(
    gpu: int, layout: Layout, demand: DemandMix, repacked: Mapping[str, int] | None = None
) -> GpuFragmentation:
    """Every fragmentation figure of one GPU (``repacked``: a memoised ``repacked_capacity(layout)``)."""
    model = layout.model
    capacity = stranded_capacity(layout, repacked)
    now = {c.profile: c.creatable_now for c in capacity}
    free = layout.free_compute_slices()
    fragment = 0.0
    unfit = []
    demanded = []
    for profile, weight in demand.resolve(model):
        demanded.append(profile.name)
        if now[profile.name] == 0:
            fragment += weight * free
            unfit.append(profile.name)
    return GpuFragmentation(
        gpu=gpu,
        model=model.key,
        layout=layout.spec(),
        compute_slices=model.compute_slices,
        memory_slices=model.memory_slices,
        free_compute_slices=free,
        free_memory_slices=len(layout.free_memory_slices()),
        capacity=capacity,
        external_fragment=fragment if free else 0.0,
        unfit=tuple(unfit) if free else (),
        demanded=tuple(demanded),
    )


@dataclass(frozen=True, slots=True)
class NodeFragmentation:
    """The node's GPUs (those with MIG enabled) and their sums."""

    gpus: tuple[GpuFragmentation, ...]

    @property
    def compute_slices(self) -> int:
        """Compute slices of all MIG GPUs."""
        return sum(g.compute_slices for g in self.gpus)

    @property
    def free_compute_slices(self) -> int:
        """Free compute slices over all MIG GPUs."""
        return sum(g.free_compute_slices for g in self.gpus)

    @property
    def free_memory_slices(self) -> int:
        """Free memory slices over all MIG GPUs."""
        return sum(g.free_memory_slices for g in self.gpus)

    @property
    def stranded_compute_slices(self) -> int:
        """Sum of the GPUs' stranded compute slices."""
        return sum(g.stranded_compute_slices for g in self.gpus)

    @property
    def stranded_score(self) -> float:
        """Stranded compute slices over all compute slices, 0..1."""
        return self.stranded_compute_slices / self.compute_slices if self.gpus else 0.0

    @property
    def recoverable_compute_slices(self) -> int:
        """Sum of the GPUs' recoverable compute slices."""
        return sum(g.recoverable_compute_slices for g in self.gpus)

    @property
    def external_fragment(self) -> float:
        """``sum_g F_g(M)``, compute slices."""
        return sum(g.external_fragment for g in self.gpus)

    @property
    def external_score(self) -> float:
        """``sum_g F_g(M) / sum_g free(g)``, 0..1."""
        free = self.free_compute_slices
        return self.external_fragment / free if free else 0.0

    def creatable(self) -> dict[str, int]:
        """Profile name -> instances creatable now, summed over GPUs (what a cluster scheduler can still place)."""
        out: dict[str, int] = {}
        for g in self.gpus:
            for c in g.capacity:
                out[c.profile] = out.get(c.profile, 0) + c.creatable_now
        return out


def node_fragmentation(
    layouts: Mapping[int, Layout], demand: DemandMix, memo: Mapping[RepackKey, Mapping[str, int]] | None = None
) -> NodeFragmentation:
    """Fragmentation of every MIG GPU, by GPU index (``memo``: repacked capacities already known)."""
    memo = memo or {}
    gpus = []
    for index in sorted(layouts):
        layout = layouts[index]
        gpus.append(gpu_fragmentation(index, layout, demand, memo.get(repack_key(layout))))
    return NodeFragmentation(tuple(gpus))


def extend_memo(
    memo: Mapping[RepackKey, Mapping[str, int]], layouts: Mapping[int, Layout], limit: int = 256
) -> Mapping[RepackKey, Mapping[str, int]]:
    """``memo`` plus the repacked capacities of ``layouts`` it lacks (a new mapping; dropped whole past ``limit``).

    Layouts change rarely, so a tracker that carries this memo in its state searches arrangements only when a new
    multiset of profiles appears.
    """
    missing = {repack_key(lay): lay for lay in layouts.values() if repack_key(lay) not in memo}
    if not missing:
        return memo
    out = dict(memo) if len(memo) + len(missing) <= limit else {}
    for key, lay in missing.items():
        out[key] = repacked_capacity(lay)
    return MappingProxyType(out)
