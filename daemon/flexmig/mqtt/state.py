"""The retained ``state`` document: the node's GPUs, layouts, capacity and fragmentation, for the fleet.

Published retained on ``<prefix>/<node>/state``, so a dashboard or scheduler that connects later still gets the
latest picture; ``schemas/state.v1.schema.json`` is its JSON Schema. A cluster scheduler reads ``creatable`` to
learn how many instances of each profile this node can still host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flexmig.detect import Finding, FragmentationFinding, GpuFragmentation, OversizedFinding, Report, UnderuseFinding
from flexmig.mig import Layout
from flexmig.mqtt.events import SCHEMA_VERSION, format_time

__all__ = ["finding_to_dict", "state_document"]


def finding_to_dict(f: Finding) -> dict[str, Any]:
    """An active finding as JSON."""
    if isinstance(f, FragmentationFinding):
        return {
            "kind": "fragmentation",
            "gpu": f.gpu,
            "since": format_time(f.since),
            "score": round(f.score, 6),
            "reason": f.reason,
        }
    kind = "oversized" if isinstance(f, OversizedFinding) else f.level
    out: dict[str, Any] = {
        "kind": kind,
        "gpu": f.gpu,
        "start": f.start,
        "profile": f.profile,
        "since": format_time(f.since),
        "reason": f.reason,
    }
    if isinstance(f, OversizedFinding):
        out["suggested_profile"] = f.suggested
    elif isinstance(f, UnderuseFinding):
        out["activity"] = f.activity
        out["memory_ratio"] = f.memory_ratio
    return out


def state_document(
    node: str,
    report: Report,
    layouts: Mapping[int, Layout],
    *,
    gpu_uuids: Mapping[int, str] | None = None,
    instance_uuids: Mapping[tuple[int, int], str] | None = None,
    lost: Iterable[int] = (),
    mode: str | None = None,
) -> dict[str, Any]:
    """The state document after one detection sweep (``layouts``: the layouts ``report`` was computed from)."""
    uuids = gpu_uuids or {}
    inst_uuids = instance_uuids or {}
    lost_set = set(lost)
    gpus: list[dict[str, Any]] = []
    by_gpu = {g.gpu: g for g in report.fragmentation.gpus}
    for index in sorted(set(by_gpu) | lost_set):
        g = by_gpu.get(index)
        entry: dict[str, Any] = {"index": index, "uuid": uuids.get(index), "lost": index in lost_set}
        layout = layouts.get(index)
        if g is not None and layout is not None and index not in lost_set:
            entry.update(_gpu_state(index, g, layout, inst_uuids))
        gpus.append(entry)
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "node": node,
        "time": format_time(report.now),
        "gpus": gpus,
        "fragmentation": _node_fragmentation(report),
        "findings": [finding_to_dict(f) for f in report.active],
    }
    if mode is not None:
        doc["mode"] = mode
    return doc


def _gpu_state(
    index: int, g: GpuFragmentation, layout: Layout, inst_uuids: Mapping[tuple[int, int], str]
) -> dict[str, Any]:
    """One present GPU's entry: its layout, instances and fragmentation."""
    return {
        "model": g.model,
        "layout": g.layout,
        "slice_map": layout.slice_map(),
        "instances": [
            {
                "start": i.start,
                "profile": i.profile.name,
                "uuid": inst_uuids.get((index, i.start)),
                "compute_slices": i.profile.compute_slices,
                "memory_slices": i.profile.memory_slices,
            }
            for i in layout
        ],
        "free_compute_slices": g.free_compute_slices,
        "free_memory_slices": g.free_memory_slices,
        "creatable": g.creatable(),
        "stranded": g.stranded(),
        "external_fragmentation": round(g.external_score, 6),
        "stranded_score": round(g.stranded_score, 6),
        "recoverable_compute_slices": g.recoverable_compute_slices,
    }


def _node_fragmentation(report: Report) -> dict[str, Any]:
    """The node's fragmentation figures, internal idle slices included (None when no instance reports them)."""
    frag = report.fragmentation
    idle_compute = [i.compute_idle for i in report.internal if i.compute_idle is not None]
    idle_memory = [i.memory_idle for i in report.internal if i.memory_idle is not None]
    return {
        "free_compute_slices": frag.free_compute_slices,
        "free_memory_slices": frag.free_memory_slices,
        "external_score": round(frag.external_score, 6),
        "stranded_score": round(frag.stranded_score, 6),
        "stranded_compute_slices": frag.stranded_compute_slices,
        "recoverable_compute_slices": frag.recoverable_compute_slices,
        "creatable": frag.creatable(),
        "internal_idle_compute_slices": sum(idle_compute) if idle_compute else None,
        "internal_idle_memory_slices": sum(idle_memory) if idle_memory else None,
    }
