"""The Slurm part of the running daemon, first half: the host's layout, its agents and the runner of its actions.

:class:`SlurmAgents` is the one runner of the journal's ``slurm_reregister`` actions (:meth:`SlurmAgents.run_action`,
handed to the actuator's executor when it is built, before its journal is reconciled: a re-registration a crash cut
short is finished at the next start). It chooses the host's layout (:mod:`flexmig.slurm.layout`, its inputs read
without blocking the event loop: :mod:`flexmig.service.slurm_layout`) at :meth:`SlurmAgents.prepare`, the Slurm
component's start or the first action the journal hands it, whichever comes first; makes the agent of each Slurm
node the host is (one, or one per MIG GPU, or one per MIG instance); and routes each action to the agent of the node
its payload names.
:class:`flexmig.service.slurm_rounds.SlurmRounds` adds the probe loop and the rounds; the wiring's
:class:`flexmig.wiring.slurm.SlurmComponent` is the lifecycle adapter over them. Log lines keep the logger
``flexmig.wiring.slurm`` (operators' filters and the docs' examples name it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import Protocol

from flexmig.act.service import Actuator
from flexmig.act.steps import ActionRun, Refused
from flexmig.config import Config
from flexmig.errors import SlurmError
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.mqtt.events import EventFactory
from flexmig.mqtt.slurm_events import CarvingNews, node_event
from flexmig.service.planning import planner_settings
from flexmig.service.slurm_layout import read_layout_inputs
from flexmig.service.slurm_reporting import FindingsOwner, SlurmReporting
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_keys import AgentKey, agent_settings, example_node, gpu_of_action, instance_of_action
from flexmig.slurm.agent_read import SlurmRound
from flexmig.slurm.carver import InstanceCarver
from flexmig.slurm.claims import Claims
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.config_settings import slurm_settings
from flexmig.slurm.layout import SlurmLayout, choose_layout, configured_layout, with_layout
from flexmig.slurm.pool import parse_pool_node
from flexmig.slurm.pool_nodes import keep_places
from flexmig.slurm.settings import gpu_node

__all__ = ["ActuatorView", "SlurmAgents", "SlurmHost"]

log = logging.getLogger("flexmig.wiring.slurm")


class SlurmHost(Protocol):
    """What the Slurm part needs of the daemon (``flexmig.daemon.Daemon`` has it)."""

    config: Config
    hostname: str


class ActuatorView(Protocol):
    """What the Slurm part needs of the actuator's runtime (:class:`~flexmig.service.actuator_runtime.ActuatorRuntime`):
    the open actuator (read when the Slurm part prepares and at each round), its action lock and the stop."""

    @property
    def act(self) -> Actuator | None:
        """The open actuator (None before its start, or when it could not start)."""

    @property
    def action_lock(self) -> asyncio.Lock:
        """Held while anything changes the node."""

    @property
    def stopping(self) -> bool:
        """True once a stop was asked."""


class SlurmAgents(SlurmReporting):
    """The layout, agents and action routing of the daemon's Slurm part (see the module docstring); with
    ``[slurm] node_per_gpu``, one agent per MIG GPU (:attr:`agents`)."""

    def __init__(
        self,
        host: SlurmHost,
        actuator: ActuatorView,
        *,
        slurm_metrics: SlurmMetrics,
        mqtt: FindingsOwner | None = None,
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
        self.slurm_metrics = slurm_metrics
        self.node = host.config.slurm.node or host.config.node(lambda: host.hostname)
        self.factory = EventFactory(host.config.node(lambda: host.hostname))
        self.layout: SlurmLayout | None = None
        """The host's layout (``[slurm] layout``), chosen at :meth:`prepare`; None before, or when it was refused."""
        self.per_gpu = self.per_instance = self.per_node = self.static = False
        """One node per GPU, per MIG instance (either: several nodes, each its own agent); instance nodes that are
        slurm.conf's static State=FUTURE nodes, one per MIG profile and place (set by :meth:`prepare`)."""
        self.agents: dict[AgentKey, SlurmAgent] = {}
        """The agents by GPU (``node_per_gpu``: made as MIG GPUs are seen), by ``(gpu, start)``
        (``node_per_instance``: made as instances are seen), else one, under None."""
        self.carver: InstanceCarver | None = None
        """``node_per_instance``: the host's carving (made with the actuator)."""
        self.claims = Claims(max(60.0, 3 * host.config.slurm.interval_s), clock)
        self._claims_restored = False
        self.last: SlurmRound | None = None
        self._prepared = False
        self._preparing = asyncio.Lock()
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

    @property
    def _act(self) -> Actuator | None:
        """The open actuator (None before its start, or when it could not start)."""
        return self.actuator.act

    async def run_action(self, run: ActionRun) -> None:
        """Run a journalled ``slurm_reregister`` action (the executor's runner of that kind, also when the journal's
        reconciliation finishes one at start): with the agent of the node the payload names. Refused when the layout
        was refused (or the actuator is not open): the action fails, saying so, and nothing is changed."""
        await self.prepare()
        if self.per_node:
            await self._dispatch(run)
            return
        agent = self.agents.get(None)
        if agent is None:
            raise Refused(f"the Slurm part of node {self.node} runs no agent (its layout was refused; see the log)")
        await agent.change.run(run, run.row.payload)

    async def prepare(self) -> None:
        """Once the actuator is open (nothing before): choose the layout and make the agents on its executor (with
        one node per GPU or instance, the agent of each node when it is first needed). Done once, at the Slurm
        component's start or at the first action the journal's reconciliation hands over, whichever comes first."""
        async with self._preparing:
            act = self._act
            if self._prepared or act is None:
                return
            self._prepared = True
            if await self._choose_layout():
                self._make_agents(act)

    def _make_agents(self, act: Actuator) -> None:
        """The client, the agent (or, with several nodes, the carver), and one line saying what the host is."""
        cfg = self.config
        settings = slurm_settings(cfg.slurm)
        self._client = SlurmClient(SlurmCommands(settings.bin_dir, settings.conf, settings.command_timeout_s))
        self._client.on_jobs_read = self.slurm_metrics.queue_read
        if not self.per_node:
            self.agents[None] = self._make_agent(act, None)
        if self.per_instance:
            self.carver = InstanceCarver(
                self.node,
                settings=lambda: slurm_settings(self.config.slurm),
                client=self._client,
                executor=act.executor,
                agent_for=self.agent_for_instance,
                wall=self.wall,
                pool_agent_for=self.agent_for_pool,
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

    async def _choose_layout(self) -> bool:
        """Choose the host's layout (:mod:`flexmig.slurm.layout`; ``auto`` reads slurmd's version and slurm.conf)
        and say it in one line; False, after one WARNING line and a ``slurm_node`` event ``refused``, when it
        cannot work: the component then changes nothing."""
        cfg = self.config.slurm
        try:
            auto = configured_layout(cfg) == "auto"
            inputs = await read_layout_inputs(cfg, self.node) if auto else ("", 0, "slurm.conf")
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

    def _make_agent(self, act: Actuator, key: AgentKey, port: int | None = None) -> SlurmAgent:
        node, settings = agent_settings(self.node, key, self.config.slurm, port=port)
        gpu = key[0] if isinstance(key, tuple) else None if isinstance(key, str) else key
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
        return agent

    def agent_for_gpu(self, gpu: int) -> SlurmAgent:
        """GPU ``gpu``'s agent (``node_per_gpu``), made the first time."""
        agent = self.agents.get(gpu)
        if agent is None:
            assert self._act is not None
            agent = self.agents[gpu] = self._make_agent(self._act, gpu)
        return agent

    def agent_for_instance(self, gpu: int, start: int, profile: str) -> SlurmAgent:
        """The agent of the node of the instance of ``profile`` at ``start`` of GPU ``gpu`` (``node_per_instance``),
        made the first time: one per place (dynamic nodes), or per place and profile (static ones)."""
        key: AgentKey = (gpu, start, profile) if self.static else (gpu, start)
        agent = self.agents.get(key)
        if agent is None:
            assert self._act is not None
            agent = self.agents[key] = self._make_agent(self._act, key)
        return agent

    def agent_for_pool(
        self, name: str, devices: frozenset[tuple[int, int]] | None, port: int | None = None
    ) -> SlurmAgent:
        """The agent of pool node ``name`` (``node_per_instance``: a node over the instances ``devices``, ``(gpu,
        start)``; None: as its GRES map says; ``port``: a dynamic node's slurmd port), made the first time."""
        agent = self.agents.get(name)
        if agent is None:
            assert self._act is not None
            agent = self.agents[name] = self._make_agent(self._act, name, port)
        keep_places(agent.supply, devices)
        return agent

    async def _dispatch(self, run: ActionRun) -> None:
        """Run a ``slurm_reregister`` action with the agent of the GPU, instance or pool node its payload names."""
        node = str(run.row.payload.get("node", ""))
        if self.per_instance and parse_pool_node(self.node, node) is not None:
            pool, port = run.row.payload.get("pool"), run.row.payload.get("port")
            agent = self.agent_for_pool(node, None if pool is None else frozenset((g, s) for g, s in pool), port)
            await agent.change.run(run, run.row.payload)
            return
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
