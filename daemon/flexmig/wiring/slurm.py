"""flexmig's Slurm agent in the running daemon (``[slurm] enabled = true``): the ``slurm`` component.

:class:`SlurmComponent` is a lifecycle adapter (:mod:`flexmig.wiring.component`) over the service layer's
:class:`~flexmig.service.slurm_rounds.SlurmRounds`, which holds what the component does (the layout, the agents,
the runner of ``slurm_reregister`` actions, the probe loop and the rounds, their log lines, metrics and events):

* **built** (:meth:`~flexmig.wiring.actuator.ActuatorComponent.on_built`): :meth:`SlurmComponent.attach` chooses the
  layout and makes the agents on the actuator's executor before the journal is reconciled;
* **run**: the loop ``slurm`` (:meth:`~flexmig.service.slurm_rounds.SlurmRounds.run`);
* **reload**: mode, planner settings and the reloadable ``[slurm]`` keys;
* **metrics**: ``flexmig_slurm_*``.

On a simulated node the demo workload is off (:func:`flexmig.wiring.wire` decides): the node runs Slurm's jobs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from flexmig.act.service import Actuator
from flexmig.config import Config
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.service.slurm_agents import SlurmHost
from flexmig.service.slurm_rounds import SlurmRounds
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_read import SlurmRound
from flexmig.wiring.actuator import ActuatorComponent
from flexmig.wiring.mqtt import MqttComponent

__all__ = ["SlurmComponent", "SlurmHost"]


class SlurmComponent:
    """The Slurm agent of one daemon, on its actuator (:meth:`attach` is the actuator's ``on_built`` hook): the
    lifecycle of :attr:`rounds`, built with the actuator once it is."""

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
        self.host, self.actuator, self.mqtt = host, actuator, mqtt
        self.simulated, self.wall, self.clock = simulated, wall, clock
        self.slurm_metrics = SlurmMetrics()
        self.rounds: SlurmRounds | None = None
        """What the component does: built with the actuator (:meth:`attach`); None before, or when the actuator
        could not start (mode observe or advise: the daemon samples on, and this component waits)."""

    @property
    def agent(self) -> SlurmAgent | None:
        """The node's agent (``node_per_gpu``: the first GPU node's), or None before it is made."""
        return None if self.rounds is None else self.rounds.agent

    def attach(self, act: Actuator) -> None:
        """Build the Slurm part on ``act``: choose the layout and make the agents on its executor, before the journal
        is reconciled."""
        self.rounds = SlurmRounds(
            self.host, self.actuator, act, slurm_metrics=self.slurm_metrics, mqtt=self.mqtt,
            simulated=self.simulated, wall=self.wall, clock=self.clock,
        )  # fmt: skip
        self.rounds.prepare()

    async def start(self) -> None:
        """Nothing to open: the agent is made when the actuator is built (:meth:`attach`)."""

    async def run(self) -> None:
        """The loop ``slurm``: probes and rounds, until cancelled."""
        if self.rounds is None:
            await asyncio.Event().wait()
            return
        await self.rounds.run()

    def reload(self, config: Config) -> None:
        """New mode, planner settings and the reloadable ``[slurm]`` keys (the rest need a restart)."""
        if self.rounds is not None:
            self.rounds.reload(config)

    async def drain(self) -> None:
        """A round in flight holds the actuator's action lock: the actuator's drain waits for it."""

    async def close(self) -> None:
        """Nothing held: the agent's actions are in the actuator's journal."""

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """``flexmig_slurm_*``."""
        return (self.slurm_metrics,)

    def wake(self) -> None:
        """Run a round soon."""
        if self.rounds is not None:
            self.rounds.wake()

    async def round(self) -> SlurmRound | None:
        """One round now (:meth:`flexmig.service.slurm_rounds.SlurmRounds.round`)."""
        return None if self.rounds is None else await self.rounds.round()
