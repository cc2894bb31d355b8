"""What the planner sees of a running node, and what a plan looks like to people and programs.

:func:`planning_state` turns the actuator's view of the node (a fresh NVML inventory as a
:class:`~flexmig.act.nodeview.NodeView`) and its job records into the pure planner's
:class:`~flexmig.plan.types.NodeState`. The planner must not touch what flexmig cannot account for, so:

* an instance that runs a process of no registered job, whose processes NVML will not list, or that has no MIG
  device (a GPU instance without compute instance) is *blocked*: neither destroyed nor used;
* a GPU that is lost, has MIG off, is of another model than the node's first, or whose layout our catalogue
  cannot model is a *blocked GPU*;
* a running job whose instances are not all there as recorded is left out of the plan and its instances blocked.

:func:`planner_settings` builds :class:`~flexmig.plan.types.PlannerSettings` from the ``[planner]`` table, as the
schema says (no key is mapped by hand). :func:`parse_request` reads the ``[Nx]PROFILE`` what-if requests of
``flexmig plan``. Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.act.planview import pending_requests, running_jobs
from flexmig.act.records import JobRecord
from flexmig.config import PlannerConfig
from flexmig.config.settings import build_settings
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout
from flexmig.mqtt.action_events import plan_actions, plan_summary
from flexmig.plan.types import JobRequest, NodeState, Plan, PlannerSettings, RankNeed

__all__ = [
    "PlanningInput",
    "parse_request",
    "plan_document",
    "planner_settings",
    "planning_state",
]

_REQUEST = re.compile(r"(?:(?P<n>[1-9][0-9]?)x)?(?P<profile>[1-7]g\.[0-9]+gb(?:\+me)?)")


def planner_settings(cfg: PlannerConfig) -> PlannerSettings:
    """The ``[planner]`` table as the planner's settings, built from the schema
    (:func:`~flexmig.config.settings.build_settings`: each key sets the field of its name or the one its ``to``
    names, ``migrate_enabled`` ``migrate`` and so on)."""
    return build_settings(PlannerSettings, cfg)


def parse_request(text: str, index: int, model: GpuModel, now_s: float) -> JobRequest:
    """A what-if request ``[Nx]PROFILE`` (``3g.71gb``, ``2x1g.18gb``) named ``what-if-INDEX``.

    ValueError (naming the text) for bad syntax or a profile the node's model lacks.
    """
    m = _REQUEST.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"request {text!r}: expected [Nx]PROFILE, e.g. 3g.71gb or 2x1g.18gb")
    profile = m.group("profile")
    try:
        prof = model.profile(profile)
    except KeyError:
        names = ", ".join(p.name for p in model.profiles)
        raise ValueError(f"request {text!r}: {model.name} has no profile {profile} (it has {names})") from None
    ranks = int(m.group("n") or 1)
    return JobRequest(
        name=f"what-if-{index}",
        need=RankNeed(profile=profile),
        ranks=ranks,
        min_ranks=ranks,
        max_ranks=ranks,
        rank_memory_mib=prof.memory_mib,
        submitted_s=now_s,
    )


@dataclass(frozen=True, slots=True)
class PlanningInput:
    """A node state for the planner, and what was left out of it and why (for people)."""

    state: NodeState
    blocked_why: Mapping[str, str]  # "gpu0:1g.18gb@3" or "gpu2" -> reason
    left_out: Mapping[str, str]  # job name -> why it is not planned for


def _held_pids(alive: Mapping[str, Iterable[int]]) -> set[int]:
    return {p for pids in alive.values() for p in pids}


def planning_state(
    view: NodeView,
    jobs: Sequence[JobRecord],
    *,
    alive_pids: Mapping[str, Iterable[int]],
    now_s: float,
    mig_enabled: Mapping[int, bool | None],
    last_moved_s: Mapping[str, float] | None = None,
    extra: Sequence[JobRequest] = (),
    started_s: Mapping[str, float] | None = None,
) -> PlanningInput:
    """The planner's view of the node; PlanRejectedError when no GPU of a known model can be planned for
    (from :func:`~flexmig.act.placement.node_model`).

    ``alive_pids``: each job's running rank pids (processes of these are accounted for); ``mig_enabled``: GPU
    index -> MIG mode now (None: no MIG); ``extra``: hypothetical requests queued after the real ones; ``started_s``:
    when each job first started, for the time left of jobs that state their run time.
    """
    model = node_model(view)
    why: dict[str, str] = {}
    layouts, blocked_gpus = _gpu_layouts(view, model, mig_enabled, why)
    blocked = _foreign_instances(view, blocked_gpus, _held_pids(alive_pids), why)
    usable, left_out = _plannable_jobs(jobs, layouts, blocked_gpus, blocked, why)
    running = running_jobs(usable, model, last_moved_s, started_s, now_s)
    held = {i.key for r in running for i in r.instances}
    blocked -= held  # a job's own ranks on its instances are accounted for
    pending = (*pending_requests(jobs, model), *extra)
    state = NodeState(
        model=model,
        layouts=tuple(layouts),
        running=running,
        pending=pending,
        now_s=now_s,
        blocked=frozenset(blocked),
        blocked_gpus=frozenset(blocked_gpus),
    )
    return PlanningInput(state, why, left_out)


def _gpu_layouts(
    view: NodeView, model: GpuModel, mig_enabled: Mapping[int, bool | None], why: dict[str, str]
) -> tuple[list[Layout], set[int]]:
    """Every GPU's layout by index, and the GPUs the planner must leave alone (an empty layout stands for each;
    ``why`` says why)."""
    blocked_gpus: set[int] = set()
    layouts: list[Layout] = []
    for gpu in range(max(view.gpus(), default=-1) + 1):
        layout = view.layout(gpu)
        reason = None
        if gpu not in view.gpus():
            reason = "not reported by NVML"
        elif gpu in view.lost:
            reason = "lost (GPU_IS_LOST)"
        elif view.model(gpu) != model:
            got = view.model(gpu)
            reason = f"{got.name if got else 'unknown model'}, not the node's {model.name}"
        elif not mig_enabled.get(gpu):
            reason = "MIG is not enabled"
        elif layout is None:
            reason = "its layout is not one our catalogue can model"
        if reason is not None or layout is None:
            blocked_gpus.add(gpu)
            why[f"gpu{gpu}"] = reason or "unknown layout"
            layouts.append(Layout.of(model, []))
            continue
        layouts.append(layout)
    return layouts, blocked_gpus


def _foreign_instances(
    view: NodeView, blocked_gpus: set[int], ours: set[int], why: dict[str, str]
) -> set[tuple[int, int]]:
    """The instances of usable GPUs the planner must leave alone: no MIG device, unknown processes, or processes of
    no registered job (``ours``: the pids of the journalled jobs' ranks)."""
    blocked: set[tuple[int, int]] = set()
    for inst in view.instances:
        if inst.gpu in blocked_gpus:
            continue
        reason = None
        if inst.uuid is None:
            reason = "GPU instance without compute instance (no MIG device)"
        elif inst.pids is None:
            reason = "NVML does not list its processes"
        elif inst.pids - ours:
            foreign = ", ".join(str(p) for p in sorted(inst.pids - ours))
            reason = f"runs processes of no registered job ({foreign})"
        if reason is not None:
            blocked.add(inst.key)
            why[inst.spec()] = reason
    return blocked


def _plannable_jobs(
    jobs: Sequence[JobRecord],
    layouts: Sequence[Layout],
    blocked_gpus: set[int],
    blocked: set[tuple[int, int]],
    why: dict[str, str],
) -> tuple[list[JobRecord], dict[str, str]]:
    """The running jobs whose instances are as the journal recorded them, and why each other one is left out (its
    instances are then blocked too)."""
    left_out: dict[str, str] = {}
    usable: list[JobRecord] = []
    for rec in jobs:
        if rec.state != "running":
            continue
        bad = [
            s
            for s in rec.slots
            if s.gpu in blocked_gpus
            or not 0 <= s.gpu < len(layouts)
            or (placed := layouts[s.gpu].at(s.start)) is None
            or placed.profile.name != s.profile
        ]
        if bad or not rec.slots:
            left_out[rec.name] = (
                f"its instances {', '.join(s.spec() for s in bad)} are not as recorded" if bad else "holds no instance"
            )
            for s in rec.slots:
                if s.gpu not in blocked_gpus:
                    blocked.add(s.key)
                    why[s.spec()] = f"recorded for job {rec.name}, which is not planned for"
            continue
        usable.append(rec)
    return usable, left_out


def plan_document(
    plan: Plan, given: PlanningInput, *, mode: str, source: str, error: str | None = None
) -> dict[str, Any]:
    """``flexmig plan --json``: the plan's actions with reasons and costs, and the state it was planned for."""
    state = given.state
    return {
        "source": source,
        "mode": mode,
        "executes": mode == "act",
        "now_s": state.now_s,
        "model": state.model.name,
        "actions": plan_actions(plan),
        "notes": list(plan.notes),
        "cost_s": round(plan.cost_s, 6),
        "summary": plan_summary(plan) if plan else "nothing worth doing",
        "running": [
            {"job": j.name, "instances": [i.spec() for i in j.instances], "last_moved_s": j.last_moved_s}
            for j in state.running
        ],
        "pending": [
            {"job": r.name, "ranks": r.ranks, "need": r.need.profile or f"{r.need.memory_mib} MiB"}
            for r in state.pending
        ],
        "blocked": dict(sorted(given.blocked_why.items())),
        "left_out": dict(sorted(given.left_out.items())),
        "error": error,
    }
