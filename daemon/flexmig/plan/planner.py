"""The planner: (node state, settings) -> Plan. Pure and deterministic; the time is ``state.now_s``.

One pass, in this order:

1. **Admit** the queue with the shared discipline (FIFO with EASY backfilling, :mod:`flexmig.plan.queue`) and
   the flex placer (:mod:`flexmig.plan.placer`): nominal shape first, anywhere on the node, creating instances
   around running jobs on busy GPUs; elastic jobs that do not fit are spread over several instances.
2. When the head still cannot start, **make room** (:meth:`flexmig.plan.moves.Mover.unblock`): migrate (or
   re-split) the few movable, settled jobs that stand in one placement of it, if the wait it is spared outweighs
   their downtime by the gain margin.
3. **Consolidate**: a spread job whose nominal shape fits again is re-split back when the run time it saves
   outweighs the downtime (never onto the GPUs reserved for the waiting head).

Placement choices keep the most demand-weighted capacity (FGD's fragmentation measure, adapted to MIG: see
:meth:`flexmig.plan.geometry.Geometry.value`); the demand is the profile mix of the running and waiting jobs.
"""

from __future__ import annotations

from collections import Counter

from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel
from flexmig.plan.geometry import Geometry, demand_weights
from flexmig.plan.moves import Mover
from flexmig.plan.placer import FlexPlacer
from flexmig.plan.queue import admit
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape, speed_of
from flexmig.plan.types import JobRequest, NodeState, Plan, PlannerSettings, RankNeed
from flexmig.plan.validate import check_state

__all__ = ["Planner"]


class Planner:
    """Plans for nodes of one GPU model. Holds only a geometry cache, so one planner serves many plans."""

    def __init__(self, model: GpuModel, settings: PlannerSettings | None = None) -> None:
        self.model = model
        self.settings = settings or PlannerSettings()
        self.geometry = Geometry(model)

    def plan(self, state: NodeState, *, check: bool = True) -> Plan:
        """The plan for ``state``: starts, moves and reconfigurations, in an order the hardware accepts.

        ``check`` False skips the input sanity check (the replay engine builds states it knows are sound).
        PlanRejectedError when the state is not a real node or a request asks for a profile the model lacks.
        """
        if state.model != self.model:
            raise PlanRejectedError(f"planner for {self.model.key} got a {state.model.key} node")
        if check:
            check_state(state)
        settings = self.settings
        now = state.now_s
        scratch = Scratch(
            self.geometry,
            state.layouts,
            {j.name: j.instances for j in state.running},
            settings,
            blocked=state.blocked,
            blocked_gpus=state.blocked_gpus,
        )
        needs: Counter[tuple[RankNeed, int]] = Counter()
        shapes: dict[tuple[RankNeed, int], JobRequest] = {}
        for req in (*(r.nominal for r in state.running), *state.pending):
            k = (req.need, req.ranks)
            needs[k] += 1
            shapes.setdefault(k, req)
        counts: Counter[str] = Counter()
        for k, n in needs.items():
            counts[self.geometry.nominal(shapes[k]).profile.name] += n
        weights = demand_weights(self.geometry, counts)

        ends: dict[str, float] = {}
        for run in state.running:
            if run.remaining_s is not None:
                ends[run.name] = now + run.remaining_s
        placer = FlexPlacer(scratch, self.model, settings, weights=weights, now_s=now, ends=ends)
        running = {j.name: j for j in state.running}
        mover = Mover(scratch, self.model, settings, weights=weights, running=running, now_s=now)
        queue = sorted(state.pending, key=lambda r: r.submitted_s)  # stable: equal times keep input order

        def duration(job: JobRequest) -> float | None:
            if job.expected_runtime_s is None:
                return None
            spreads = settings.resplit and job.elastic
            return job.expected_runtime_s / (settings.spread_efficiency if spreads else 1.0)

        admission = admit(queue, placer, now, duration, mover.unblock)
        reserved: frozenset[int] = frozenset()
        if admission.reservation is not None and isinstance(admission.reservation.token, frozenset):
            reserved = frozenset(g for g in admission.reservation.token if isinstance(g, int))
        mover.consolidate(reserved)
        notes = list(mover.notes)
        if admission.reservation is not None and admission.reservation.start_s != float("inf"):
            r = admission.reservation
            notes.append(f"{r.job} waits; reserved from t={r.start_s:.0f}s on GPU(s) {sorted(reserved)}")
        return Plan(tuple(scratch.actions), now, tuple(notes))

    def speed(self, request: JobRequest, shape: Shape) -> float:
        """Speed of ``request`` run as ``shape``, relative to nominal (for callers that track progress)."""
        return speed_of(self.model, request, shape, self.settings)
