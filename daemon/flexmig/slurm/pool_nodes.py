"""The pool nodes of a host managed as one Slurm node per MIG instance, carried out (:mod:`flexmig.slurm.pool` decides).

:class:`PoolNodes` is the instance carver's part (:class:`flexmig.slurm.carver.InstanceCarver`) for jobs that ask for
several MIG devices of one profile on one node. Each round, under the actuator's action lock:

1. every pool node is kept registered by its own agent (an instance node's agent whose node is several instances:
   its gres.conf block and GRES map hold its devices, its slurmd is started as an instance node's);
2. (mode act) a pool node idle for a round that no waiting job asks for leaves Slurm (static: back to FUTURE; its
   gres.conf block and map removed) and its instances get their own nodes again at the next round;
3. (mode act) for the first waiting job that asks for several devices no pool node has, that the cluster's
   assignment gives this host (:mod:`flexmig.slurm.cluster_claims`), and whose instances exist and are idle on one
   GPU, one journalled plan retires those instances' nodes without destroying the instances
   and registers the pool node (each a ``slurm_reregister``; the pool's carries its devices, so that a restarted
   flexmigd finishes it with the same ones).

The pools are remembered from round to round and, at start, read back from their GRES maps (a static pool node
returns to FUTURE when slurmctld restarts while its job runs on, and its agent registers it again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flexmig.act.executor import Executor
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.errors import PlanRejectedError, SlurmError
from flexmig.mig.catalogue import GpuModel
from flexmig.nvml.types import Inventory
from flexmig.plan.types import JobRequest, Plan
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_build import make_supply
from flexmig.slurm.agent_read import SlurmRound, SlurmView
from flexmig.slurm.change import encode_change
from flexmig.slurm.change_admin import admin_hold
from flexmig.slurm.cluster_claims import FREE_AFTER_MIN_S, FREE_AFTER_ROUNDS, Seen, host_queue
from flexmig.slurm.demand import read_demand
from flexmig.slurm.instances import queue_of
from flexmig.slurm.pool import (
    Pool,
    PoolAsk,
    PoolDevice,
    choose_pool,
    pool_asks,
    pool_node,
    pool_places,
    pool_port,
    pool_retires,
    split_asks,
)
from flexmig.slurm.settings import SlurmSettings, instance_node
from flexmig.slurm.shared_reads import Reads, shared_round
from flexmig.slurm.supply import Supply

__all__ = ["PoolAgentFor", "PoolNodes", "keep_places"]

log = logging.getLogger(__name__)

PoolAgentFor = Callable[[str, frozenset[tuple[int, int]] | None, int | None], SlurmAgent]
"""The agent of a pool node by name, over the instances given (``(gpu, start)``; None: as its GRES map says), with
its slurmd's port (a dynamic node's; None: a static one's, slurm.conf's)."""


def keep_places(supply: Supply, devices: frozenset[tuple[int, int]] | None) -> None:
    """Make ``supply`` (a pool node's :class:`flexmig.slurm.supply.Supply`) the instances ``devices``, or, when
    None and it has none yet, the instances its GRES map names (none when there is no map)."""
    if devices is not None:
        supply.places = devices
    elif supply.places is None:
        supply.places = frozenset((gpu, start) for gpu, start, _ in supply.index_map().values())


class PoolNodes:
    """The pool nodes of host node ``host`` (see the module docstring); ``name``: an instance's Slurm node by GPU,
    start and profile."""

    def __init__(
        self,
        host: str,
        *,
        settings: Callable[[], SlurmSettings],
        executor: Executor,
        agent_for: PoolAgentFor,
        name: Callable[[int, int, str], str],
        wall: Callable[[], float] = time.time,
        seen: Callable[[], Seen] = Seen,
    ) -> None:
        self.host = host
        self.wall = wall
        self.seen = seen
        """What the carver's cluster assignment remembers (:class:`flexmig.slurm.cluster_claims.Seen`): a pool is
        made only for a job the cluster gives this host (or nobody, or a host that left it waiting too long)."""
        self.settings = settings
        self.executor = executor
        self.agent_for = agent_for
        self.name = name
        self.pools: dict[str, Pool] = {}
        """The pool nodes flexmig registered (or is registering), by name."""
        self.idle_rounds: dict[str, int] = {}
        self.serving: frozenset[str] = frozenset()
        """The waiting jobs (request names) a pool node has the exact GRES for, as of the last step: the carving
        leaves them out."""
        self._recovered = False
        self._ports: dict[str, int] = {}

    def port(self, name: str) -> int | None:
        """The slurmd port of dynamic pool node ``name`` (:func:`flexmig.slurm.pool.pool_port`, by its place among
        the host's pool places); None with static nodes (slurm.conf's line has it)."""
        return None if self.settings().static_nodes else self._ports.get(name)

    def _learn(self, model: GpuModel, gpus: int) -> None:
        """The ports of the host's pool places (``gpus`` GPUs of ``model``), once."""
        if not self._ports:
            base = self.settings().slurmd_port_base
            for k, (gpu, profile, count) in enumerate(pool_places(model, gpus)):
                self._ports[pool_node(self.host, gpu, count, profile.name)] = pool_port(base, gpus, k)

    def pooled(self) -> frozenset[tuple[int, int]]:
        """The instances, ``(gpu, start)``, that belong to a pool node now (their own nodes are out of Slurm)."""
        return frozenset(d for p in self.pools.values() for d in p.devices)

    def recover(self, model: GpuModel, gpus: int) -> None:
        """Once, at the first round: the pool nodes whose GRES maps exist (registered before a restart)."""
        if self._recovered:
            return
        self._recovered = True
        self._learn(model, gpus)
        settings = self.settings()
        for gpu, profile, count in pool_places(model, gpus):
            name = pool_node(self.host, gpu, count, profile.name)
            supply = make_supply(settings.for_node(name), name, simulated=False, gpu=None, start=None, profile=None)
            try:
                keep_places(supply, None)
            except SlurmError as exc:
                log.warning("Slurm: pool node %s: %s", name, exc)
                continue
            devices = tuple(sorted(supply.places or ()))
            if len(devices) == count:
                self.pools[name] = Pool(profile.name, devices, gpu)
                log.info("Slurm: pool node %s over %s, read back from its GRES map", name, _where(devices))

    async def keep(self, mode: str, shared: Reads) -> list[tuple[SlurmAgent | None, SlurmRound]]:
        """Each pool node's agent's round (``plan=False``: kept registered with its instances)."""
        done: list[tuple[SlurmAgent | None, SlurmRound]] = []
        for name, pool in list(self.pools.items()):
            agent = self.agent_for(name, frozenset(pool.devices), self.port(name))
            done.append((agent, await shared_round(agent, mode, shared, plan=False)))
        return done

    async def step(self, look: SlurmView, inventory: Inventory) -> tuple[None, SlurmRound] | None:
        """Mode act: give back one idle pool node no waiting job asks for, else register one a waiting job asks for
        (see the module docstring); None when there is nothing to do."""
        view = NodeView.of(inventory)
        try:
            model = node_model(view)
        except PlanRejectedError:
            return None
        self._learn(model, len(inventory.gpus))
        asks = pool_asks(self._waiting(look, model, view))
        done = await self._give_back(look, asks)
        if done is None:
            done = await self._make(look, view, model, split_asks(asks, self._open(look))[1])
        self.serving = split_asks(asks, self._open(look))[0]  # a pool made just now serves its job at once
        return done

    def _open(self, look: SlurmView) -> list[Pool]:
        """The pool nodes no job runs on (as ``look`` shows them; one made since is open)."""
        return [p for name, p in self.pools.items() if not _busy(look, name)]

    def _waiting(self, look: SlurmView, model: GpuModel, view: NodeView) -> Sequence[JobRequest]:
        """Slurm's waiting jobs for this host's partitions (the host's instance nodes' own, or ``partitions``), less
        the jobs of several devices the cluster's assignment gives another host (:mod:`flexmig.slurm.cluster_claims`:
        on several hosts, one alone makes the pool node)."""
        jobs, nodes, reservations = look
        settings = self.settings()
        parts = settings.partitions or tuple(sorted({p for n in nodes if n.name.startswith(f"{self.host}-")
                                                     for p in n.partitions}))  # fmt: skip
        first = min((i.gpu for i in view.instances), default=0)
        now = self.wall()
        demand = read_demand(
            jobs, None, instance_node(self.host, first, 0), model, index_map={}, now_s=now, partitions=parts,
            hook_token=settings.hook_token,
        )  # fmt: skip
        gpus = len({i.gpu for i in view.instances}) or 1
        queue, _ = queue_of(demand, now, most_parts=gpus * model.compute_slices, pools=True, model=model)
        mine, _, _ = host_queue(
            self.host, queue, nodes, jobs, model, reserved=frozenset(n for r in reservations for n in r.nodes),
            seen=self.seen(), now_s=now, hook_token=settings.hook_token,
            free_after_s=max(FREE_AFTER_MIN_S, FREE_AFTER_ROUNDS * settings.interval_s),
        )  # fmt: skip
        kept = {w.name.split("#", 1)[0] for w in mine}
        return [r for r in demand.pending if r.ranks <= 1 or r.name in kept]

    async def _give_back(self, look: SlurmView, asks: Iterable[PoolAsk]) -> tuple[None, SlurmRound] | None:
        """The first pool node :func:`~flexmig.slurm.pool.pool_retires` lets go leaves Slurm, its instances kept."""
        _, nodes, reservations = look
        by_name = {n.name: n for n in nodes}
        asks = list(asks)
        for name, pool in sorted(self.pools.items()):
            node = by_name.get(name)
            if node is None:  # registering, or back in FUTURE after a slurmctld restart: its agent registers it
                self.idle_rounds[name] = 0
                continue
            self.idle_rounds[name] = 0 if _busy(look, name) else self.idle_rounds.get(name, -1) + 1
            held = admin_hold(node, reservations, name) is not None
            if not pool_retires(pool, idle_rounds=self.idle_rounds[name], held=held, asks=asks):
                continue
            why = f"pool node {name} idle, no waiting job asks for {pool.gres}: its instances get their own nodes"
            action = self._encode(name, pool, why, retire=True)
            res = await self.executor.execute_encoded([action], "slurm", (why,))
            if res.ok:
                del self.pools[name]
                self.idle_rounds.pop(name, None)
            log.info("Slurm: %s (%s)", why, "done" if res.ok else "did not complete")
            return None, SlurmRound(None, result=res, note=why)
        return None

    async def _make(
        self, look: SlurmView, view: NodeView, model: GpuModel, asks: Sequence[PoolAsk]
    ) -> tuple[None, SlurmRound] | None:
        """A pool node for the first of ``asks`` (those no pool node serves) whose instances are free."""
        devices = self._devices(look, view)
        for ask in asks:
            try:
                pool = choose_pool(ask, devices, model)
            except KeyError:
                continue
            if pool is None or pool.name(self.host) in self.pools:
                continue
            return await self._register(pool, ask)
        return None

    def _devices(self, look: SlurmView, view: NodeView) -> list[PoolDevice]:
        """The host's MIG instances outside pools, each free when its instance node is registered, idle, not
        drained, held or reserved, and no job runs on it."""
        jobs, nodes, reservations = look
        by_name = {n.name: n for n in nodes}
        pooled = self.pooled()
        out = []
        for i in view.instances:
            if i.uuid is None or i.key in pooled:
                continue
            name = self.name(i.gpu, i.start, i.profile)
            n = by_name.get(name)
            free = (
                n is not None and n.idle and n.responding and not n.drained and not i.pids
                and not any(name in r.nodes for r in reservations)
                and not any(j.active and name in j.nodes for j in jobs)
            )  # fmt: skip
            out.append(PoolDevice(i.gpu, i.start, i.profile, free))
        return out

    async def _register(self, pool: Pool, ask: PoolAsk) -> tuple[None, SlurmRound]:
        """One journalled plan: the pool's instances' nodes retired (their instances kept), then the pool node
        registered over them."""
        name = pool.name(self.host)
        why = f"pool node {name} over {_where(pool.devices)} for {ask.job} ({ask.gres})"
        actions = [
            encode_change(self.name(gpu, start, pool.profile), Plan(), (), why, 0.0, retire=True)
            for gpu, start in pool.devices
        ]
        actions.append(self._encode(name, pool, why, serves=(ask.job,)))
        self.agent_for(name, frozenset(pool.devices), self.port(name))
        res = await self.executor.execute_encoded(actions, "slurm", (why,))
        retired = all(r.outcome == "completed" for r in res.results[:-1]) and len(res.results) == len(actions)
        if retired:  # registered, or its agent registers it at the next round
            self.pools[name] = pool
            self.idle_rounds[name] = 0
        log.info("Slurm: %s (%s)", why, "done" if res.ok else "did not complete")
        return None, SlurmRound(None, result=res, note=why)

    def _encode(
        self, name: str, pool: Pool, why: str, *, retire: bool = False, serves: Sequence[str] = ()
    ) -> tuple[str, str | None, dict[str, Any]]:
        """The pool node's ``slurm_reregister``, with its devices (and a dynamic node's port) for a restart."""
        kind, target, payload = encode_change(name, Plan(), (), why, 0.0, serves=serves, retire=retire)
        payload["pool"] = [list(d) for d in pool.devices]
        port = self.port(name)
        if port is not None:
            payload["port"] = port
        return kind, target, payload


def _busy(look: SlurmView, name: str) -> bool:
    """Whether a job runs on pool node ``name`` (or is about to: Slurm lists the node not idle)."""
    jobs, nodes, _ = look
    node = next((n for n in nodes if n.name == name), None)
    return (node is not None and not node.idle) or any(j.active and name in j.nodes for j in jobs)


def _where(devices: Iterable[tuple[int, int]]) -> str:
    """``gpu0@0, gpu0@1``-style words of a pool's instances."""
    return ", ".join(f"gpu{gpu}@{start}" for gpu, start in devices)
