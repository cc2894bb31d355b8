"""flexmig's Slurm agent in the running daemon (``[slurm] enabled = true``): loop ``slurm``, metrics, events.

:class:`SlurmComponent` is the daemon's ``slurm`` component (:mod:`flexmig.wiring.component`), on the actuator's:

* **built** (:meth:`~flexmig.wiring.actuator.ActuatorComponent.on_built`): the agent is made on the actuator's
  executor and adds the runner of ``slurm_reregister`` actions before the journal is reconciled, so a
  re-registration cut short by a crash is finished at start (in mode ``act``; in the other modes the node stays as
  the crash left it, and the log says so);
* **loop** ``slurm``: every ``[slurm] probe_s`` a cheap look (``sdiag``'s job counters, slurmd's pid file), and a
  :meth:`~flexmig.slurm.agent.SlurmAgent.round` when it shows a change (a job submitted, started or ended; slurmd
  crashed) or every ``[slurm] interval_s``, under the actuator's action lock (a stop waits for a re-registration
  in flight as for any action, then the journal finishes it). A Slurm that cannot be read is one WARNING line when
  it starts failing (and when the error changes), one INFO line when it answers again, and an event each time;
  sampling and detection go on, and nothing is changed meanwhile;
* **metrics**: :class:`~flexmig.metrics.slurm.SlurmMetrics`; **events**: ``slurm_unreachable``,
  ``slurm_reachable``, ``slurm_plan`` (each new decision), ``slurm_job_signalled``/``requeued``/``released``,
  ``slurm_node`` (slurmd restarted, a change waiting or abandoned, an acknowledgement missed, the node left alone),
  ``slurm_carving`` (one node per MIG instance: each carving done, or in mode advise proposed, and each hold taken
  or dropped); the re-registrations themselves are actions, with the actuator's action events and metrics.

Which nodes the host is comes first, at :meth:`SlurmComponent.attach` (:mod:`flexmig.slurm.layout`, ``[slurm]
layout``): by default one node per MIG instance in the form the node's Slurm supports (static nodes where slurm.conf
declares this host's, else dynamic ones from 23.11), said in one line; where neither can work, one WARNING line and a
``slurm_node`` event ``refused``, and the component changes nothing.

With ``[slurm] node_per_gpu`` (Slurm 23.11 and later) the component runs one agent per MIG GPU, each managing
the dynamic node ``<node>-gpu<K>`` with its own slurmd, reservation and journalled changes; the journal's
``slurm_reregister`` actions go to the agent of the node their payload names (also when a crash left one to
finish at start). Before anything else, a Slurm older than 23.11 is refused with one line. The agents of one round
run one after the other (GPU nodes with a waiting change first, then idle ones, then by GPU): the pending jobs an
agent's change serves (carried out, committed or still waiting) are *claimed* for a while and left out of its
siblings' queues, so two GPU nodes never change for the same job (:class:`flexmig.slurm.claims.Claims`).

With ``[slurm] node_per_instance`` (Slurm 23.11 and later, refused before in the same way) every MIG instance is
its own dynamic node ``<node>-gpu<K>-<S>``, kept registered by an agent of its own, and the host is carved for
Slurm's waiting jobs by :class:`flexmig.slurm.carver.InstanceCarver` (idle instances retired, new ones
registered, busy ones never touched); the journal's actions go to the agent of the instance node they name.

On a simulated node the demo workload is off: the node runs Slurm's jobs, and synthetic processes would make the
actuator refuse to touch the instances they sit on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from flexmig.act.service import Actuator
from flexmig.act.steps import ActionRun
from flexmig.config import Config
from flexmig.errors import FlexmigError, SlurmError
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.mqtt.events import EventFactory
from flexmig.mqtt.slurm_events import CarvingNews, node_event
from flexmig.service.planning import planner_settings
from flexmig.service.slurm_reporting import SlurmReporting
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_keys import AgentKey, agent_settings, example_node, gpu_of_action, instance_of_action
from flexmig.slurm.agent_read import SlurmRound, read_slurm
from flexmig.slurm.carver import InstanceCarver
from flexmig.slurm.change import KIND
from flexmig.slurm.claims import Claims, round_order
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.config_settings import slurm_settings
from flexmig.slurm.layout import SlurmLayout, choose_layout, configured_layout, read_inputs, with_layout
from flexmig.slurm.nodes import gpu_hosts
from flexmig.slurm.reservations import flexmig_name
from flexmig.slurm.settings import (
    gpu_node,
)
from flexmig.slurm.shared_reads import SharedReads, read_spacing
from flexmig.slurm.sitecheck import version_problem
from flexmig.wiring.actuator import ActuatorComponent
from flexmig.wiring.mqtt import MqttComponent

__all__ = ["SlurmComponent"]

log = logging.getLogger(__name__)


class SlurmHost(Protocol):
    """What the component needs of the daemon (``flexmig.daemon.Daemon`` has it)."""

    config: Config
    hostname: str


class SlurmComponent(SlurmReporting):
    """The Slurm agent of one daemon, on its actuator (:meth:`attach` is the actuator's ``on_built`` hook); with
    ``[slurm] node_per_gpu``, one agent per MIG GPU (:attr:`agents`)."""

    name = "slurm"
    restart = False

    def __init__(
        self,
        host: SlurmHost,
        actuator: ActuatorComponent,
        *,
        mqtt: MqttComponent | None = None,
        simulated: Callable[[], bool] = lambda: False,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.config = host.config
        self.actuator = actuator
        self.mqtt = mqtt
        self.simulated = simulated
        self.wall = wall
        self.clock = clock
        self.slurm_metrics = SlurmMetrics()
        self.node = host.config.slurm.node or host.config.node(lambda: host.hostname)
        self.factory = EventFactory(host.config.node(lambda: host.hostname))
        self.layout: SlurmLayout | None = None
        """The host's layout (``[slurm] layout``), chosen at :meth:`attach`; None before, or when it was refused."""
        self.per_gpu = self.per_instance = self.per_node = self.static = False
        """One node per GPU, per MIG instance (either: several nodes, each its own agent); instance nodes that are
        slurm.conf's static State=FUTURE nodes, one per MIG profile and place (set by :meth:`attach`)."""
        self.agents: dict[AgentKey, SlurmAgent] = {}
        """The agents by GPU (``node_per_gpu``: made as MIG GPUs are seen), by ``(gpu, start)``
        (``node_per_instance``: made as instances are seen), else one, under None."""
        self.carver: InstanceCarver | None = None
        """``node_per_instance``: the host's carving (made with the actuator)."""
        self.claims = Claims(max(60.0, 3 * host.config.slurm.interval_s), clock)
        self._claims_restored = False
        self.last: SlurmRound | None = None
        self._act: Actuator | None = None
        self._client: SlurmClient | None = None
        self._version_ok = False
        self._empty_at: dict[str, float] = {}
        """The GPU nodes jobs ran on at their last look, and when each was then expected to be empty (``clock``):
        the round's order."""
        self._failing: str | None = None
        self._failing_since = 0.0
        self._last_decision: dict[str, str] = {}
        self._carvings = CarvingNews()
        self._spacing = 0.0
        self._jitter = random.Random()  # noqa: S311 (spreading reads, not a secret)
        self._last_note: dict[str, str] = {}
        self._last_node_event: dict[str, tuple[str, str]] = {}
        self._wake = asyncio.Event()

    @property
    def agent(self) -> SlurmAgent | None:
        """The node's agent (``node_per_gpu``: the first GPU node's), or None before it is made."""
        return self.agents.get(None) or next(iter(self.agents.values()), None)

    # ------------------------------------------------------------------------------------------ wiring
    def attach(self, act: Actuator) -> None:
        """Make the agent on the actuator's executor (before the journal is reconciled); with ``node_per_gpu``,
        route ``slurm_reregister`` actions to the agent of their node (made when first needed)."""
        if not self._choose_layout():
            return
        cfg = self.config
        settings = slurm_settings(cfg.slurm)
        self._act = act
        self._client = SlurmClient(SlurmCommands(settings.bin_dir, settings.conf, settings.command_timeout_s))
        self._client.on_jobs_read = self.slurm_metrics.queue_read
        if self.per_node:
            act.executor.add_handler(KIND, self._dispatch)
        else:
            self.agents[None] = self._make_agent(act, None)
        if self.per_instance:
            self.carver = InstanceCarver(
                self.node,
                settings=lambda: slurm_settings(self.config.slurm),
                client=self._client,
                executor=act.executor,
                agent_for=self.agent_for_instance,
                wall=self.wall,
            )
        who = self.node
        if self.per_gpu:
            who = f"{self.node} (one dynamic node per MIG GPU: {gpu_node(self.node, 0)}, ...)"
        elif self.per_instance:
            kind = "static node of slurm.conf" if self.static else "dynamic node"
            who = f"{self.node} (one {kind} per MIG instance: {example_node(self.node, static=self.static)}, ...)"
        log.info(
            "Slurm: node %s, %s, gres.conf block in %s, GRES map %s",
            who,
            f"partitions {', '.join(settings.partitions)}" if settings.partitions else "the node's own partitions",
            settings.gres_conf,
            settings.gres_map,
        )
        if cfg.mode != "act":
            pending = [
                p
                for p in act.journal.unfinished_plans()
                for a in act.journal.actions(p)
                if a.kind == "slurm_reregister"
            ]
            if pending:
                log.warning(
                    "a re-registration of node %s was cut short (plan %s); mode %s leaves it as it is: the node may "
                    "stay drained or unregistered until flexmigd runs in mode act",
                    self.node,
                    pending[0],
                    cfg.mode,
                )

    def _choose_layout(self) -> bool:
        """Choose the host's layout (:mod:`flexmig.slurm.layout`; ``auto`` reads slurmd's version and slurm.conf)
        and say it in one line; False, after one WARNING line and a ``slurm_node`` event ``refused``, when it
        cannot work: the component then changes nothing."""
        cfg = self.config.slurm
        try:
            inputs = read_inputs(cfg, self.node) if configured_layout(cfg) == "auto" else ("", 0, "slurm.conf")
            version, declared, conf = inputs
            layout = choose_layout(cfg, version, declared, host=self.node, conf=conf)
            with_layout(cfg, layout)
        except SlurmError as exc:
            log.warning("Slurm: %s", exc)
            self._publish(node_event(self.factory, self.node, "refused", {"reason": str(exc)}))
            return False
        self.layout = layout
        self.config = self._laid_out(self.config)
        self.per_gpu = layout.kind == "gpu"
        self.per_instance = layout.kind == "instance"
        self.per_node = self.per_gpu or self.per_instance
        self.static = self.per_instance and layout.static
        log.info("Slurm layout: %s", layout.line)
        return True

    def _laid_out(self, config: Config) -> Config:
        """``config`` with its ``[slurm]`` table as the chosen layout runs it (:func:`with_layout`)."""
        if self.layout is None:
            return config
        return dataclasses.replace(config, slurm=with_layout(config.slurm, self.layout))

    def _make_agent(self, act: Actuator, key: AgentKey) -> SlurmAgent:
        node, settings = agent_settings(self.node, key, self.config.slurm)
        gpu = key[0] if isinstance(key, tuple) else key
        start = key[1] if isinstance(key, tuple) else None
        profile = key[2] if isinstance(key, tuple) and len(key) == 3 else None
        agent = SlurmAgent(
            settings,
            node,
            executor=act.executor,
            planner=planner_settings(self.config.planner),
            simulated=self.simulated(),
            wall=self.wall,
            clock=self.clock,
            on_event=lambda kind, detail: self._job_event(kind, detail, node),
            gpu=gpu,
            start=start,
            profile=profile,
        )
        agent.client.on_jobs_read = self.slurm_metrics.queue_read
        if self.per_node:  # the agent added its own runner: the journal's actions go by their node instead
            act.executor.add_handler(KIND, self._dispatch)
        return agent

    def agent_for_gpu(self, gpu: int) -> SlurmAgent:
        """GPU ``gpu``'s agent (``node_per_gpu``), made the first time."""
        agent = self.agents.get(gpu)
        if agent is None:
            assert self._act is not None, "attach comes first"
            agent = self.agents[gpu] = self._make_agent(self._act, gpu)
        return agent

    def agent_for_instance(self, gpu: int, start: int, profile: str) -> SlurmAgent:
        """The agent of the node of the instance of ``profile`` at ``start`` of GPU ``gpu`` (``node_per_instance``),
        made the first time: one per place (dynamic nodes), or per place and profile (static ones)."""
        key: AgentKey = (gpu, start, profile) if self.static else (gpu, start)
        agent = self.agents.get(key)
        if agent is None:
            assert self._act is not None, "attach comes first"
            agent = self.agents[key] = self._make_agent(self._act, key)
        return agent

    async def _dispatch(self, run: ActionRun) -> None:
        """Run a ``slurm_reregister`` action with the agent of the GPU (or instance) node its payload names."""
        node = str(run.row.payload.get("node", ""))
        if self.per_instance:
            where = instance_of_action(self.node, node, static=self.static)
            await self.agent_for_instance(*where).change.run(run, run.row.payload)
            return
        await self.agent_for_gpu(gpu_of_action(self.node, node)).change.run(run, run.row.payload)

    def reload(self, config: Config) -> None:
        """New mode, planner settings and the reloadable ``[slurm]`` keys (the rest need a restart)."""
        try:
            self.config = config = self._laid_out(config)
        except SlurmError as exc:  # layout's keys need a restart; a new path without {node} is kept for it
            log.warning("Slurm: reload: %s; the [slurm] table stays as it was until a restart", exc)
            self.config = config = dataclasses.replace(config, slurm=self.config.slurm)
        for gpu, agent in self.agents.items():
            agent.planner_settings = planner_settings(config.planner)
            _, fresh = agent_settings(self.node, gpu, config.slurm)
            agent.settings = fresh
            agent.cost = agent.registration_cost(fresh)
        self._last_decision.clear()
        self._carvings = CarvingNews()
        self._wake.set()

    # ------------------------------------------------------------------------------------------ component
    async def start(self) -> None:
        """Nothing to open: the agent is made when the actuator is built (:meth:`attach`)."""

    async def drain(self) -> None:
        """A round in flight holds the actuator's action lock: the actuator's drain waits for it."""

    async def close(self) -> None:
        """Nothing held: the agent's actions are in the actuator's journal."""

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """``flexmig_slurm_*``."""
        return (self.slurm_metrics,)

    # ------------------------------------------------------------------------------------------ loop
    def read_spacing_s(self) -> float:
        """The least time between two rounds that sdiag's counters moving asks for: the cluster's GPU hosts (as
        the last answer listed them) over ``[slurm] cluster_reads_per_s``, at least
        :data:`~flexmig.slurm.shared_reads.READ_SHARE` times what a read of the queue costs (a big queue, or a
        slurmctld slow to answer, is read less often), and at least ``probe_s``."""
        cfg = self.config.slurm
        clients = [c for c in (self._client, *(a.client for a in self.agents.values())) if c is not None]
        hosts = max((gpu_hosts(c.last_nodes) for c in clients), default=0)
        read_s = max((c.jobs_read_s for c in clients), default=0.0)
        spacing = read_spacing(hosts, read_s, reads_per_s=cfg.cluster_reads_per_s, probe_s=cfg.probe_s)
        if abs(spacing - self._spacing) > 0.1 * max(spacing, self._spacing):  # said again when it moved by a tenth
            if spacing > cfg.probe_s:
                log.info(
                    "Slurm: this node reads the queue when it moved at most every %.1f s (GPU hosts in the "
                    "cluster: %d, [slurm] cluster_reads_per_s = %g; a read takes %.2f s)",
                    spacing, hosts, cfg.cluster_reads_per_s, read_s,
                )  # fmt: skip
            self._spacing = spacing
        self.slurm_metrics.spacing(spacing)
        return spacing

    async def run(self) -> None:
        """A cheap probe every ``[slurm] probe_s``; a round when it saw something move (at most every
        :meth:`read_spacing_s`, times 1 to 1.5 at random where that is more than ``probe_s``, so that the nodes
        that saw the same move do not all read again together), when slurmd crashed, or every ``interval_s``."""
        loop = asyncio.get_running_loop()
        last_round = -float("inf")
        spacing = 0.0
        counters: tuple[int, ...] | None = None
        while True:
            woke = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.slurm.probe_s):
                    await self._wake.wait()
                    woke = True
            self._wake.clear()
            client = self._client
            if client is None or (not self.agents and not self.per_node):
                continue
            if self.actuator.act is None or self.actuator.stopping:
                continue
            due = woke or loop.time() - last_round >= self.config.slurm.interval_s
            if not due:
                try:
                    if loop.time() - last_round >= spacing:
                        seen = await client.counters()
                        due = seen != counters
                        counters = seen
                    due = due or await self._slurmd_crashed()
                except SlurmError:
                    due = loop.time() - last_round >= self.config.slurm.interval_s
                except Exception:  # a probe is a hint only; the timed round still comes
                    log.debug("Slurm probe failed", exc_info=True)
            if not due:
                continue
            last_round = loop.time()
            spacing = self.read_spacing_s()
            if spacing > self.config.slurm.probe_s:  # the nodes that saw the same move read apart from then on
                spacing *= 1.0 + 0.5 * self._jitter.random()
            try:
                await self.round()
            except Exception:  # a bug must not end the daemon; logged with its traceback
                log.exception("Slurm round failed")

    async def _slurmd_crashed(self) -> bool:
        for agent in list(self.agents.values()):
            if await agent.slurmd.state() == "crashed":
                return True
        return False

    def wake(self) -> None:
        """Run a round soon."""
        self._wake.set()

    async def round(self) -> SlurmRound | None:
        """One round under the action lock (every agent's, one after the other); the last agent's round, or None
        when Slurm could not be read (logged once, nothing changed) or refuses the setup."""
        if self._client is None:
            return None
        done: list[tuple[SlurmAgent | None, SlurmRound]] = []
        mode = self.config.mode
        async with self.actuator.action_lock:
            if self.actuator.stopping:
                return None
            try:
                client, act = self._client, self._act
                assert act is not None
                shared = SharedReads(lambda: read_slurm(client), act.executor.mig.inventory) if self.per_node else None
                if shared is not None and not await self._per_gpu_ready(shared):
                    return None
                if self.carver is not None and shared is not None:
                    done.extend(await self.carver.round(mode, shared))
                waiting = {r.name for r in (await shared.view())[2]} if shared is not None else set()
                for agent in [] if self.per_instance else self._ordered(waiting):
                    agent.taken = self.claims.taken(agent.node) if self.per_gpu else frozenset()
                    try:
                        agent.shared = None if shared is None else await shared.view()
                        agent.shared_inventory = None if shared is None else await shared.inventory()
                        rnd = await agent.round(mode)
                    finally:
                        agent.shared = None
                        agent.shared_inventory = None
                    if shared is not None:
                        shared.after(rnd)
                    self.claims.update_from(agent.node, rnd, advise=mode == "advise")
                    done.append((agent, rnd))
                    if rnd.read is not None and rnd.read.demand.running:
                        self._empty_at[agent.node] = self.clock() + agent.empty_in_s(rnd.read)
                    elif rnd.read is not None:
                        self._empty_at.pop(agent.node, None)
            except SlurmError as exc:
                self._unreachable(exc)
                return None
            except FlexmigError as exc:
                log.warning("Slurm round: %s", exc)
                return None
            finally:
                for who, rnd in done:
                    self._account(self.node if rnd.read is None or who is None else who.node, rnd, mode)
                self._account_reads([rnd for _, rnd in done])
        self._reachable()
        self.last = done[-1][1] if done else None
        return self.last

    async def _per_gpu_ready(self, shared: SharedReads) -> bool:
        """``node_per_gpu``: Slurm is 23.11 or later (else one line, and nothing is touched), and there is an
        agent for every MIG GPU NVML shows (in the round's shared inventory)."""
        assert self._client is not None
        if not self._version_ok and not self.static:  # static instance nodes work from 22.05
            cfg = await self._client.config()
            key = "node_per_instance" if self.per_instance else "node_per_gpu"
            problem = version_problem(cfg.get("SLURM_VERSION", ""), key)
            if problem is not None:
                self._node_event("refused", {"reason": problem}, self.node)
                return False
            self._version_ok = True
        if self.per_instance:
            return True
        inventory = await shared.inventory()
        for g in sorted(inventory.gpus, key=lambda g: g.index):
            if g.mig_current:
                self.agent_for_gpu(g.index)
        if not self._claims_restored:
            self._claims_restored = True
            assert self._act is not None
            n = self.claims.restore(self._act.journal.recent_actions(200), self.wall())
            if n:
                log.info("Slurm: %d pending job(s) left to the GPU nodes whose changes served them before", n)
        return True

    def _ordered(self, waiting: Collection[str] = ()) -> list[SlurmAgent]:
        """The agents in the order of a round (:func:`round_order`); ``waiting``: the names of the reservations
        Slurm has."""
        order = round_order(
            [(a.node, a.gpu) for a in self.agents.values()],
            waiting={a.node for a in self.agents.values() if flexmig_name(a.node) in waiting},
            claiming=self.claims.owners(),
            busy=self._empty_at.keys(),
            empty_at=self._empty_at,
        )
        by_node = {a.node: a for a in self.agents.values()}
        return [by_node[n] for n in order]
