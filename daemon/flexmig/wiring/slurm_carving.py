"""The round of a host managed as one Slurm node per MIG instance (``[slurm] node_per_instance``, Slurm 23.11+).

Each round, under the actuator's action lock and on one look at Slurm and NVML (:class:`SharedReads`):

1. every MIG instance's node is kept registered by its own agent (:meth:`flexmig.slurm.agent.SlurmAgent.round`
   with ``plan=False``: registered when missing, slurmd started again when it crashed, an administrator's node
   left alone);
2. (mode act) a node of the host whose instance is gone is retired, unless a job runs on it or an administrator
   holds it;
3. (modes advise and act) the host is carved (:func:`flexmig.plan.carving.carve`); in mode act the carving's
   retirements and registrations run as one journalled plan (:func:`flexmig.slurm.instances.carving_actions`),
   and a held region's free nodes get flexmig's reservation ``flexmig-<node>-hold``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from flexmig.act.executor import Executor
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.errors import PlanRejectedError
from flexmig.nvml.types import Inventory
from flexmig.plan.carving import HOLD_AFTER_S, Hold, carve
from flexmig.plan.types import Plan
from flexmig.slurm.agent import SlurmAgent, SlurmRound, SlurmView
from flexmig.slurm.change import admin_hold, encode_change
from flexmig.slurm.client import SlurmClient
from flexmig.slurm.demand import read_demand
from flexmig.slurm.instances import HostLayouts, busy_of, carving_actions, describe, hold_name, host_layouts, queue_of
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.settings import SlurmSettings, instance_node, parse_instance_node

__all__ = ["InstanceCarver", "Reads"]

log = logging.getLogger(__name__)

Where = tuple[int, int]


class Reads(Protocol):
    """What :class:`flexmig.wiring.slurm.SharedReads` offers: one look at Slurm and NVML, read again after a round
    that changed something."""

    async def view(self) -> SlurmView:
        """Slurm's jobs, nodes and reservations."""

    async def inventory(self) -> Inventory:
        """NVML's inventory."""

    def after(self, rnd: SlurmRound) -> None:
        """Forget the looks when ``rnd`` did anything."""


class InstanceCarver:
    """Keeps host node ``node``'s instance nodes registered and carves its GPUs for Slurm's waiting jobs."""

    def __init__(
        self,
        node: str,
        *,
        settings: Callable[[], SlurmSettings],
        client: SlurmClient,
        executor: Executor,
        agent_for: Callable[[int, int], SlurmAgent],
        wall: Callable[[], float],
        hold_after_s: float = HOLD_AFTER_S,
    ) -> None:
        self.node = node
        self.settings = settings
        self.client = client
        self.executor = executor
        self.agent_for = agent_for
        self.wall = wall
        self.hold_after_s = hold_after_s
        self.hold: Hold | None = None
        """The region held for a blocked job at the last round (carving indices), or None."""
        self.left_out: dict[str, str] = {}
        """The waiting jobs the last round left out of the carving, and why."""

    @property
    def hold_reservation(self) -> str:
        """The name of flexmig's reservation on a held region."""
        return hold_name(self.node)

    async def round(self, mode: str, shared: Reads) -> list[tuple[SlurmAgent, SlurmRound]]:
        """One round (see the module docstring): each instance agent's round, then the carving's, in order."""
        inventory = await shared.inventory()
        view = NodeView.of(inventory)
        live = sorted(i.key for i in view.instances if i.uuid is not None)
        done: list[tuple[SlurmAgent, SlurmRound]] = []
        for gpu, start in live:
            agent = self.agent_for(gpu, start)
            agent.own_reservations = frozenset({self.hold_reservation})
            try:
                agent.shared = await shared.view()
                agent.shared_inventory = await shared.inventory()
                rnd = await agent.round(mode, plan=False)
            finally:
                agent.shared = None
                agent.shared_inventory = None
            shared.after(rnd)
            done.append((agent, rnd))
        if mode == "observe":
            return done
        retired = await self._retire_stale(mode, await shared.view(), set(live))
        if retired is not None:
            done.append(retired)
            shared.after(retired[1])
        carved = await self._carve(mode, await shared.view(), await shared.inventory(), done)
        if carved is not None:
            done.append(carved)
        return done

    # ------------------------------------------------------------------------------------------ stale nodes
    async def _retire_stale(self, mode: str, look: SlurmView, live: set[Where]) -> tuple[SlurmAgent, SlurmRound] | None:
        """Nodes of this host whose instance NVML no longer shows leave Slurm (mode act), unless in use or held."""
        jobs, nodes, reservations = look
        others = [r for r in reservations if r.name != self.hold_reservation]
        actions = []
        agent: SlurmAgent | None = None
        for n in nodes:
            where = parse_instance_node(self.node, n.name)
            if where is None or where in live:
                continue
            if admin_hold(n, others, n.name) is not None or any(j.active and n.name in j.nodes for j in jobs):
                continue
            agent = self.agent_for(*where)
            actions.append(encode_change(n.name, Plan(), (), "its MIG instance is gone", 0.0, retire=True))
        if not actions or agent is None:
            return None
        if mode != "act":
            return agent, SlurmRound(None, note=f"{len(actions)} node(s) without their MIG instance; mode {mode}")
        res = await self.executor.execute_encoded(actions, "slurm", ("instance nodes without their instance",))
        return agent, SlurmRound(None, result=res, note=f"retired {len(actions)} node(s) whose MIG instance is gone")

    # ------------------------------------------------------------------------------------------ carving
    async def _carve(
        self, mode: str, look: SlurmView, inventory: Inventory, done: Sequence[tuple[SlurmAgent, SlurmRound]]
    ) -> tuple[SlurmAgent, SlurmRound] | None:
        jobs, nodes, reservations = look
        view = NodeView.of(inventory)
        try:
            model = node_model(view)
        except PlanRejectedError:
            return None
        by_name = {n.name: n for n in nodes}
        others = [r for r in reservations if r.name != self.hold_reservation]
        held: set[Where] = set()
        registering: set[Where] = set()
        in_use: dict[Where, bool] = {}
        ours: list[SlurmNode] = []
        for i in view.instances:
            if i.uuid is None:
                continue
            name = instance_node(self.node, i.gpu, i.start)
            n = by_name.get(name)
            if n is None or not n.responding:
                registering.add(i.key)
                continue
            ours.append(n)
            if admin_hold(n, others, name) is not None:
                held.add(i.key)
            in_use[i.key] = not n.idle
        mig_on = {g.index: bool(g.mig_current) for g in inventory.gpus}
        hl = host_layouts(view, model, mig_on, held)
        if not hl.layouts:
            return None
        running = [r for _, rnd in done if rnd.read is not None for r in rnd.read.demand.running]
        busy_nvml = busy_of(running, in_use)
        busy: dict[Where, float | None] = {}
        for (gpu, start), left in busy_nvml.items():
            k = hl.index(gpu)
            if k is not None and hl.layouts[k].at(start) is not None:
                busy[(k, start)] = left
        settings = self.settings()
        partitions = settings.partitions or tuple(sorted({p for n in ours for p in n.partitions}))
        now = self.wall()
        demand = read_demand(
            jobs, None, instance_node(self.node, hl.gpus[0], 0), model, index_map={}, now_s=now,
            partitions=partitions, hook_token=settings.hook_token,
        )  # fmt: skip
        queue, self.left_out = queue_of(demand, now)
        registering_c = hl.to_carving(registering) - busy.keys()
        registering_c = frozenset(w for w in registering_c if hl.layouts[w[0]].at(w[1]) is not None)
        c = carve(
            model, hl.layouts, busy, queue, now_s=now, hold=self.hold, registering=registering_c, pinned=hl.pinned,
            hold_after_s=self.hold_after_s,
        )  # fmt: skip
        self.hold = c.hold
        agent = self.agent_for(hl.gpus[0], 0)
        words = describe(hl, c)
        if mode != "act":
            note = f"carving (mode {mode}): {', '.join(words)}" if words else ""
            return agent, SlurmRound(None, note=note)
        await self._keep_hold(hl, c.hold, busy, now)
        if not c.destroy and not c.create:
            return agent, SlurmRound(None, note="; ".join(r for r in c.reasons if "holds" in r))
        actions = carving_actions(self.node, hl, c, "; ".join(c.reasons))
        res = await self.executor.execute_encoded(actions, "slurm", tuple(c.reasons))
        failed = [a for a in res.results if a.outcome != "completed"]
        note = f"carved: {', '.join(words)}" + (f" ({len(failed)} action(s) did not complete)" if failed else "")
        return agent, SlurmRound(None, result=res, note=note)

    async def _keep_hold(self, hl: HostLayouts, hold: Hold | None, busy: dict[Where, float | None], now: float) -> None:
        """flexmig's reservation on the held region's free nodes, from when its busy instances are expected to
        end; none without a hold (or without free nodes in the region)."""
        name = self.hold_reservation
        existing = next((r for r in await self.client.reservations() if r.name == name), None)
        nodes: list[str] = []
        if hold is not None:
            region = hold.slices(hl.model)
            lay = hl.layouts[hold.gpu]
            for inst in lay:
                if inst.start < region.stop and region.start < inst.end and (hold.gpu, inst.start) not in busy:
                    nodes.append(instance_node(self.node, hl.gpus[hold.gpu], inst.start))
        if not nodes or hold is None:
            if existing is not None:
                await self.client.delete_reservation(name)
            return
        start_in = max(0.0, hold.at_s - now) if hold.at_s != float("inf") else 3600.0
        if existing is not None and sorted(existing.nodes) == sorted(nodes):
            return
        if existing is not None:
            await self.client.delete_reservation(name)
        await self.client.create_reservation(name, ",".join(nodes), start_in, self.settings().drain_timeout_s)
        log.info("Slurm: held %s for %s from %.0f s on (reservation %s)", ",".join(nodes), hold.job, start_in, name)
