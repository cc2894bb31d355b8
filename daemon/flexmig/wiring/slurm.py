"""flexmig's Slurm agent in the running daemon (``[slurm] enabled = true``): the ``slurm`` component.

:class:`SlurmComponent` is a lifecycle adapter (:mod:`flexmig.wiring.component`) over the service layer's
:class:`~flexmig.service.slurm_rounds.SlurmRounds`, which holds what the component does (the layout, the agents,
the runner of ``slurm_reregister`` actions, the probe loop and the rounds, their log lines, metrics and events):

* **start**: :meth:`~flexmig.service.slurm_agents.SlurmAgents.prepare` chooses the layout (slurmd's version read
  through the async command runner, never blocking the event loop) and makes the agents on the open actuator;
  the runner of ``slurm_reregister`` actions was given to the actuator's executor when :func:`flexmig.wiring.wire`
  built the parts, so the journal's reconciliation at the actuator's start already finds it;
* **run**: the loop ``slurm`` (:meth:`~flexmig.service.slurm_rounds.SlurmRounds.run`);
* **reload**: mode, planner settings and the reloadable ``[slurm]`` keys;
* **metrics**: ``flexmig_slurm_*``.

On a simulated node the demo workload is off (:func:`flexmig.wiring.wire` decides): the node runs Slurm's jobs.
"""

from __future__ import annotations

from collections.abc import Sequence

from flexmig.config import Config
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.service.slurm_rounds import SlurmRounds
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_read import SlurmRound

__all__ = ["SlurmComponent"]


class SlurmComponent:
    """The Slurm part of one daemon, on its actuator: the lifecycle of :attr:`rounds`, built with what it needs
    through its constructor (:func:`flexmig.wiring.wire`)."""

    name = "slurm"
    restart = False

    def __init__(self, rounds: SlurmRounds) -> None:
        self.rounds = rounds
        """What the component does; it changes nothing while the actuator is not open (mode observe or advise
        when it could not start: the daemon samples on, and this component waits)."""

    @property
    def agent(self) -> SlurmAgent | None:
        """The node's agent (``node_per_gpu``: the first GPU node's), or None before it is made."""
        return self.rounds.agent

    async def start(self) -> None:
        """Choose the layout and make the agents on the open actuator (nothing when it is not open)."""
        await self.rounds.prepare()

    async def run(self) -> None:
        """The loop ``slurm``: probes and rounds, until cancelled."""
        await self.rounds.run()

    def reload(self, config: Config) -> None:
        """New mode, planner settings and the reloadable ``[slurm]`` keys (the rest need a restart)."""
        self.rounds.reload(config)

    async def drain(self) -> None:
        """A round in flight holds the actuator's action lock: the actuator's drain waits for it."""

    async def close(self) -> None:
        """Nothing held: the agent's actions are in the actuator's journal."""

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """``flexmig_slurm_*``."""
        return (self.rounds.slurm_metrics,)

    def wake(self) -> None:
        """Run a round soon."""
        self.rounds.wake()

    async def round(self) -> SlurmRound | None:
        """One round now (:meth:`flexmig.service.slurm_rounds.SlurmRounds.round`)."""
        return await self.rounds.round()
