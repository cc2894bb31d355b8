"""``flexmig status``: the node as one JSON document, from one snapshot and its detection report.

The daemon answers the control socket's ``status`` request with :func:`status_document` of its latest snapshot
(no NVML call: the sweep already read everything), its job records and recent actions; ``flexmig status --sim``
builds the same document from one in-process sweep. The CLI renders it for people. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flexmig.detect import FragmentationFinding, OversizedFinding, Report, UnderuseFinding
from flexmig.mqtt.events import format_time
from flexmig.mqtt.state import finding_to_dict
from flexmig.telemetry.observation import observation_of
from flexmig.telemetry.snapshot import GpuSnapshot, InstanceSnapshot, Snapshot

__all__ = ["STATUS_VERSION", "status_document"]

STATUS_VERSION = 1


def _instance_findings(report: Report | None) -> dict[tuple[int, int], list[str]]:
    out: dict[tuple[int, int], list[str]] = {}
    if report is None:
        return out
    for f in report.active:
        if isinstance(f, OversizedFinding):
            out.setdefault((f.gpu, f.start), []).append("oversized")
        elif isinstance(f, UnderuseFinding):
            out.setdefault((f.gpu, f.start), []).append(f.level)
    return out


def _instance(
    inst: InstanceSnapshot, holder: str | None, findings: Sequence[str], internal: Mapping[str, int | None] | None
) -> dict[str, Any]:
    act = inst.activity
    procs = None
    if inst.processes is not None:
        procs = [
            {
                "pid": p.pid,
                "gpu_memory_bytes": p.gpu_memory_bytes,
                "user": p.host.user if p.host else None,
                "command": " ".join(p.host.cmdline) if p.host and p.host.cmdline else None,
            }
            for p in inst.processes
        ]
    return {
        "gpu_instance_id": inst.gpu_instance_id,
        "compute_instance_id": inst.compute_instance_id,
        "mig_index": inst.mig_index,
        "profile": inst.profile_name,
        "start": inst.start,
        "memory_slices": inst.memory_slices,
        "compute_slices": inst.compute_slices,
        "uuid": inst.mig_uuid,
        "memory_used_bytes": inst.memory_used_bytes,
        "memory_total_bytes": inst.memory_total_bytes,
        "sm_active": None if act is None else act.sm_active,
        "sm_active_mean": None if inst.sm_active_window is None else inst.sm_active_window.mean,
        "activity_source": None if act is None else act.source,
        "idle_s": inst.idle_seconds,
        "processes": procs,
        "job": holder,
        "findings": list(findings),
        "internal_idle_compute_slices": None if internal is None else internal.get("compute"),
    }


def _gpu(
    snap: Snapshot,
    gpu: GpuSnapshot,
    report: Report | None,
    holders: Mapping[tuple[int, int], str],
    slice_map: str | None,
) -> dict[str, Any]:
    frag = None
    if report is not None:
        frag = next((g for g in report.fragmentation.gpus if g.gpu == gpu.index), None)
    found = _instance_findings(report)
    internal: dict[tuple[int, int], dict[str, int | None]] = {}
    if report is not None:
        for i in report.internal:
            internal[(i.gpu, i.start)] = {"compute": i.compute_idle}
    gpu_findings = []
    if report is not None:
        gpu_findings = [
            "fragmentation" for f in report.active if isinstance(f, FragmentationFinding) and f.gpu == gpu.index
        ]
    seen: set[tuple[int, int]] = set()
    instances = []
    for inst in gpu.instances:
        key = (inst.gpu_index, inst.start)
        first = key not in seen
        seen.add(key)
        instances.append(
            _instance(inst, holders.get(key), found.get(key, []) if first else [], internal.get(key) if first else None)
        )
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model_name,
        "lost": gpu.lost,
        "mig": gpu.mig_current,
        "memory_total_bytes": gpu.memory_total_bytes,
        "power_w": gpu.power_w,
        "temperature_c": gpu.temperature_c,
        "layout": None if frag is None else frag.layout,
        "slice_map": slice_map,
        "free_compute_slices": gpu.free_compute_slices,
        "free_memory_slices": gpu.free_memory_slices,
        "creatable": dict(gpu.creatable),
        "external_fragmentation": None if frag is None else round(frag.external_score, 6),
        "stranded_compute_slices": None if frag is None else frag.stranded_compute_slices,
        "unfit_profiles": [] if frag is None else list(frag.unfit),
        "findings": gpu_findings,
        "instances": instances,
    }


def status_document(
    snapshot: Snapshot,
    report: Report | None,
    *,
    source: str,
    mode: str | None,
    jobs: Sequence[Mapping[str, Any]] = (),
    actions_in_progress: int = 0,
    recent_actions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The status of the node in ``snapshot``: GPUs, instances (with their processes, jobs and findings),
    fragmentation and active findings from ``report`` (None: detection has not run), jobs and recent actions.

    ``jobs`` are job summaries (``JobRecord.summary()``) whose ``instances`` say which job holds which instance.
    """
    holders: dict[tuple[int, int], str] = {}
    for job in jobs:
        if job.get("state") == "running":
            for i in job.get("instances", ()):
                holders[(int(i["gpu"]), int(i["start"]))] = str(job["name"])
    layouts = observation_of(snapshot, snapshot.taken_at).observation.layouts
    gpus = [
        _gpu(snapshot, g, report, holders, layouts[g.index].slice_map() if g.index in layouts else None)
        for g in snapshot.gpus
    ]
    frag: dict[str, Any] | None = None
    findings: list[dict[str, Any]] = []
    if report is not None:
        f = report.fragmentation
        frag = {
            "free_compute_slices": f.free_compute_slices,
            "free_memory_slices": f.free_memory_slices,
            "external_score": round(f.external_score, 6),
            "stranded_score": round(f.stranded_score, 6),
            "stranded_compute_slices": f.stranded_compute_slices,
            "creatable": f.creatable(),
        }
        findings = [finding_to_dict(x) for x in report.active]
    return {
        "status_version": STATUS_VERSION,
        "source": source,
        "node": snapshot.hostname,
        "mode": mode,
        "time": format_time(snapshot.taken_at),
        "driver_version": snapshot.driver_version,
        "nvml_version": snapshot.nvml_version,
        "sweeps": snapshot.stats.sweeps,
        "gpus": gpus,
        "fragmentation": frag,
        "findings": findings,
        "jobs": [dict(j) for j in jobs],
        "actions_in_progress": actions_in_progress,
        "recent_actions": [dict(a) for a in recent_actions],
    }
