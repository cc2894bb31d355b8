"""The Slurm part of the running daemon (``[slurm] enabled = true``): its probe loop and rounds, metrics, events.

:class:`SlurmRounds` (on :class:`~flexmig.service.slurm_agents.SlurmAgents`) is what the daemon's ``slurm``
component (:class:`flexmig.wiring.slurm.SlurmComponent`, its lifecycle adapter) runs, on the actuator's:

* **runner** of ``slurm_reregister`` actions (:meth:`~flexmig.service.slurm_agents.SlurmAgents.run_action`): given to
  the actuator's executor when it is built, before the journal is reconciled, so a re-registration cut short by a
  crash is finished at start (in mode ``act``; in the other modes the node stays as the crash left it, and the log
  says so);
* **prepare** (the component's start): the layout and the agents, once the actuator is open;
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

Which nodes the host is comes first, at :meth:`~flexmig.service.slurm_agents.SlurmAgents.prepare`
(:mod:`flexmig.slurm.layout`, ``[slurm] layout``; slurmd's version read without blocking the event loop): by default
one node per MIG instance in the form the node's Slurm supports (static nodes where slurm.conf declares this host's,
else dynamic ones from 23.11), said in one line; where neither can work, one WARNING line and a ``slurm_node`` event
``refused``, and the component changes nothing.

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
from collections.abc import Collection

from flexmig.errors import FlexmigError, SlurmError
from flexmig.service.slurm_agents import SlurmAgents, log
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_read import SlurmRound, read_slurm
from flexmig.slurm.claims import round_order
from flexmig.slurm.nodes import gpu_hosts
from flexmig.slurm.reservations import flexmig_name
from flexmig.slurm.shared_reads import SharedReads, read_spacing, round_due, shared_round
from flexmig.slurm.sitecheck import version_problem

__all__ = ["SlurmRounds"]


class SlurmRounds(SlurmAgents):
    """The probe loop and the rounds of the daemon's Slurm part (see the module docstring)."""

    def read_spacing_s(self) -> float:
        """The least time between two rounds that sdiag's counters moving asks for: the cluster's GPU hosts (as
        the last answer listed them) over ``[slurm] cluster_reads_per_s``, at least
        :data:`~flexmig.slurm.shared_reads.READ_SHARE` times what a read of the queue costs (a big queue, or a
        slurmctld slow to answer, is read less often), within ``[slurm] cluster_job_lock_share`` of slurmctld's job
        lock (by the jobs the last read listed), and at least ``probe_s``."""
        cfg = self.config.slurm
        clients = [c for c in (self._client, *(a.client for a in self.agents.values())) if c is not None]
        hosts = max((gpu_hosts(c.last_nodes) for c in clients), default=0)
        read_s = max((c.jobs_read_s for c in clients), default=0.0)
        jobs = max((c.last_job_count for c in clients), default=0)
        spacing = read_spacing(
            hosts, read_s, reads_per_s=cfg.cluster_reads_per_s, probe_s=cfg.probe_s, jobs=jobs,
            lock_share=cfg.cluster_job_lock_share,
        )  # fmt: skip
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
        that saw the same move do not all read again together), when slurmd crashed, or every ``interval_s`` (but
        no sooner than the spacing: :func:`~flexmig.slurm.shared_reads.round_due`)."""
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
            timed = self.config.slurm.interval_s
            due = woke or round_due(loop.time() - last_round, spacing_s=spacing, interval_s=timed)
            if not due:
                try:
                    if loop.time() - last_round >= spacing:
                        seen = await client.counters()
                        due = seen != counters
                        counters = seen
                    due = due or await self._slurmd_crashed()
                except SlurmError:
                    due = round_due(loop.time() - last_round, spacing_s=spacing, interval_s=timed)
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
                    rnd = await shared_round(agent, mode, shared)
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
