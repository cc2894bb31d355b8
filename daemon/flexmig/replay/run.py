"""One replay from a trace file, a node spec and a policy: what ``flexmig simulate`` and the benchmark call.

Steps: read and map the trace (:mod:`~flexmig.replay.trace`), cap run times, and with a load compress the
quiet gaps between arrivals and thin the jobs to that load (:mod:`~flexmig.replay.load`); then replay under
the policy, the queue discipline of the settings (EASY or greedy) and, with ``malleable``, elastic jobs that may run
below their nominal compute, and compute the figures. Everything is a function of the inputs and the seed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flexmig.errors import TraceError
from flexmig.mig.nodespec import NodeSpec, parse_node_spec
from flexmig.plan.types import JobRequest, PlannerSettings
from flexmig.replay.bound import lower_bound
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.engine import Sample, replay, request_for
from flexmig.replay.load import cap_runtime, compress, natural_load, thin
from flexmig.replay.managers import FluidManager, LayoutManager, MigPolicy
from flexmig.replay.metrics import Metrics, metrics_of
from flexmig.replay.repack import RepackManager
from flexmig.replay.static import StaticCandidate, candidates
from flexmig.replay.trace import ElasticRule, TraceJob, map_trace, read_trace

__all__ = [
    "MALLEABLE_POLICIES",
    "POLICIES",
    "Prepared",
    "ReplayConfig",
    "SimResult",
    "prepare",
    "run_policy",
    "simulate",
    "static_eligibility",
]

POLICIES: tuple[str, ...] = ("static", "drain", "drain-first-fit", "flex", "fluid", "repack", "bound")
MALLEABLE_POLICIES: tuple[str, ...] = ("static", "drain", "drain-first-fit", "flex")
"""The policies that run malleable jobs narrow; fluid, repack and bound are references without it."""


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Everything a replay depends on. Defaults are the documented ones (docs/replay.md); the costs are replay's own
    (:data:`~flexmig.replay.costs.REPLAY_SETTINGS`), not the daemon's."""

    trace: Path
    node: str = "h200x8"
    load: float | None = None
    seed: int = 0
    max_runtime_s: float = 86400.0
    max_gap_s: float = 1800.0
    elastic: ElasticRule = "whole"
    settings: PlannerSettings = REPLAY_SETTINGS
    malleable: bool = False


@dataclass(frozen=True, slots=True)
class Prepared:
    """A node and the jobs to replay on it, with the facts of how they were derived."""

    spec: NodeSpec
    jobs: tuple[TraceJob, ...]
    info: dict[str, Any]

    @property
    def capacity(self) -> int:
        """Compute slices of the node."""
        return self.spec.model.compute_slices * self.spec.count

    def mix(self) -> dict[str, float]:
        """Share of each nominal profile among the jobs (the demand mix of the fragmentation figure)."""
        counts = Counter(j.profile.name for j in self.jobs)
        total = sum(counts.values()) or 1
        return {name: n / total for name, n in sorted(counts.items())}


@dataclass(frozen=True, slots=True)
class SimResult:
    """A policy's figures and, for the policies that replay, the timeline of the replay they report."""

    metrics: Metrics
    samples: tuple[Sample, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON of :meth:`Metrics.to_json`."""
        return self.metrics.to_json()


def prepare(config: ReplayConfig) -> Prepared:
    """Parse the node, read and map the trace, cap, compress and thin as configured."""
    spec = parse_node_spec(config.node)
    if spec.layout is None:
        raise TraceError(f"node {config.node!r} has MIG disabled; a replay needs MIG-enabled GPUs")
    mapped = map_trace(read_trace(config.trace), spec.model, elastic=config.elastic)
    if not mapped.jobs:
        raise TraceError(f"trace {config.trace} holds no job that uses a GPU and has run times")
    jobs = cap_runtime(mapped.jobs, config.max_runtime_s)
    capacity = spec.model.compute_slices * spec.count
    info: dict[str, Any] = {
        "trace": Path(config.trace).name,
        "node": str(spec),
        "rows_mapped": len(mapped.jobs),
        "rows_skipped": mapped.skipped,
        "max_runtime_s": config.max_runtime_s,
        "elastic_rule": config.elastic,
    }
    if config.load is not None:
        jobs = compress(jobs, config.max_gap_s)
        info["max_gap_s"] = config.max_gap_s
        info["natural_load"] = round(natural_load(jobs, capacity), 4)
        jobs = thin(jobs, config.load, capacity, config.seed)
        info["load"] = config.load
        info["seed"] = config.seed
    info["jobs"] = len(jobs)
    info["elastic_jobs"] = sum(1 for j in jobs if j.elastic)
    return Prepared(spec, tuple(jobs), info)


def _static_candidates(prep: Prepared) -> list[StaticCandidate]:
    layout = prep.spec.layout
    assert layout is not None
    if len(layout):
        return [StaticCandidate(f"{prep.spec.count}x{layout.spec()}", (layout,) * prep.spec.count)]
    return candidates(prep.spec.model, prep.spec.count)


def run_policy(
    prep: Prepared,
    policy: str,
    settings: PlannerSettings,
    progress: Callable[[int], None] | None = None,
    *,
    malleable: bool = False,
) -> SimResult:
    """Replay ``prep`` under ``policy`` (static: every eligible candidate, reporting the best), with the queue
    discipline of ``settings``; ``malleable``: elastic jobs may run below their nominal compute (the MIG policies
    only)."""
    spec = prep.spec
    extra = dict(prep.info)
    extra["discipline"] = settings.discipline
    extra["malleable"] = malleable and policy in MALLEABLE_POLICIES
    if policy == "flex":
        extra["planner_settings"] = _settings_json(settings)
    if policy == "bound":
        return SimResult(lower_bound(prep.jobs, prep.capacity, extra))
    if policy == "fluid":
        manager = FluidManager(spec.model, spec.count, settings.discipline)
        run = replay(prep.jobs, manager, prep.capacity, prep.mix(), progress)
        return SimResult(metrics_of(policy, run, extra), run.samples)
    if policy == "repack":
        packed = RepackManager(spec.model, spec.count, settings.discipline)
        run = replay(prep.jobs, packed, prep.capacity, prep.mix(), progress)
        return SimResult(metrics_of(policy, run, extra), run.samples)
    assert spec.layout is not None
    start = (spec.layout,) * spec.count
    if policy in ("drain", "drain-first-fit", "flex"):
        kind: MigPolicy = "drain" if policy == "drain" else "drain-first-fit" if policy == "drain-first-fit" else "flex"
        layouts = LayoutManager(kind, spec.model, start, settings)
        run = replay(prep.jobs, layouts, prep.capacity, prep.mix(), progress, malleable=malleable)
        return SimResult(metrics_of(policy, run, extra), run.samples)
    if policy != "static":
        raise TraceError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    return _best_static(prep, settings, extra, progress, malleable=malleable)


def _best_static(
    prep: Prepared,
    settings: PlannerSettings,
    extra: dict[str, Any],
    progress: Callable[[int], None] | None,
    *,
    malleable: bool = False,
) -> SimResult:
    spec = prep.spec
    judged = static_eligibility(prep, settings)
    report: list[dict[str, Any]] = [{"layout": c.name, "eligible": ok} for c, ok in judged]
    eligible = [c for c, ok in judged if ok]
    best: tuple[float, SimResult, str] | None = None
    for cand in eligible:
        manager = LayoutManager("static", spec.model, cand.layouts, settings)
        run = replay(prep.jobs, manager, prep.capacity, prep.mix(), progress, malleable=malleable)
        m = metrics_of("static", run)
        for row in report:
            if row["layout"] == cand.name:
                row["mean_jct_s"] = round(m.mean_jct_s, 3)
        if best is None or m.mean_jct_s < best[0]:
            best = (m.mean_jct_s, SimResult(m, run.samples), cand.name)
    if best is None:
        raise TraceError("no static candidate layout can place every job of this trace")
    extra = {**extra, "static_layout": best[2], "static_candidates": report}
    return SimResult(replace(best[1].metrics, extra=extra), best[1].samples)


def static_eligibility(prep: Prepared, settings: PlannerSettings) -> list[tuple[StaticCandidate, bool]]:
    """Every static candidate, and whether it can place every job of ``prep`` (on an otherwise idle node).

    Jobs that need more compute than the whole node are unplaceable under every policy and are left out.
    """
    requests: dict[tuple[str, int], JobRequest] = {}
    for j in prep.jobs:
        if j.compute_slices <= prep.capacity:
            requests.setdefault((j.profile.name, j.ranks), request_for(j))
    out = []
    for cand in _static_candidates(prep):
        manager = LayoutManager("static", prep.spec.model, cand.layouts, settings)
        out.append((cand, all(manager.placeable(r) for r in requests.values())))
    return out


def simulate(config: ReplayConfig, policy: str, progress: Callable[[int], None] | None = None) -> SimResult:
    """Prepare ``config`` and replay it under ``policy``."""
    return run_policy(prepare(config), policy, config.settings, progress, malleable=config.malleable)


def _settings_json(settings: PlannerSettings) -> dict[str, Any]:
    return {
        "checkpoint_s": settings.checkpoint_s,
        "restart_s": settings.restart_s,
        "reconfigure_s": settings.reconfigure_s,
        "spread_efficiency": settings.spread_efficiency,
        "settling_s": settings.settling_s,
        "gain_margin": settings.gain_margin,
        "resplit": settings.resplit,
        "migrate": settings.migrate,
        "malleable": settings.malleable,
        "discipline": settings.discipline,
    }
