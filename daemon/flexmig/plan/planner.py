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

The pipeline is written once: the placer (where a job goes) and the "make room" stage (which running jobs may be
moved for a blocked one) are parameters of :class:`Planner`. ``flexmigd`` plans with the flex placer and
:class:`~flexmig.plan.moves.Mover`; the replay's baselines (static, drain) plan through the same pipeline with their
own placers and no stage that makes room, so the published comparisons cannot drift from the daemon's planner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Protocol

from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel
from flexmig.plan.geometry import Geometry, demand_weights
from flexmig.plan.grow import Grower, MoveBook
from flexmig.plan.moves import Mover
from flexmig.plan.placer import BasePlacer, FlexPlacer, PlacerInputs
from flexmig.plan.queue import Reservation, admit
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape, speed_of
from flexmig.plan.types import JobRequest, NodeState, Plan, PlannerSettings, RankNeed
from flexmig.plan.validate import check_state

__all__ = ["MakeRoom", "MakeRoomFactory", "PlacerFactory", "Planner", "nominal_duration"]


class PlacerFactory(Protocol):
    """Builds the pass's placer on its scratch (a :class:`~flexmig.plan.placer.BasePlacer` subclass is one)."""

    def __call__(self, inputs: PlacerInputs) -> BasePlacer:
        """The placer for one planning pass."""
        ...


class MakeRoom(Protocol):
    """The "make room" stage: moves running jobs out of the way of a job that cannot start (flex's
    :class:`~flexmig.plan.moves.Mover`)."""

    notes: list[str]

    def unblock(self, head: JobRequest, reservation: Reservation | None) -> bool:
        """Start the blocked ``head`` by moving jobs in its way, if that pays; True when it started."""
        ...

    def yield_to(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """Start the later blocked ``job`` by shrinking larger malleable jobs, keeping the head's reservation."""
        ...


MakeRoomFactory = Callable[[Scratch, BasePlacer, MoveBook], MakeRoom]
"""Builds the "make room" stage of one pass from the pass's scratch, placer and move book."""


def _mover(scratch: Scratch, placer: BasePlacer, book: MoveBook) -> MakeRoom:
    return Mover(
        scratch,
        placer.model,
        placer.settings,
        weights=placer.weights,
        book=book,
        now_s=placer.now_s,
        placer=placer,
    )


def nominal_duration(settings: PlannerSettings) -> Callable[[JobRequest], float | None]:
    """A job's run time as the discipline sorts backfill candidates by it: at its nominal shape, or (a bound) as a
    spread when it may be spread."""

    def duration(job: JobRequest) -> float | None:
        if job.expected_runtime_s is None:
            return None
        spreads = settings.resplit and job.elastic
        return job.expected_runtime_s / (settings.spread_efficiency if spreads else 1.0)

    return duration


class Planner:
    """Plans for nodes of one GPU model. Holds only a geometry cache, so one planner serves many plans.

    ``placer`` says where jobs go (default: the flex rules) and ``make_room`` builds the stage that moves running
    jobs for a blocked one (default: :class:`~flexmig.plan.moves.Mover`; None: no job is ever moved to make room,
    as the baselines plan).
    """

    def __init__(
        self,
        model: GpuModel,
        settings: PlannerSettings | None = None,
        *,
        placer: PlacerFactory = FlexPlacer,
        make_room: MakeRoomFactory | None = _mover,
    ) -> None:
        self.model = model
        self.settings = settings or PlannerSettings()
        self.geometry = Geometry(model)
        self.placer = placer
        self.make_room = make_room

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
        queue = tuple(sorted(state.pending, key=lambda r: r.submitted_s))  # stable: equal times keep input order
        ends = {run.name: now + run.remaining_s for run in state.running if run.remaining_s is not None}
        placer = self.placer(
            PlacerInputs(
                scratch=scratch,
                model=self.model,
                settings=settings,
                weights=self._weights(state),
                now_s=now,
                ends=ends,
                queue=queue,
            )
        )
        book = MoveBook(settings, {j.name: j for j in state.running}, now)
        mover = None if self.make_room is None else self.make_room(scratch, placer, book)
        notes: list[str] = []
        grower = Grower(placer, book, notes)
        admission = admit(
            queue,
            placer,
            now,
            nominal_duration(settings),
            None if mover is None else mover.unblock,
            discipline=settings.discipline,
            yield_to=None if mover is None else mover.yield_to,
        )
        grower.grow(grower.slow(), admission.reservation)
        notes = [*(mover.notes if mover is not None else ()), *notes]
        r = admission.reservation
        if r is not None and r.start_s != float("inf"):
            gpus = sorted(g for g in r.token if isinstance(g, int)) if isinstance(r.token, frozenset) else []
            notes.append(f"{r.job} waits; reserved from t={r.start_s:.0f}s on GPU(s) {gpus}")
        return Plan(tuple(scratch.actions), now, tuple(notes))

    def _weights(self, state: NodeState) -> tuple[float, ...]:
        """The demand mix: the nominal profiles of the running and waiting jobs, one count per job."""
        needs: Counter[tuple[RankNeed, int]] = Counter()
        shapes: dict[tuple[RankNeed, int], JobRequest] = {}
        for req in (*(r.nominal for r in state.running), *state.pending):
            k = (req.need, req.ranks)
            needs[k] += 1
            shapes.setdefault(k, req)
        counts: Counter[str] = Counter()
        for k, n in needs.items():
            counts[self.geometry.nominal(shapes[k]).profile.name] += n
        return demand_weights(self.geometry, counts)

    def speed(self, request: JobRequest, shape: Shape) -> float:
        """Speed of ``request`` run as ``shape``, relative to nominal (for callers that track progress)."""
        return speed_of(self.model, request, shape, self.settings)
