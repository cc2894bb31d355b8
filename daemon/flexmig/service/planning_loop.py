"""The planning loop of the running daemon: plan every ``planner.interval_s`` (or when woken), publish each new plan,
and in mode ``act`` execute it.

``observe`` never plans; ``advise`` plans and publishes each new plan (``plan_proposed`` event,
``flexmig_planned_actions``), changing nothing; ``act`` also executes it. The plan is worked out off the event loop
and outside the action lock (the ``plan_now`` it is built with), so a long queue keeps no control request waiting;
the lock is taken to execute only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flexmig.act.mode import RuntimeMode
from flexmig.act.service import Actuator
from flexmig.config import Mode
from flexmig.errors import PlanRejectedError, StorageError
from flexmig.metrics.actions import ActionMetrics
from flexmig.mqtt.action_events import plan_actions, plan_event, plan_summary
from flexmig.mqtt.events import Event, EventFactory
from flexmig.plan.types import Plan
from flexmig.service.gate import ActionGate

__all__ = ["PlanNow", "PlanRound", "PlanningLoop"]

log = logging.getLogger(__name__)

_MIN_ROUND_GAP_S = 1.0  # planning rounds woken by events never come closer than this


@dataclass(frozen=True, slots=True)
class PlanRound:
    """One planning round: the plan, the document ``flexmig plan`` shows, and why it could not plan (if so)."""

    plan: Plan
    document: dict[str, Any]
    error: str | None = None


PlanNow = Callable[[str, tuple[str, ...]], Awaitable[PlanRound]]
"""What the planner would do now (given who asks and extra requests), changing nothing."""


class PlanningLoop:
    """Plans, publishes and (in mode ``act``) executes, round after round, on one actuator."""

    def __init__(
        self,
        act: Actuator,
        *,
        mode: RuntimeMode,
        gate: ActionGate,
        plan_now: PlanNow,
        interval_s: Callable[[], float],
        metrics: ActionMetrics,
        factory: EventFactory,
        fleet: Callable[[Event], None],
        wall: Callable[[], float],
    ) -> None:
        self.act = act
        self.mode = mode
        self.gate = gate
        self.plan_now = plan_now
        self.interval_s = interval_s
        """The planning interval now (read at each round: a reload changes it)."""
        self.metrics = metrics
        self.factory = factory
        self.fleet = fleet
        self.wall = wall
        self._wake = asyncio.Event()
        self._last_signature: tuple[str, ...] | None = None
        mode.on_change(lambda _old, _new: self.forget_plan())

    def wake(self) -> None:
        """Plan soon (a job was queued, or one ended and freed instances)."""
        self._wake.set()

    def forget_plan(self) -> None:
        """Publish the next plan even if it is the last one again (the mode changed)."""
        self._last_signature = None

    async def run(self) -> None:
        """Round after round until cancelled; once stopping, wait to be cancelled (closing now would cut the
        action in flight)."""
        loop = asyncio.get_running_loop()
        last = -_MIN_ROUND_GAP_S
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that arrives as the event is
            # set (drain() sets it just before the daemon cancels this task), and the loop would never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, last + self.interval_s() - loop.time())):
                    await self._wake.wait()
            self._wake.clear()
            gap = last + _MIN_ROUND_GAP_S - loop.time()
            if gap > 0:
                await asyncio.sleep(gap)
            last = loop.time()
            if self.gate.stopping:
                await asyncio.Event().wait()
            if self.mode.value == "observe":
                continue
            try:
                await self.round()
            except StorageError as exc:  # the journal's trouble (a bad row, a failing disk): one line, no traceback
                self.metrics.record_plan_failure()
                log.error("planning round failed: %s", exc)
            except Exception:  # a planner bug must not end the daemon; counted and logged
                self.metrics.record_plan_failure()
                log.exception("planning round failed")

    async def round(self) -> PlanRound:
        """One planning round in the current mode: plan; publish a new plan; in mode ``act`` execute it.

        A plan worked out while something else changed the journal (a move, a start, a job's exit: anything but a
        newly queued job) is not executed: the round wakes the loop to plan again from what is true now.
        """
        if self.gate.stopping:
            return PlanRound(Plan(), {}, "stopping")
        revision = self.act.journal.revision
        result = await self.plan_now("daemon", ())
        if result.error is not None:
            self.metrics.record_plan_failure()
            log.warning("planning round: %s", result.error)
            return result
        plan = result.plan
        async with self.gate.lock:
            mode = self.mode.value
            if self.gate.stopping:
                return PlanRound(Plan(), {}, "stopping")
            if plan and mode == "act" and self.act.journal.revision != revision:
                log.debug("planning round: the journal changed while the plan was worked out; planning again")
                self.wake()
                return PlanRound(Plan(), result.document, "stale")
            self.metrics.record_plan([a["action"] for a in plan_actions(plan)], plan.cost_s)
            if not plan:
                self._last_signature = None
                return result
            signature = tuple(json.dumps(a, sort_keys=True) for a in plan_actions(plan))
            if signature != self._last_signature or mode == "act":
                self._last_signature = signature
                self._publish(plan, mode)
            if mode == "act":
                return await self._execute(plan, result)
            return result

    async def _execute(self, plan: Plan, result: PlanRound) -> PlanRound:
        """Execute ``plan`` (mode ``act``, the action lock held)."""
        if self.gate.stopping:  # SIGTERM came while this plan was being made: start nothing new
            log.info("planner: plan not executed: the daemon is stopping")
            return PlanRound(plan, result.document, "stopping")
        began = time.monotonic()
        try:
            res = await self.act.execute(plan, origin="planner")
        except PlanRejectedError as exc:  # the journal cannot be written now, or the daemon stops
            self.metrics.record_plan_failure()
            log.warning("planning round: %s", exc)
            return PlanRound(plan, result.document, str(exc))
        log.info(
            "plan %d %s in %.1f s (estimated %.1f s)",
            res.plan_id,
            "completed" if res.ok else "did not complete",
            time.monotonic() - began,
            plan.cost_s,
        )
        return result

    def _publish(self, plan: Plan, mode: Mode) -> None:
        what = "executing" if mode == "act" else "proposing (advise: nothing is changed)"
        log.info("planner %s: %s", what, plan_summary(plan))
        for item in plan_actions(plan):
            log.info("  %s %s: %s (~%.1f s)", item["action"], item["target"], item["reason"], item["cost_s"])
        for note in plan.notes:
            log.info("  note: %s", note)
        self.fleet(plan_event(self.factory, plan, mode, self.wall()))
