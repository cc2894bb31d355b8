"""flexmig as Slurm's node agent: read the node's demand, plan its layout, re-register it when that pays.

One :meth:`SlurmAgent.round`:

1. read Slurm (``squeue --json``, ``sinfo --json``) and NVML; a Slurm that does not answer, or answers garbage, is
   a SlurmError: the caller logs it and nothing changes;
2. make sure the node is registered with exactly the instances NVML shows (after a crash, a manual restart, or the
   first start): if not, a re-registration without instance changes (mode ``act``);
3. in modes advise and act, plan the layout for the node *once drained* (Slurm cannot change a node's GPUs while a
   job runs on it): the current instances, none held, the pending jobs of the node's partitions plus the hook jobs
   that would be requeued; instances running processes of no Slurm job stay blocked;
4. weigh the plan's whole-node drain (:func:`flexmig.plan.reregistration.verdict`) and, in mode ``act``, run one
   journalled ``slurm_reregister`` action carrying all its instance changes (:mod:`flexmig.slurm.change`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flexmig.act.executor import Executor
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.act.records import Slot
from flexmig.act.results import PlanResult
from flexmig.clocks import Ages
from flexmig.errors import FlexmigError, PlanRejectedError, SlurmError
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout
from flexmig.nvml.types import Inventory
from flexmig.plan import Planner, validate_plan
from flexmig.plan.reregistration import DrainHolder, RegistrationCost, Verdict, changes_instances, verdict
from flexmig.plan.types import Instance, JobRequest, NodeState, Plan, PlannerSettings
from flexmig.slurm.change import KIND, ChangeSettings, SlurmChange, encode_change
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.demand import SlurmDemand, read_demand, request_name
from flexmig.slurm.gresconf import check_node_name, gres_string
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.settings import SlurmSettings
from flexmig.slurm.slurmd import ProcessSlurmd, SlurmdControl
from flexmig.slurm.squeue import SlurmJob
from flexmig.slurm.supply import Supply

__all__ = ["ExecutorMig", "SlurmAgent", "SlurmRead", "SlurmRound"]

log = logging.getLogger(__name__)


class ExecutorMig:
    """The executor's own idempotent NVML steps, as :class:`~flexmig.slurm.change.MigSteps`."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    async def destroy(self, slot: Slot) -> dict[str, Any]:
        """Destroy the idle instance at ``slot`` (absent is fine)."""
        return await self.executor._destroy_idle(slot)  # the executor's own idempotent step

    async def create(self, slot: Slot) -> dict[str, Any]:
        """Create ``slot``'s instance (an identical one already there is fine)."""
        return await self.executor._create_at(slot)

    async def inventory(self) -> Inventory:
        """A fresh inventory through the NVML worker."""
        return await self.executor.mig.inventory()


@dataclass(frozen=True, slots=True)
class SlurmRead:
    """One look at Slurm and NVML."""

    jobs: tuple[SlurmJob, ...]
    node: SlurmNode | None
    inventory: Inventory
    view: NodeView
    demand: SlurmDemand
    model: GpuModel
    registered_as: dict[str, int]
    expected: dict[str, int]

    @property
    def in_sync(self) -> bool:
        """Slurm lists the node, responding, with exactly the instances NVML shows."""
        return self.node is not None and self.node.responding and self.registered_as == self.expected


@dataclass(frozen=True, slots=True)
class SlurmRound:
    """What one round saw, planned and did."""

    read: SlurmRead | None
    plan: Plan = field(default_factory=Plan)
    verdict: Verdict | None = None
    result: PlanResult | None = None
    note: str = ""


class SlurmAgent:
    """Reads node ``node``'s demand from Slurm and gives it the layout, through ``executor``'s journal."""

    def __init__(
        self,
        settings: SlurmSettings,
        node: str,
        *,
        executor: Executor,
        planner: PlannerSettings,
        simulated: bool,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        slurmd: SlurmdControl | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.node = check_node_name(node)
        self.executor = executor
        self.planner_settings = planner
        self.wall = wall
        self.ages = Ages(wall, clock)
        """How long ago the last re-registration was, on the monotonic clock (the journal's stamps are wall time)."""
        commands = SlurmCommands(settings.bin_dir, settings.conf, settings.command_timeout_s)
        self.client = SlurmClient(commands)
        self.slurmd = slurmd or ProcessSlurmd(node, settings.slurmd_pid_file, commands, settings.slurmd_conf)
        hook = {
            "checkpoint_dir": settings.checkpoint_dir,
            "signal": f"SIG{settings.checkpoint_signal}",
            "ack_wait_s": settings.ack_wait_s,
        }
        self.supply = Supply(
            node,
            settings.gres_conf,
            settings.gres_map,
            settings.dev_dir,
            settings.mig_minors,
            simulated=simulated,
            hook=hook,
        )
        change = ChangeSettings(
            node,
            settings.checkpoint_dir,
            ack_timeout_s=settings.ack_timeout_s,
            drain_timeout_s=settings.drain_timeout_s,
            register_timeout_s=settings.register_timeout_s,
            signal=settings.checkpoint_signal,
        )
        self.change = SlurmChange(
            self.client, self.slurmd, self.supply, ExecutorMig(executor), change, on_event=on_event
        )
        self.cost = RegistrationCost(settings.reregister_s, settings.min_interval_s)
        executor.add_handler(KIND, lambda run: self.change.run(run, run.row.payload))

    # -------------------------------------------------------------------------------------------- reading
    async def read(self) -> SlurmRead:
        """Slurm's jobs and node record, and NVML's inventory; SlurmError when Slurm cannot be read."""
        jobs = await self.client.jobs()
        nodes = await self.client.nodes()
        node = next((n for n in nodes if n.name == self.node), None)
        inventory = await self.executor.mig.inventory()
        view = NodeView.of(inventory)
        model = node_model(view)
        expected: dict[str, int] = {}
        for r in self.supply.records(inventory):
            expected[r.type] = expected.get(r.type, 0) + 1
        registered = {k: v for k, v in node.gpu_counts().items() if v} if node is not None else {}
        demand = read_demand(
            jobs,
            node,
            self.node,
            model,
            index_map=self.supply.instances(inventory),
            now_s=self.wall(),
            partitions=self.settings.partitions,
            hook_token=self.settings.hook_token,
            hook_settle_s=self.settings.hook_settle_s,
        )
        return SlurmRead(jobs, node, inventory, view, demand, model, registered, expected)

    # -------------------------------------------------------------------------------------------- planning
    def drained_state(self, read: SlurmRead) -> tuple[NodeState, tuple[JobRequest, ...]]:
        """The node as it will be once drained, with its queue (requeued hook jobs first), and the requeued."""
        view, model = read.view, read.model
        slurm_held = {i.key for r in read.demand.running for i in r.instances}
        layouts: list[Layout] = []
        blocked_gpus: set[int] = set()
        count = max(view.gpus(), default=-1) + 1
        mig_on = {g.index: bool(g.mig_current) for g in read.inventory.gpus}
        for gpu in range(count):
            lay = view.layout(gpu)
            if lay is None or gpu in view.lost or view.model(gpu) != model or not mig_on.get(gpu):
                blocked_gpus.add(gpu)
                layouts.append(Layout.of(model, []))
            else:
                layouts.append(lay)
        blocked = {
            i.key
            for i in view.instances
            if i.gpu not in blocked_gpus and (i.uuid is None or i.pids is None or (i.pids and i.key not in slurm_held))
        }
        requeued = read.demand.requeued_requests(model)
        state = NodeState(
            model=model,
            layouts=tuple(layouts),
            pending=(*requeued, *read.demand.pending),
            now_s=self.wall(),
            blocked=frozenset(blocked),
            blocked_gpus=frozenset(blocked_gpus),
        )
        return state, requeued

    def last_change_s(self) -> float | None:
        """When the last re-registration of this node finished, from the journal, in wall time now less how long
        ago it was on the monotonic clock (:class:`~flexmig.clocks.Ages`: a wall clock set back never makes the
        batching interval wait longer)."""
        for row in self.executor.journal.recent_actions(200):
            if row.kind == KIND and row.state == "done" and row.finished_s and row.payload.get("changes"):
                return self.wall() - self.ages.ago(KIND, row.finished_s)
        return None

    def plan(self, read: SlurmRead) -> tuple[Plan, Verdict]:
        """The layout plan for ``read`` and whether its drain pays; PlanRejectedError if the planner refuses."""
        state, requeued = self.drained_state(read)
        plan = Planner(state.model, self.planner_settings).plan(state)
        validate_plan(state, plan, self.planner_settings)
        held = {i.key for r in read.demand.running for i in r.instances}
        free = [
            Instance(g, inst.start, inst.profile)
            for g, lay in enumerate(state.layouts)
            if g not in state.blocked_gpus
            for inst in lay.instances
            if (g, inst.start) not in held and (g, inst.start) not in state.blocked
        ]
        holders = [
            DrainHolder(request_name(r.job.job_id), r.compute_slices, r.remaining_s, r.movable)
            for r in read.demand.running
        ]
        v = verdict(
            plan,
            state.pending,
            holders,
            free=free,
            settings=self.planner_settings,
            cost=self.cost,
            now_s=state.now_s,
            last_change_s=self.last_change_s(),
            requeued=frozenset(r.name for r in requeued),
        )
        return plan, v

    # -------------------------------------------------------------------------------------------- acting
    async def register(self, reason: str) -> PlanResult:
        """Re-register the node with the instances it has (no instance change, no checkpoint)."""
        action = encode_change(self.node, Plan(), (), reason, 0.0)
        return await self.executor.execute_encoded([action], "slurm", (reason,))

    async def round(self, mode: str) -> SlurmRound:
        """One round (see the module docstring). SlurmError when Slurm cannot be read; nothing changed then."""
        read = await self.read()
        if not read.in_sync:
            why = self._out_of_sync(read)
            if mode != "act":
                return SlurmRound(read, note=f"{why}; mode {mode} changes nothing")
            res = await self.register(why)
            return SlurmRound(read, result=res, note=why)
        if mode == "observe":  # observe reads and exports; planning is advise's and act's, as for flexmig's own queue
            return SlurmRound(read)
        try:
            plan, v = self.plan(read)
        except (PlanRejectedError, FlexmigError) as exc:
            return SlurmRound(read, note=f"cannot plan: {exc}")
        if not changes_instances(plan) or not v.go or mode != "act":
            return SlurmRound(read, plan, v)
        action = encode_change(self.node, plan, read.demand.movable, v.reason, v.drain_s)
        res = await self.executor.execute_encoded([action], "slurm", (*plan.notes, v.reason))
        return SlurmRound(read, plan, v, res)

    def _out_of_sync(self, read: SlurmRead) -> str:
        node = read.node
        want = gres_string(self.supply.records(read.inventory))
        if node is None:
            return f"node {self.node} is not registered with Slurm; registering it with {want}"
        if not node.responding:
            return f"node {self.node} is {node.state} and not responding; registering it again with {want}"
        return f"Slurm lists node {self.node} with GPUs {read.registered_as or 'none'}, NVML shows {read.expected}"


def describe_error(exc: SlurmError) -> str:
    """One line for the log when Slurm cannot be read."""
    return f"Slurm cannot be read ({exc}); flexmig samples on and changes nothing until it answers"
