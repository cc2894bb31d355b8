"""What the planner would do now, in the running daemon: the inputs read from NVML and the journal, the plan worked
out off the event loop, and the document ``flexmig plan`` shows. Changes nothing; the actuator component
(:class:`flexmig.wiring.actuator.ActuatorComponent`) executes a plan in mode ``act``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from flexmig.act.control import RequestError
from flexmig.act.journal import Journal
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.act.records import JobRecord
from flexmig.act.service import Actuator
from flexmig.clocks import Ages
from flexmig.config import Mode, PlannerConfig
from flexmig.errors import PlanRejectedError
from flexmig.plan import Planner, validate_plan
from flexmig.plan.types import Plan
from flexmig.service.planning import parse_request, plan_document, planner_settings, planning_state
from flexmig.service.planning_loop import PlanRound

__all__ = ["PlanRound", "first_started", "last_moved", "plan_now"]


async def plan_now(
    act: Actuator,
    planner: PlannerConfig,
    *,
    mode: Mode,
    ages: Ages,
    wall: Callable[[], float],
    source: str,
    requests: tuple[str, ...] = (),
) -> PlanRound:
    """What the planner would do now on ``act``'s node (a fresh inventory through the NVML worker), with
    ``requests`` (``[Nx]PROFILE``) queued too; changes nothing.

    The inputs are read on the event loop; the planner (pure, and the longer the queue the longer it takes) runs
    on a worker thread, so the loop serves the control socket, the sampling and the jobs meanwhile.
    """
    ex = act.executor
    with contextlib.suppress(Exception):
        await ex.offload(ex.devices.prune)
    inventory = await ex.mig.inventory()
    view = NodeView.of(inventory)
    ages.check()  # one line when the wall clock was set: durations go on, measured on the monotonic clock
    now = wall()
    jobs = act.journal.jobs()
    alive = {rec.name: act.supervisor.pids(rec.name) for rec in jobs if rec.state == "running"}
    mig_enabled = {g.index: g.mig_current for g in inventory.gpus}
    moved = last_moved(act.journal, ages, now)
    started = first_started(act.journal, ages, jobs, now)
    settings = planner_settings(planner)

    def work_out() -> PlanRound:
        try:
            model = node_model(view)
            extra = tuple(parse_request(r, i + 1, model, now) for i, r in enumerate(requests))
            given = planning_state(
                view,
                jobs,
                alive_pids=alive,
                now_s=now,
                mig_enabled=mig_enabled,
                last_moved_s=moved,
                extra=extra,
                started_s=started,
            )
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        try:
            plan = Planner(given.state.model, settings).plan(given.state)
            validate_plan(given.state, plan, settings)
        except PlanRejectedError as exc:
            empty = Plan(now_s=now)
            doc = plan_document(empty, given, mode=mode, source=source, error=str(exc))
            return PlanRound(empty, doc, str(exc))
        return PlanRound(plan, plan_document(plan, given, mode=mode, source=source))

    return await asyncio.to_thread(work_out)


def first_started(journal: Journal, ages: Ages, jobs: Sequence[JobRecord], now: float) -> dict[str, float]:
    """When each job first started since it was submitted, from the journal's recent actions (a name submitted
    again starts afresh), in the planner's time ``now``: ``now`` less how long ago, on the monotonic clock."""
    submitted = {rec.name: rec.submitted_s for rec in jobs}
    out: dict[str, float] = {}
    for row in journal.recent_actions(1000):
        at = row.finished_s
        if row.state != "done" or row.kind != "start" or not at or row.job not in submitted:
            continue
        if at >= submitted[row.job]:
            out[row.job] = min(out.get(row.job, at), at)
    ages.forget(set(out), kind="started")
    return {job: now - ages.ago(("started", job), stamp) for job, stamp in out.items()}


def last_moved(journal: Journal, ages: Ages, now: float) -> dict[str, float]:
    """When each job last started or moved, from the journal, in the planner's time ``now``: ``now`` less how long
    ago it was, measured on the monotonic clock (:class:`~flexmig.clocks.Ages`). The settling time then lasts what
    it says even when the wall clock is set back an hour."""
    out: dict[str, float] = {}
    for row in journal.recent_actions(1000):
        if row.job and row.state == "done" and row.finished_s and row.kind in ("start", "migrate", "resplit"):
            out[row.job] = max(out.get(row.job, 0.0), row.finished_s)
    ages.forget(set(out), kind="moved")
    return {job: now - ages.ago(("moved", job), stamp) for job, stamp in out.items()}
