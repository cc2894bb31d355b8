"""The planner: (node state, settings) -> Plan. Pure and deterministic; the time is ``state.now_s``.

One pass, in this order:

1. **Admit** the queue with the shared discipline (EASY backfilling by default, or greedy;
   :mod:`flexmig.plan.queue`) and the flex placer (:mod:`flexmig.plan.placer`): nominal shape first, anywhere on
   the node, creating instances around running jobs on busy GPUs; elastic jobs that do not fit are spread over
   several instances. Malleable jobs that still do not fit then start narrow on what is left, when that ends them
   sooner than waiting; a malleable head may be reserved narrow instead of at its nominal shape.
2. While admitting: when the head cannot start, **make room** (:meth:`flexmig.plan.moves.Mover.unblock`): migrate,
   re-split or shrink the few movable, settled jobs that stand in one placement of it, if the wait it is spared
   outweighs their cost by the gain margin; a few later one-rank jobs may have larger malleable jobs shrink for
   them (:meth:`~flexmig.plan.moves.Mover.yield_to`), keeping the head's reservation.
3. **Grow** the jobs that run below their nominal speed (narrow malleable jobs, spreads) with what admission left,
   where a faster shape fits and pays and the head (EASY) still fits at its reserved start
   (:mod:`flexmig.plan.grow`).

Placement choices keep the most demand-weighted capacity (FGD's fragmentation measure, adapted to MIG: see
:meth:`flexmig.plan.geometry.Geometry.value`); the demand is the profile mix of the running and waiting jobs.
"""

from __future__ import annotations

from collections import Counter

from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel
from flexmig.plan.geometry import Geometry, demand_weights
from flexmig.plan.grow import Grower, MoveBook
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
        book = MoveBook(settings, {j.name: j for j in state.running}, now)
        mover = Mover(scratch, self.model, settings, weights=weights, book=book, now_s=now, placer=placer)
        notes: list[str] = []
        grower = Grower(placer, book, notes)
        queue = tuple(sorted(state.pending, key=lambda r: r.submitted_s))  # stable: equal times keep input order

        def duration(job: JobRequest) -> float | None:
            if job.expected_runtime_s is None:
                return None
            spreads = settings.resplit and job.elastic
            return job.expected_runtime_s / (settings.spread_efficiency if spreads else 1.0)

        admission = admit(
            queue, placer, now, duration, mover.unblock, discipline=settings.discipline, yield_to=mover.yield_to
        )
        grower.grow(grower.slow(), admission.reservation)
        notes = [*mover.notes, *notes]
        r = admission.reservation
        if r is not None and r.start_s != float("inf"):
            gpus = sorted(g for g in r.token if isinstance(g, int)) if isinstance(r.token, frozenset) else []
            notes.append(f"{r.job} waits; reserved from t={r.start_s:.0f}s on GPU(s) {gpus}")
        return Plan(tuple(scratch.actions), now, tuple(notes))

    def speed(self, request: JobRequest, shape: Shape) -> float:
        """Speed of ``request`` run as ``shape``, relative to nominal (for callers that track progress)."""
        return speed_of(self.model, request, shape, self.settings)
