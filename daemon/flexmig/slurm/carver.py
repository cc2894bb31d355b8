"""The round of a host managed as one Slurm node per MIG instance (``[slurm] node_per_instance``, Slurm 23.11+).

Each round, under the actuator's action lock and on one look at Slurm and NVML
(:class:`flexmig.slurm.shared_reads.SharedReads`):

1. every MIG instance's node is kept registered by its own agent (:meth:`flexmig.slurm.agent.SlurmAgent.round`
   with ``plan=False``: registered when missing, slurmd started again when it crashed, an administrator's node
   left alone);
2. (mode act) a node of the host whose instance is gone is retired, unless a job runs on it or an administrator
   holds it;
3. (modes advise and act) the host is carved (:func:`flexmig.plan.carving.carve`); in mode act the carving's
   retirements and registrations run as one journalled plan (:func:`flexmig.slurm.instances.carving_actions`),
   and a held region's nodes get flexmig's reservation ``flexmig-<node>-hold``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from flexmig.act.executor import Executor
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.errors import PlanRejectedError
from flexmig.nvml.types import Inventory
from flexmig.plan.carving import Carving, Hold
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_read import SlurmRound, SlurmView
from flexmig.slurm.carving_choice import (
    CarvingHost,
    after_carving,
    carving_host,
    choose_carving,
    profile_at,
    stale_retirements,
    waiting_of,
)
from flexmig.slurm.client import SlurmClient
from flexmig.slurm.cluster_claims import Seen
from flexmig.slurm.demand import SlurmRunning, job_id_of
from flexmig.slurm.instances import (
    MIXED,
    TOO_MANY,
    HostLayouts,
    carving_actions,
    carving_report,
    describe,
    hold_name,
)
from flexmig.slurm.moving import choose_moves, move_actions, move_hold
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.pool_nodes import PoolAgentFor, PoolNodes
from flexmig.slurm.settings import SlurmSettings
from flexmig.slurm.shared_reads import Reads, shared_round

__all__ = ["CARVING", "InstanceCarver"]

CARVING = "flexmig: carving new MIG instances"
"""The reason of flexmig's drain of the idle instance nodes a carving retires (resumed when one is not retired)."""

log = logging.getLogger(__name__)


class InstanceCarver:
    """Keeps host node ``node``'s instance nodes registered and carves its GPUs for Slurm's waiting jobs."""

    def __init__(
        self,
        node: str,
        *,
        settings: Callable[[], SlurmSettings],
        client: SlurmClient,
        executor: Executor,
        agent_for: Callable[[int, int, str], SlurmAgent],
        wall: Callable[[], float],
        pool_agent_for: PoolAgentFor | None = None,
    ) -> None:
        self.node = node
        self.settings = settings
        self.client = client
        self.executor = executor
        self.agent_for = agent_for
        self.wall = wall
        self.hold: Hold | None = None
        """The region held for a blocked job at the last round (carving indices), or None."""
        self._held: Hold | None = None
        """The hold flexmig's reservation was made for, or None."""
        self.left_out: dict[str, str] = {}
        """The waiting jobs the last round left out of the carving, and why."""
        self.unmovable: set[int] = set()
        """Jobs whose move did not complete (their acknowledgement timed out, say): never asked again while they
        run, as the agent of a whole node never asks such a job twice."""
        self.refused: set[int] = set()
        """The waiting jobs already told to be refused (:meth:`_tell_refused`)."""
        self.seen = Seen()
        """What the cluster's assignment of waiting jobs to hosts remembers from the last round."""
        self.pools: PoolNodes | None = None
        """The host's pool nodes, for jobs of several devices (None: not made for this carver)."""
        if pool_agent_for is not None:
            self.pools = PoolNodes(node, settings=settings, executor=executor, agent_for=pool_agent_for,
                                   name=self.name, wall=wall, seen=lambda: self.seen)  # fmt: skip

    def name(self, gpu: int, start: int, profile: str) -> str:
        """The Slurm node of the instance of ``profile`` at ``start`` of GPU ``gpu`` (dynamic or static)."""
        return self.settings().instance_name(self.node, gpu, start, profile)

    @property
    def hold_reservation(self) -> str:
        """The name of flexmig's reservation on a held region."""
        return hold_name(self.node)

    async def round(self, mode: str, shared: Reads) -> list[tuple[SlurmAgent | None, SlurmRound]]:
        """One round (see the module docstring): each instance agent's round, then the carving's, in order (the
        host's own rounds, retiring and carving, with no agent)."""
        inventory = await shared.inventory()
        view = NodeView.of(inventory)
        live = sorted((i.gpu, i.start, i.profile) for i in view.instances if i.uuid is not None)
        pooled = self._recover_pools(view, len(inventory.gpus))
        done: list[tuple[SlurmAgent | None, SlurmRound]] = []
        for gpu, start, profile in (i for i in live if (i[0], i[1]) not in pooled):  # a pool's node serves those
            agent = self.agent_for(gpu, start, profile)
            agent.own_reservations = frozenset({self.hold_reservation})
            done.append((agent, await shared_round(agent, mode, shared, plan=False)))
        if self.pools is not None:
            done += await self.pools.keep(mode, shared)
        if mode == "observe":
            return done
        retired = await self._retire_stale(mode, await shared.view(), {self.name(*i) for i in live})
        if retired is not None:
            done.append(retired)
            shared.after(retired[1])
        if self.pools is not None and mode == "act":
            pooling = await self.pools.step(await shared.view(), await shared.inventory())
            if pooling is not None:
                done.append(pooling)
                shared.after(pooling[1])
        carved = await self._carve(mode, await shared.view(), await shared.inventory(), done)
        if carved is not None:
            done.append(carved)
        return done

    def _recover_pools(self, view: NodeView, gpus: int) -> frozenset[tuple[int, int]]:
        """The instances of the host's pool nodes, read back from their GRES maps at the first round."""
        if self.pools is None:
            return frozenset()
        with contextlib.suppress(PlanRejectedError):
            self.pools.recover(node_model(view), gpus)
        return self.pools.pooled()

    # ------------------------------------------------------------------------------------------ stale nodes
    async def _retire_stale(self, mode: str, look: SlurmView, live: set[str]) -> tuple[None, SlurmRound] | None:
        """Nodes of this host whose instance NVML no longer shows (``live``: the nodes of the instances it shows)
        leave Slurm (mode act), unless in use or held."""
        static = self.settings().static_nodes
        actions = stale_retirements(self.node, look, live, hold_reservation=self.hold_reservation, static=static)
        if not actions:
            return None
        if mode != "act":
            return None, SlurmRound(None, note=f"{len(actions)} node(s) without their MIG instance; mode {mode}")
        res = await self.executor.execute_encoded(actions, "slurm", ("instance nodes without their instance",))
        return None, SlurmRound(None, result=res, note=f"retired {len(actions)} node(s) whose MIG instance is gone")

    # ------------------------------------------------------------------------------------------ carving
    async def _carve(
        self, mode: str, look: SlurmView, inventory: Inventory, done: Sequence[tuple[SlurmAgent | None, SlurmRound]]
    ) -> tuple[None, SlurmRound] | None:
        running = [r for _, rnd in done if rnd.read is not None for r in rnd.read.demand.running]
        pooled, served = (frozenset(), frozenset()) if self.pools is None else (self.pools.pooled(), self.pools.serving)
        ch = carving_host(
            look, inventory, running, name=self.name, hold_reservation=self.hold_reservation, pooled=pooled
        )
        if ch is None:
            return None
        hl, by_name = ch.layouts, ch.by_name
        settings = self.settings()
        now = self.wall()
        c, self.left_out, self.seen = choose_carving(
            self.node, ch, look[0], settings, now_s=now, hold=self.hold, seen=self.seen, served=served
        )
        self._tell_refused()
        if mode == "act":
            moved = await self._move(ch, running, look, settings, now=now, hold=c.hold)
            if moved is not None:
                return moved
        self.hold = c.hold
        report = carving_report(self.name, hl, c, now_s=now)
        if mode != "act":
            words = describe(hl, c)
            note = f"carving (mode {mode}): {', '.join(words)}" if words else ""
            return None, SlurmRound(None, note=note, carving=report)
        mine = any(r.name == self.hold_reservation for r in look[2])
        _, rnd = await self._execute(hl, c, by_name, now=now, settings=settings, hold_listed=mine)
        return None, replace(rnd, carving=report)

    def _tell_refused(self) -> None:
        """One warning per waiting job that no layout of this mode can ever serve (:data:`MIXED`: devices of several
        profiles on one node; :data:`TOO_MANY`: more devices of one profile on one node than a GPU holds), when it
        is first left out: the job pends in Slurm, and this line says why."""
        refused = {job_id_of(name): why for name, why in self.left_out.items() if why.startswith((MIXED, TOO_MANY))}
        for job, why in sorted((j, w) for j, w in refused.items() if j is not None and j not in self.refused):
            log.warning("Slurm: job %d %s", job, why)
        self.refused = {j for j in refused if j is not None}

    async def _move(
        self, ch: CarvingHost, running: Sequence[SlurmRunning], look: SlurmView, settings: SlurmSettings,
        *, now: float, hold: Hold | None,
    ) -> tuple[None, SlurmRound] | None:  # fmt: skip
        """Mode act: the moves of running hook jobs that give the first blocked waiting job its region
        (:mod:`flexmig.slurm.moving`), carried out instead of this round's carving, and the region held for that
        job; None when nothing is worth moving."""
        self.unmovable &= {r.job.job_id for r in running}
        candidates = [r if r.job.job_id not in self.unmovable else replace(r, movable=False) for r in running]
        jobs, _, reservations = look
        queue, _ = waiting_of(self.node, ch, jobs, settings, now_s=now)
        plan = choose_moves(self.node, ch, candidates, queue, hold=hold, max_moves_per_job=settings.max_moves_per_job,
                            jobs=jobs, reservations=reservations, hook_token=settings.hook_token)  # fmt: skip
        kept = move_hold(plan, now)
        if not plan.moves or kept is None:
            return None
        log.info("Slurm: moving running hook job(s) to make room: %s", plan.reason)
        res = await self.executor.execute_encoded(move_actions(plan, ch, running, self.name), "slurm", (plan.reason,))
        done = [a.outcome == "completed" for a in res.results]
        self.unmovable |= {int(m.job) for k, m in enumerate(plan.moves) if k >= len(done) or not done[k]}
        self.hold = kept
        await self._keep_hold(ch.layouts, kept, now, settings)  # the region's nodes that remain, from its time
        return None, SlurmRound(None, result=res, note=f"moved: {plan.reason}")

    async def _execute(
        self,
        hl: HostLayouts,
        c: Carving,
        by_name: dict[str, SlurmNode],
        *,
        now: float,
        settings: SlurmSettings,
        hold_listed: bool,
    ) -> tuple[None, SlurmRound]:
        """Mode act: the carving's retirements and registrations, one journalled plan; the hold's reservation
        (``hold_listed``: the round's look at Slurm lists it)."""
        stale = [n.name for n in by_name.values() if n.drained and n.reason == CARVING]
        await self._reopen(stale)  # a carving cut short by a crash drained them: nothing retires them now
        retiring = [self.name(hl.gpus[i], start, profile_at(hl, i, start)) for i, start in c.destroy]
        for name in retiring:  # closed to new jobs all at once: the later ones wait while the first ones retire
            n = by_name.get(name)
            if n is not None and not n.drained:
                await self.client.drain(name, CARVING)
        drained_at = self.wall()  # one backfill cycle after this serves every retirement of the carving
        if (c.hold is None and hold_listed) or (self._held is not None and self._held != c.hold):
            await self._drop_hold()
        res = None
        if c.destroy or c.create:
            actions = carving_actions(self.name, hl, c, "; ".join(c.reasons), drained_at=drained_at)
            res = await self.executor.execute_encoded(actions, "slurm", tuple(c.reasons))
        await self._reopen(retiring)
        if c.hold is not None:
            await self._keep_hold(after_carving(hl, c), c.hold, now, settings)
        if res is None:
            held = [r for r in c.reasons if "holds" in r]
            left = [f"{name} left out: {why}" for name, why in sorted(self.left_out.items())]
            return None, SlurmRound(None, note="; ".join([*held, *left]))
        failed = [a for a in res.results if a.outcome != "completed"]
        note = f"carved: {', '.join(describe(hl, c))}"
        if failed:
            note += f" ({len(failed)} action(s) did not complete)"
        return None, SlurmRound(None, result=res, note=note)

    async def _reopen(self, names: Sequence[str]) -> None:
        """Resume the nodes among ``names`` that flexmig drained for a carving and are still in Slurm (their
        retirement was cancelled or skipped)."""
        if not names:
            return
        for n in await self.client.nodes():
            if n.name in names and n.drained and n.reason == CARVING:
                await self.client.resume(n.name)

    async def _drop_hold(self) -> None:
        self._held = None
        await self.client.delete_reservation(self.hold_reservation)

    async def _keep_hold(self, hl: HostLayouts, hold: Hold, now: float, settings: SlurmSettings) -> None:
        """flexmig's reservation on the held region's nodes (``hl``: the layouts after this round's carving; the
        nodes Slurm lists), from when its busy instances are expected to end (jobs running there run on:
        ``IGNORE_JOBS``). The site-wide limit (``max_closed_nodes``) counts it as one closed node."""
        name = self.hold_reservation
        listed = {n.name for n in await self.client.nodes()}
        region = hold.slices(hl.model)
        nodes = [
            self.name(hl.gpus[hold.gpu], inst.start, inst.profile.name)
            for inst in hl.layouts[hold.gpu]  # the busy ones too: once their jobs end, only jobs that end in time
            if inst.start < region.stop and region.start < inst.end
        ]
        nodes = [n for n in nodes if n in listed]
        reservations = await self.client.reservations()
        existing = next((r for r in reservations if r.name == name), None)
        if existing is not None and sorted(existing.nodes) == sorted(nodes) and self._held == hold:
            return
        if existing is not None:
            await self.client.delete_reservation(name)
        self._held = None
        if not nodes:
            return
        start_in = max(0.0, hold.at_s - now) if hold.at_s != float("inf") else 3600.0
        duration = settings.drain_timeout_s
        limit = settings.max_closed_nodes
        if limit > 0:
            start, end = now + start_in, now + start_in + duration
            others = [r for r in reservations if r.flexmig and r.name != name and r.overlaps(start, end)]
            if len(others) >= limit:
                log.info("Slurm: no hold for %s: site limit, %d node(s) closed for flexmig then", hold.job, len(others))
                return
        await self.client.create_reservation(name, ",".join(nodes), start_in, duration)
        self._held = hold
        log.info("Slurm: held %s for %s from %.0f s on (reservation %s)", ",".join(nodes), hold.job, start_in, name)
