"""What detection sees of a snapshot: a ``Layout`` per MIG GPU our catalogue models, one usage window per GPU
instance, the lost GPUs, and the identities events need. Pure (no I/O, no clock): the daemon's detection step
(:class:`flexmig.wiring.detection.Detector`) and the status document (:mod:`flexmig.status`) both read a
snapshot through :func:`observation_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from flexmig.detect import InstanceUsage, Observation
from flexmig.errors import LayoutError
from flexmig.mig import GpuModel, Layout, model_for
from flexmig.telemetry.snapshot import GpuInstanceSnapshot, GpuSnapshot, InstanceSnapshot, Snapshot

__all__ = ["LayoutCache", "NodeObservation", "observation_of", "usage_of"]

_MIN_WINDOW_S = 1e-3  # InstanceUsage needs a positive window; one reading covers "an instant"


@dataclass(frozen=True, slots=True)
class NodeObservation:
    """A snapshot as detection sees it, plus the identities events need (MIG and GPU UUIDs by position)."""

    observation: Observation
    instance_uuids: Mapping[tuple[int, int], str]
    gpu_uuids: Mapping[int, str]


_Items = tuple[tuple[int, int], ...]


class LayoutCache(dict[tuple[str, object, _Items], Layout | None]):
    """Layouts already worked out, keyed by what a layout is made of (the GPU's name and offers, the instances), and
    per GPU the inputs of its last one, so that a sweep whose GPU is made as at the last sweep gets its layout back
    without hashing its offers nor sorting its instances again (see :func:`_layout_of`)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[int, _LastLayout] = {}
        """Per GPU index: the inputs of its last layout, and the layout."""


@dataclass(frozen=True, slots=True)
class _LastLayout:
    """The inputs of one GPU's last layout: its name, its offers and GPU instances (the very objects, held here so
    that they cannot be freed and another take their place), the placements only its MIG devices added, and the
    layout."""

    model_name: str
    offers: object
    gpu_instances: tuple[GpuInstanceSnapshot, ...]
    placed: frozenset[tuple[int, int]]  # (start, profile ID) of the GPU instances
    extra: frozenset[tuple[int, int]]  # of MIG devices whose GPU instance is not among them
    layout: Layout | None


def _layout_of(gpu: GpuSnapshot, cache: LayoutCache) -> Layout | None:
    """The GPU's layout from its GPU instances (profile and start), those without a MIG device included (they hold
    their slices all the same); None when our catalogue cannot model it. The model is cut down to the profiles the
    GPU's driver offers, so detection and the planner consider no profile the driver would refuse.

    Keyed by what the layout is made of (the GPU's name and offers, the instances), so that the model and the layout
    are worked out once, not at every sweep nor at every inventory. A GPU whose offers and GPU instances are the
    very objects of its last sweep (one inventory's) and whose MIG devices add the same placements gets its last
    layout at once: the same inputs, so the same key."""
    last = cache.last.get(gpu.index)
    if last is not None and last.offers is gpu.offers and last.gpu_instances is gpu.gpu_instances:
        placed = last.placed
        extra = frozenset(p for i in gpu.instances if (p := (i.start, i.profile_id)) not in placed)
        if extra == last.extra and gpu.model_name == last.model_name:
            return last.layout
    gis = frozenset((g.start, g.profile_id) for g in gpu.gpu_instances)
    extra = frozenset(p for i in gpu.instances if (p := (i.start, i.profile_id)) not in gis)
    items = tuple(sorted(gis | extra))
    key = (gpu.model_name, gpu.offers, items)
    if key in cache:
        layout = cache[key]
    else:
        model = model_for(gpu.model_name, gpu.offers)
        layout = None if model is None else _build_layout(model, items)
        if len(cache) > 256:  # layouts change rarely; a node that churns forever must not grow this
            cache.clear()
        cache[key] = layout
    cache.last[gpu.index] = _LastLayout(gpu.model_name, gpu.offers, gpu.gpu_instances, gis, extra, layout)
    return layout


def _build_layout(model: GpuModel, items: tuple[tuple[int, int], ...]) -> Layout | None:
    try:
        return Layout.of(model, [(model.profile_by_id(pid), start) for start, pid in items])
    except (KeyError, LayoutError):
        return None  # a profile we have no table for, or a layout our catalogue thinks impossible: claim nothing


def usage_of(inst: InstanceSnapshot, at: float) -> InstanceUsage:
    """The telemetry window of one instance at detection time ``at``.

    Activity comes from the SM-activity window (mean and p95), memory from the memory window's peak (a job must
    fit its peak, not its mean), processes from this sweep. The window is what the readings really cover
    (``span_s``), and for an instance without processes no more than how long it has been idle, so a job that
    just exited is not called idle for the whole window.
    """
    sm, mem = inst.sm_active_window, inst.memory_used_window
    if sm is None:
        window = 0.0 if mem is None else mem.span_s
    else:
        window = sm.span_s if mem is None or sm.span_s >= mem.span_s else mem.span_s
    processes = None if inst.processes is None else len(inst.processes)
    if processes == 0 and inst.idle_seconds is not None:
        window = min(window, inst.idle_seconds)
    memory_used = mem.max if mem is not None else inst.memory_used_bytes
    return InstanceUsage(
        gpu=inst.gpu_index,
        start=inst.start,
        profile=inst.profile_name,
        at=at,
        window_s=max(window, _MIN_WINDOW_S),
        activity_mean=None if sm is None else _ratio(sm.mean),
        activity_p95=None if sm is None else _ratio(sm.p95),
        memory_used_bytes=None if memory_used is None else int(memory_used),
        memory_total_bytes=inst.memory_total_bytes,
        processes=processes,
        uuid=inst.mig_uuid,
    )


def _ratio(x: float) -> float:
    return min(max(x, 0.0), 1.5)  # InstanceUsage refuses values beyond what any source can legitimately report


def observation_of(snapshot: Snapshot, now: float, cache: LayoutCache | None = None) -> NodeObservation:
    """Detection's inputs from one snapshot: layouts of MIG GPUs our catalogue models, one usage window per GI
    (its first compute instance), lost GPUs; ``now`` is the detection time of the sweep."""
    cache = LayoutCache() if cache is None else cache
    layouts: dict[int, Layout] = {}
    usage: list[InstanceUsage] = []
    uuids: dict[tuple[int, int], str] = {}
    lost: set[int] = set()
    for gpu in snapshot.gpus:
        if gpu.lost:
            lost.add(gpu.index)
            continue
        if not gpu.mig_current:
            continue
        layout = _layout_of(gpu, cache)
        if layout is None:
            continue
        layouts[gpu.index] = layout
        for inst in gpu.instances:
            key = (inst.gpu_index, inst.start)
            if key in uuids:
                continue  # a GI with several compute instances: judged once, by its first
            uuids[key] = inst.mig_uuid
            usage.append(usage_of(inst, now))
    instance_uuids = MappingProxyType(uuids)
    obs = Observation(now=now, layouts=layouts, usage=tuple(usage), lost_gpus=frozenset(lost), uuids=instance_uuids)
    gpu_uuids = {g.index: g.uuid for g in snapshot.gpus}
    return NodeObservation(obs, instance_uuids, MappingProxyType(gpu_uuids))
