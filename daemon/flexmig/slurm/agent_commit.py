"""The steps of a Slurm agent's round that change its node: a change carried out now, committed as flexmig's
reservation on a busy node (within the site-wide limit), moved earlier, abandoned, or given up for an
administrator's hold.

:class:`CommitSteps` is a part of :class:`flexmig.slurm.agent.SlurmAgent` (its base), kept apart so that the agent's
module holds the reading and the planning.
"""

from __future__ import annotations

from typing import Any

from flexmig.act.executor import Executor
from flexmig.plan.reregistration import RegistrationCost, Verdict, changes_instances
from flexmig.plan.types import Plan
from flexmig.plan.waiting import ENDING, Committed, next_step
from flexmig.slurm.agent_read import SlurmRead, SlurmRound, close_at
from flexmig.slurm.change import encode_change
from flexmig.slurm.client import SlurmClient
from flexmig.slurm.reservations import SlurmReservation, flexmig_name
from flexmig.slurm.settings import SlurmSettings

__all__ = ["CommitSteps"]


class CommitSteps:
    """The node-changing steps of :class:`flexmig.slurm.agent.SlurmAgent`'s round (see the module docstring)."""

    node: str
    settings: SlurmSettings
    client: SlurmClient
    executor: Executor
    cost: RegistrationCost
    _waiting: bool

    async def _leave_alone(self, read: SlurmRead, mode: str, why: str) -> SlurmRound:
        """An administrator holds the node: abandon flexmig's own waiting change, change nothing else."""
        events: list[tuple[str, dict[str, Any]]] = []
        if read.mine is not None and mode == "act":
            await self.client.delete_reservation(flexmig_name(self.node))
            self._waiting = False
            events.append(("change_abandoned", {"reason": why}))
        return SlurmRound(read, note=why, events=(*events, ("left_alone", {"reason": why})))

    async def _committed(
        self, read: SlurmRead, mode: str, plan: Plan, v: Verdict, mine: SlurmReservation
    ) -> SlurmRound:
        """A change waits (flexmig's reservation exists): abandon it, move it earlier, or carry it out."""
        if mode != "act":
            return SlurmRound(read, plan, v, note=f"a change waits in reservation {mine.name}; mode {mode} leaves it")
        step = next_step(
            Committed(mine.start_s, mine.end_s, started=mine.active(read.now_s)),
            changes=changes_instances(plan), go=v.go, busy=read.busy, now_s=read.now_s,
            close_in_s=close_at(read, self.cost.fixed_s),
        )  # fmt: skip
        if step.kind == "abandon":
            await self.client.delete_reservation(mine.name)
            self._waiting = False
            why = f"its demand is gone: {v.reason}"
            return SlurmRound(
                read, plan, v, note=f"change abandoned: {why}", events=(("change_abandoned", {"reason": why}),)
            )
        if step.kind == "change":
            return await self._change(read, plan, v)
        if step.kind == "earlier":
            start_in = step.start_in_s
            await self.client.move_reservation(mine.name, start_in, self.settings.drain_timeout_s)
            earlier = mine.start_s - read.now_s - start_in
            return SlurmRound(
                read, plan, v, note=f"jobs ended early: the change moves {earlier:.0f} s earlier",
                events=(("change_waiting", {"reason": v.reason, "start_in_s": round(start_in, 1)}),),
            )  # fmt: skip
        if step.reason == ENDING:
            return SlurmRound(read, plan, v, note="flexmig's reservation is ending")
        return SlurmRound(read, plan, v, note=f"a change waits for the node's jobs (reservation {mine.name})")

    async def _commit(self, read: SlurmRead, plan: Plan, v: Verdict, start_in: float | None = None) -> SlurmRound:
        """Commit a change on a busy node: flexmig's reservation from ``start_in`` seconds from now (by default
        :func:`~flexmig.slurm.agent_read.close_at`: when the node is expected to be empty), unless the site-wide
        limit is reached."""
        if start_in is None:
            start_in = close_at(read, self.cost.fixed_s)
        duration = self.settings.drain_timeout_s
        limit = self.settings.max_closed_nodes
        if limit > 0:
            start, end = read.now_s + start_in, read.now_s + start_in + duration
            others = [r for r in read.reservations if r.flexmig and r.overlaps(start, end)]
            if len(others) >= limit:
                return SlurmRound(
                    read, plan, v,
                    note=f"site limit: {len(others)} node(s) closed for flexmig then (max_closed_nodes = {limit})",
                )  # fmt: skip
        name = flexmig_name(self.node)
        await self.client.create_reservation(name, self.node, start_in, duration)
        self._waiting = True
        if limit > 0 and await self._over_limit(name, limit):
            await self.client.delete_reservation(name)
            return SlurmRound(
                read, plan, v, note=f"site limit: another node took the last slot (max_closed_nodes = {limit})"
            )
        when = "now" if start_in <= 0 else f"in {start_in:.0f} s, when its jobs are expected to have ended"
        return SlurmRound(
            read, plan, v,
            note=f"change committed: reservation {name} closes the node {when} (at most {duration:g} s)",
            events=(("change_waiting", {"reason": v.reason, "start_in_s": round(start_in, 1)}),),
        )  # fmt: skip

    async def _over_limit(self, name: str, limit: int) -> bool:
        """After making ``name``: whether it is beyond the site limit among overlapping flexmig reservations (the
        earliest, then by name, keep their slots: every node decides the same)."""
        res = [r for r in await self.client.reservations() if r.flexmig]
        mine = next((r for r in res if r.name == name), None)
        if mine is None:
            return False
        peers = sorted((r for r in res if r.overlaps(mine.start_s, mine.end_s)), key=lambda r: (r.start_s, r.name))
        return [r.name for r in peers].index(name) >= limit

    async def _change(self, read: SlurmRead, plan: Plan, v: Verdict) -> SlurmRound:
        """Carry out a change now (only hook jobs, or none, run)."""
        busy = bool(read.demand.running) or read.mine is not None
        action = encode_change(
            self.node, plan, read.demand.movable, v.reason, v.drain_s, busy=busy, serves=v.newly_served
        )
        res = await self.executor.execute_encoded([action], "slurm", (*plan.notes, v.reason))
        self._waiting = False
        events: list[tuple[str, dict[str, Any]]] = []
        for a in res.results:
            if a.outcome == "cancelled" and a.error and "did not acknowledge" in a.error:
                for job in read.demand.movable:
                    if f"Slurm job {job.job.job_id} did not acknowledge" in a.error:
                        events.append(("ack_missed", {
                            "slurm_job": job.job.job_id,
                            "reason": "missed its checkpoint acknowledgement: not asked again while it runs; the "
                                      "change waits for its end",
                        }))  # fmt: skip
        return SlurmRound(read, plan, v, res, events=tuple(events))
