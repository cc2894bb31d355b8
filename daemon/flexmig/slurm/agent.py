"""flexmig as Slurm's node agent: read the node's demand, plan its layout, and change it when that pays, keeping
the node productive until the change can happen, and never fighting the administrator.

One :meth:`SlurmAgent.round`:

1. read Slurm (``squeue --json``, ``sinfo --json``, reservations) and NVML; a Slurm that does not answer, or answers
   garbage, is a SlurmError: the caller logs it and nothing changes;
2. refuse an unsupported setup with one line (:mod:`flexmig.slurm.sitecheck`), before anything is stopped;
3. a crashed slurmd is started again at once with the GRES it had (its jobs run on; no drain, no delete), unless
   an administrator downed the node (a slurmd that registers would bring it back into service);
4. a node an administrator drained, downed, failed, rebooted or reserved is left as it is (a change waiting for it
   is abandoned);
5. make sure the node is registered with exactly the instances NVML shows;
6. in modes advise and act, plan the layout for the node *once empty* (Slurm cannot change a node's GPUs while a
   job runs on it) and weigh it (:func:`flexmig.plan.reregistration.verdict`). In mode ``act``: an idle node is
   changed at once; on a busy node the change is committed as flexmig's reservation ``flexmig-<node>``, starting
   when the running jobs are expected to have ended, by their limits (Slurm's backfill keeps starting the jobs that
   end before it), bounded by ``[slurm] drain_timeout_s``, abandoned when its demand is gone, moved earlier when jobs
   end early, and carried out (one journalled ``slurm_reregister``, :mod:`flexmig.slurm.change`) as soon as only
   hook jobs, or none, run. A site-wide limit (``[slurm] max_closed_nodes``) bounds how many nodes flexmig closes
   at once.

With ``[slurm] node_per_gpu`` (Slurm 23.11 and later) an agent manages one GPU's dynamic node (``gpu``): only that
GPU's MIG devices are its GRES, the host's other GPUs are fixed and empty in its forecast, and the pending jobs a
sibling GPU node's change serves (``taken``, set by :class:`flexmig.wiring.slurm.SlurmComponent`) are left out of
its queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from flexmig.act.executor import Executor
from flexmig.act.journal import ActionRow
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.act.records import Slot
from flexmig.act.results import PlanResult
from flexmig.clocks import Ages
from flexmig.errors import FlexmigError, PlanRejectedError, SlurmError
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.enumerate import maximal_layouts
from flexmig.mig.layout import Layout
from flexmig.nvml.types import Inventory
from flexmig.plan.reregistration import (
    DrainHolder,
    NodeNow,
    RegistrationCost,
    Verdict,
    changes_instances,
    choose,
    close_by_s,
    close_in_s,
)
from flexmig.plan.types import Plan, PlannerSettings
from flexmig.plan.waiting import ENDING, Committed, next_step
from flexmig.slurm.change import KIND, ChangeSettings, SlurmChange, admin_down, admin_hold, encode_change
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.demand import SlurmDemand, SlurmRunning, read_demand, request_name
from flexmig.slurm.gresconf import check_node_name, gres_string
from flexmig.slurm.hookcheck import hook_problem
from flexmig.slurm.instances import CarvingReport
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import SlurmReservation, flexmig_name
from flexmig.slurm.settings import SlurmSettings
from flexmig.slurm.sitecheck import (
    cgroup_problem,
    configless_problem,
    gres_conf_problem,
    node_table_problem,
    parse_cgroup_conf,
    shared_fs_problem,
    slot_problem,
    tres_problem,
)
from flexmig.slurm.slurmd import HookSlurmd, SlurmdControl, SlurmdState, SystemdSlurmd
from flexmig.slurm.squeue import SlurmJob
from flexmig.slurm.supply import Supply

__all__ = ["ExecutorMig", "SlurmAgent", "SlurmRead", "SlurmRound", "SlurmView", "make_slurmd", "read_slurm"]

log = logging.getLogger(__name__)

_CONFIG_TTL_S = 300.0
_NOT_RESPONDING_GRACE_S = 30.0  # slurmd runs but slurmctld does not hear it: wait this long, then restart it
_MAX_FILE = 4 * 1024 * 1024
_RECENT_S = 900.0  # the recent demand the layout choice matches: jobs submitted in the last 15 minutes
_MAX_SEEN = 10_000
_UNKNOWN_RUN_S = 60.0  # the run time a job without a time limit counts for in the recent demand


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


def make_slurmd(settings: SlurmSettings, node: str, commands: SlurmCommands) -> SlurmdControl:
    """The node's slurmd as ``[slurm] slurmd_control`` says: its systemd unit, or the site's hook command."""
    common: dict[str, Any] = {
        "node": node,
        "env_file": settings.slurmd_env,
        "pid_file": settings.slurmd_pid_file,
        "commands": commands,
        "extra": settings.slurmd_conf,
        "per_slice": settings.slurmd_conf_per_slice,
        "static": settings.static_nodes,
    }
    if settings.slurmd_control == "hook":
        return HookSlurmd(**common, hook=settings.slurmd_hook)
    return SystemdSlurmd(**common, unit=settings.slurmd_unit)


@dataclass(frozen=True, slots=True)
class SlurmRead:
    """One look at Slurm and NVML (and the node's slurmd)."""

    jobs: tuple[SlurmJob, ...]
    node: SlurmNode | None
    inventory: Inventory
    view: NodeView
    demand: SlurmDemand
    model: GpuModel
    registered_as: dict[str, int]
    expected: dict[str, int]
    reservations: tuple[SlurmReservation, ...] = ()
    slurmd: SlurmdState = "running"
    now_s: float = 0.0

    @property
    def in_sync(self) -> bool:
        """Slurm lists the node, responding, with exactly the instances NVML shows."""
        return self.node is not None and self.node.responding and self.registered_as == self.expected

    @property
    def mine(self) -> SlurmReservation | None:
        """flexmig's reservation on this node (a change is committed), if any."""
        name = flexmig_name(self.demand.node)
        return next((r for r in self.reservations if r.name == name), None)

    @property
    def busy(self) -> bool:
        """Jobs that are no hook jobs run on the node (a change must wait for them to end)."""
        return any(not r.movable for r in self.demand.running)


@dataclass(frozen=True, slots=True)
class SlurmRound:
    """What one round saw, planned and did; ``events`` are ``(kind, detail)`` for the fleet; ``carving``: a host
    round's carving (one node per MIG instance)."""

    read: SlurmRead | None
    plan: Plan = field(default_factory=Plan)
    verdict: Verdict | None = None
    result: PlanResult | None = None
    note: str = ""
    events: tuple[tuple[str, dict[str, Any]], ...] = ()
    carving: CarvingReport | None = None


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
        mountinfo: Path = Path("/proc/self/mountinfo"),
        gpu: int | None = None,
        start: int | None = None,
        profile: str | None = None,
    ) -> None:
        self.settings = settings
        self.node = check_node_name(node)
        self.gpu = gpu
        """The one GPU this agent's node is (``[slurm] node_per_gpu``), or None: the node is every GPU of the host."""
        self.start = start
        """With ``gpu``: the node is the one MIG instance at this memory slice of it (``[slurm] node_per_instance``;
        the agent keeps it registered, the caller decides which instances there are)."""
        self.profile = profile
        """With ``start``: the node is a static one of slurm.conf for an instance of this MIG profile only
        (``[slurm] instance_nodes = static``)."""
        self.own_reservations: frozenset[str] = frozenset()
        """Reservations of flexmig's own besides this node's (``node_per_instance``: the hold on a region of the
        host, set by the caller): not an administrator's."""
        self.shared: SlurmView | None = None
        """Slurm's jobs, nodes and reservations as a sibling GPU node's agent read them this round (set by the
        caller, used by the next :meth:`read` only, so that the GPU nodes of one host ask slurmctld once)."""
        self.shared_inventory: Inventory | None = None
        """NVML's inventory as read this round before (set by the caller, used by the next :meth:`read` only, so
        that the GPU nodes of one host ask NVML once)."""
        self.taken: frozenset[str] = frozenset()
        """Pending jobs (request names) a sibling GPU node's change serves: left out of this agent's queue (set by
        the caller before each round, :class:`flexmig.wiring.slurm.SlurmComponent`)."""
        self.executor = executor
        self.planner_settings = planner
        self.simulated = simulated
        self.wall = wall
        self.clock = clock
        self.ages = Ages(wall, clock)
        """How long ago the last re-registration was, on the monotonic clock (the journal's stamps are wall time)."""
        self.mountinfo = mountinfo
        commands = SlurmCommands(settings.bin_dir, settings.conf, settings.command_timeout_s)
        self.client = SlurmClient(commands)
        self.slurmd = slurmd or make_slurmd(settings, node, commands)
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
            gpu=gpu,
            start=start,
            profile=profile,
        )
        change = ChangeSettings(
            node,
            settings.checkpoint_dir,
            ack_timeout_s=settings.ack_timeout_s,
            close_s=settings.drain_timeout_s,
            register_timeout_s=settings.register_timeout_s,
            signal=settings.checkpoint_signal,
            static=settings.static_nodes,
        )
        self.change = SlurmChange(
            self.client, self.slurmd, self.supply, ExecutorMig(executor), change, on_event=on_event
        )
        self.on_event = on_event or (lambda kind, detail: None)
        self.cost = self.registration_cost(settings)
        self._closed_at: float | None = None
        """When (monotonic) a reservation of flexmig's last ended without its change (the node never emptied)."""
        self._config: dict[str, str] = {}
        self._config_at = -_CONFIG_TTL_S
        self._not_responding_since: float | None = None
        self._waiting = False
        self._layouts: dict[tuple[str, frozenset[str]], tuple[Layout, ...]] = {}
        self._seen: dict[str, tuple[float, str, float]] = {}
        self._hook_off: dict[tuple[int, int], str] = {}
        """(Slurm job, run) -> why its hook is off, as last seen (each is logged once)."""
        executor.add_handler(KIND, lambda run: self.change.run(run, run.row.payload))

    @staticmethod
    def registration_cost(settings: SlurmSettings) -> RegistrationCost:
        """The verdict's fixed figures from the settings."""
        return RegistrationCost(settings.reregister_s, settings.min_interval_s, settings.max_wait_s)

    # -------------------------------------------------------------------------------------------- reading
    async def read(self) -> SlurmRead:
        """Slurm's jobs, node record and reservations, NVML's inventory, slurmd's state; SlurmError when Slurm
        cannot be read."""
        shared, self.shared = self.shared, None
        inventory, self.shared_inventory = self.shared_inventory, None
        if shared is None:
            jobs, nodes, reservations = await read_slurm(self.client)
        else:
            jobs, nodes, reservations = shared
        node = next((n for n in nodes if n.name == self.node), None)
        if inventory is None:
            inventory = await self.executor.mig.inventory()
        view = NodeView.of(inventory)
        model = node_model(view)
        expected: dict[str, int] = {}
        for r in self.supply.records(inventory):
            expected[r.type] = expected.get(r.type, 0) + 1
        registered = {k: v for k, v in node.gpu_counts().items() if v} if node is not None else {}
        now = self.wall()
        demand = read_demand(
            jobs,
            node,
            self.node,
            model,
            index_map=self.supply.instances(inventory),
            now_s=now,
            partitions=self.settings.partitions,
            hook_token=self.settings.hook_token,
            hook_settle_s=self.settings.hook_settle_s,
        )
        demand = self._hooks_on(demand)
        state = await self.slurmd.state()
        return SlurmRead(jobs, node, inventory, view, demand, model, registered, expected, reservations, state, now)

    def _hooks_on(self, demand: SlurmDemand) -> SlurmDemand:
        """``demand`` with the hook jobs whose TaskProlog did not set the hook up counted as jobs that run to their
        end (:mod:`flexmig.slurm.hookcheck`): a checkpoint signal would kill such a job and lose its work. One
        warning per job and run."""
        running: list[SlurmRunning] = []
        off: dict[tuple[int, int], str] = {}
        for r in demand.running:
            why = hook_problem(self.settings.checkpoint_dir, r.job) if r.movable else None
            if why is None:
                running.append(r)
                continue
            key = (r.job.job_id, r.job.restart_count)
            off[key] = why
            if key not in self._hook_off:
                log.warning(
                    "Slurm job %d asked for the checkpoint hook, but it is not on for it (%s): it is never signalled, "
                    "and a change waits for it to end", r.job.job_id, why,
                )  # fmt: skip
            running.append(type(r)(r.job, r.instances, False, r.remaining_s, r.unknown_indices, r.elapsed_s))
        self._hook_off = off
        if all(a is b for a, b in zip(running, demand.running, strict=True)):
            return demand
        return SlurmDemand(demand.node, demand.pending, demand.pending_jobs, tuple(running), demand.ignored)

    async def setup_problem(self, read: SlurmRead) -> str | None:
        """One line when this node's Slurm setup is one flexmig refuses (:mod:`flexmig.slurm.sitecheck`)."""
        if self.clock() - self._config_at >= _CONFIG_TTL_S:
            self._config = await self.client.config()
            self._config_at = self.clock()
        cfg = self._config
        conf = self.settings.conf or Path("/etc/slurm/slurm.conf")
        why = configless_problem(conf.is_file(), str(conf), cfg.get("SlurmctldParameters", ""))
        if why is None:
            try:
                text = self.supply.gres_conf_text()
            except SlurmError as exc:
                why = f"{exc} (flexmig rewrites its block of gres.conf at every change)"
            else:
                why = gres_conf_problem(text, self.node, str(self.settings.gres_conf))
        if why is None:
            why = shared_fs_problem(PurePosixPath(self.settings.gres_conf.absolute()), _read_text(self.mountinfo))
        if why is None:
            cgroup = parse_cgroup_conf(_read_text(conf.parent / "cgroup.conf"))
            why = cgroup_problem(cfg.get("TaskPlugin", ""), cgroup, simulated=self.simulated)
        if why is None:
            why = tres_problem(cfg.get("AccountingStorageTRES", ""), (p.name for p in read.model.plain_profiles))
        if why is None and read.node is None and self.settings.static_nodes:
            why = slot_problem(self.node, await self.client.future_record(self.node), gres_string(
                self.supply.records(read.inventory)
            ))  # fmt: skip
        elif why is None and read.node is None:
            records = await self.client.node_records()
            if node_table_problem(cfg.get("MaxNodeCount", ""), records, self.node) is not None:
                self._config = await self.client.config()  # the limit as slurmctld has it now (raised meanwhile?)
                self._config_at = self.clock()
                why = node_table_problem(self._config.get("MaxNodeCount", ""), records, self.node)
        return why

    # -------------------------------------------------------------------------------------------- planning
    def node_now(self, read: SlurmRead) -> NodeNow:
        """The node for the layout choice: today's layouts, the GPUs flexmig must leave as they are (lost, another
        model, MIG off, or an instance whose processes belong to no Slurm job), the jobs on it, and its queue
        (requeued hook jobs first)."""
        view, model = read.view, read.model
        slurm_held = {i.key for r in read.demand.running for i in r.instances}
        layouts: list[Layout] = []
        fixed: set[int] = set()
        count = max(view.gpus(), default=-1) + 1
        mig_on = {g.index: bool(g.mig_current) for g in read.inventory.gpus}
        for gpu in range(count):
            lay = view.layout(gpu)
            sibling = self.gpu is not None and gpu != self.gpu  # another GPU node's: nothing of it is this node's
            if sibling or lay is None or gpu in view.lost or view.model(gpu) != model or not mig_on.get(gpu):
                fixed.add(gpu)
                layouts.append(Layout.of(model, []))
            else:
                layouts.append(lay)
        for i in view.instances:
            if i.gpu not in fixed and (i.uuid is None or i.pids is None or (i.pids and i.key not in slurm_held)):
                fixed.add(i.gpu)
        requeued = read.demand.requeued_requests(model)
        return NodeNow(
            model=model,
            layouts=tuple(layouts),
            running=_holders(read),
            queue=(*requeued, *read.demand.pending),
            fixed_gpus=frozenset(fixed),
            requeued=frozenset(r.name for r in requeued),
        )

    def candidates(self, model: GpuModel) -> Callable[[frozenset[str]], tuple[Layout, ...]]:
        """The maximal layouts of one GPU of ``model`` built from a set of profiles (remembered: enumerating them
        takes tens of milliseconds)."""

        def of(profiles: frozenset[str]) -> tuple[Layout, ...]:
            key = (model.key, profiles)
            got = self._layouts.get(key)
            if got is None:
                got = tuple(maximal_layouts(model, [model.profile(p) for p in sorted(profiles)]))
                if len(self._layouts) >= 64:
                    self._layouts.pop(next(iter(self._layouts)))
                self._layouts[key] = got
            return got

        return of

    def _recent(self) -> list[ActionRow]:
        return [row for row in self.executor.journal.recent_actions(200) if row.kind == KIND]

    def last_change_s(self) -> float | None:
        """When the last change that had to wait for jobs (a busy node) ended, from the journal (or when
        flexmig's last reservation ended without its change): in wall time now less how long ago it was on the
        monotonic clock (:class:`~flexmig.clocks.Ages`: a wall clock set back never makes the batching interval
        wait longer)."""
        for row in self._recent():
            if row.state == "done" and row.finished_s and row.payload.get("changes") and row.payload.get("busy"):
                return self.wall() - self.ages.ago(KIND, row.finished_s)
        if self._closed_at is None:
            return None
        return self.wall() - (self.clock() - self._closed_at)

    def missed_acks(self) -> set[tuple[int, int]]:
        """(Slurm job, restart count) of the hook jobs that missed an acknowledgement (from the journal): they
        are not asked again while they run, and count as jobs that end by themselves."""
        out: set[tuple[int, int]] = set()
        for row in self._recent():
            if row.state != "cancelled" or not row.error or "did not acknowledge" not in row.error:
                continue
            for step in self.executor.journal.steps(row.id):
                if step.name.startswith("await_ack:") and step.state == "failed":
                    job_id = int(step.name.split(":", 1)[1])
                    restarts = next(
                        (int(j.get("restarts", 0)) for j in row.payload.get("checkpoint", []) if j["job_id"] == job_id),
                        0,
                    )
                    out.add((job_id, restarts))
        return out

    def plan(self, read: SlurmRead) -> tuple[Plan, Verdict]:
        """The layout plan for ``read`` (the node once empty) and whether to commit to it
        (:func:`flexmig.plan.reregistration.choose`)."""
        return self.planner(read)()

    def planner(self, read: SlurmRead) -> Callable[[], tuple[Plan, Verdict]]:
        """:meth:`plan` as its inputs (read here: the journal, the recent demand) and the pure work on them, which
        a round runs on a worker thread (on an 8-GPU node the forecasts take a noticeable part of a second)."""
        node = self.node_now(read)
        now = read.now_s or self.wall()
        submitted = {r.name: r.submitted_s for r in read.demand.pending}
        last_change = self.last_change_s()
        recent = self.recent_demand()
        candidates = self.candidates(node.model)
        settings, cost, committed = self.planner_settings, self.cost, read.mine is not None

        def work() -> tuple[Plan, Verdict]:
            choice = choose(
                node,
                candidates=candidates,
                settings=settings,
                cost=cost,
                now_s=now,
                waited_s=lambda name: max(0.0, now - submitted[name]) if name in submitted else 0.0,
                last_change_s=last_change,
                committed=committed,
                recent=recent,
            )
            return choice.plan, choice.verdict

        return work

    # -------------------------------------------------------------------------------------------- acting
    async def register(self, reason: str) -> PlanResult:
        """Re-register the node with the instances it has (no instance change, no checkpoint)."""
        action = encode_change(self.node, Plan(), (), reason, 0.0)
        return await self.executor.execute_encoded([action], "slurm", (reason,))

    async def round(self, mode: str, *, plan: bool = True) -> SlurmRound:
        """One round (see the module docstring). SlurmError when Slurm cannot be read; nothing changed then. Its
        node events also go to ``on_event`` as ``slurm_node:WHAT``. ``plan=False``: steps 1-5 only (the node kept
        registered as NVML shows it; ``node_per_instance``, where the caller decides the instances)."""
        rnd = await self._round(mode, plan)
        for what, detail in rnd.events:
            self.on_event(f"slurm_node:{what}", detail)
        return rnd

    async def _round(self, mode: str, plan_it: bool = True) -> SlurmRound:
        read = await self.read()
        if self._waiting and read.mine is None:  # flexmig's reservation ended without its change
            self._closed_at = self.clock()
        self._waiting = read.mine is not None
        read = self._without_missed(_without_taken(read, self.taken))
        self._remember(read)
        problem = await self.setup_problem(read)
        if problem is not None:
            return SlurmRound(read, note=f"refused: {problem}", events=(("refused", {"reason": problem}),))
        others = [r for r in read.reservations if r.name not in self.own_reservations]
        hold = admin_hold(read.node, others, self.node)
        if read.slurmd == "crashed" and admin_down(read.node) is None:
            # A drain or a reservation survives slurmd's restart, and the node's jobs run on; a node an
            # administrator downed would come back into service (ReturnToService=2): that one is left alone.
            return await self._restart_slurmd(read, mode, "slurmd crashed")
        if hold is not None:
            return await self._leave_alone(read, mode, hold)
        if not read.in_sync:
            return await self._resync(read, mode)
        self._not_responding_since = None
        if mode == "observe" or not plan_it:  # observe reads and exports; planning is advise's and act's
            return SlurmRound(read)
        try:
            plan, v = await asyncio.to_thread(self.planner(read))  # the loop serves metrics and requests meanwhile
        except (PlanRejectedError, FlexmigError) as exc:
            return SlurmRound(read, note=f"cannot plan: {exc}")
        mine = read.mine
        if mine is not None:
            return await self._committed(read, mode, plan, v, mine)
        if mode != "act":
            return SlurmRound(read, plan, v)
        step = next_step(
            None, changes=changes_instances(plan), go=v.go, busy=read.busy, now_s=read.now_s,
            close_in_s=_close_at(read, self.cost.fixed_s),
        )  # fmt: skip
        if step.kind == "change":
            return await self._change(read, plan, v)
        if step.kind == "commit":
            return await self._commit(read, plan, v, step.start_in_s)
        return SlurmRound(read, plan, v)

    def _remember(self, read: SlurmRead) -> None:
        """Note the GPU demand of every job seen waiting for or running on the node (by submission time), for the
        recent demand the layout choice matches; forget what is older than ``_RECENT_S``."""
        for r in read.demand.pending:
            profile = r.need.profile
            if profile is None or r.name in self._seen:
                continue
            run = (r.expected_runtime_s or 2 * _UNKNOWN_RUN_S) / 2.0
            slices = read.model.profile(profile).compute_slices * r.ranks
            self._seen[r.name] = (r.submitted_s, profile, slices * run)
        for j in read.demand.running:
            name = request_name(j.job.job_id)
            if name in self._seen or not j.instances:
                continue
            limit = j.job.time_limit_s
            run = (limit or 2 * _UNKNOWN_RUN_S) / 2.0
            for inst in j.instances:
                key = f"{name}@{inst.gpu}:{inst.start}"
                self._seen[key] = (j.job.waited_since(), inst.profile.name, inst.profile.compute_slices * run)
            self._seen[name] = (j.job.waited_since(), "", 0.0)
        horizon = read.now_s - _RECENT_S
        if len(self._seen) > 4 * _MAX_SEEN or any(t < horizon for t, _, _ in self._seen.values()):
            kept = sorted(((k, v) for k, v in self._seen.items() if v[0] >= horizon), key=lambda kv: kv[1][0])
            self._seen = dict(kept[-_MAX_SEEN:])

    def recent_demand(self) -> dict[str, float]:
        """Slice-seconds asked per profile by the jobs seen in the last ``_RECENT_S`` (expected run times)."""
        out: dict[str, float] = {}
        for _, profile, work in self._seen.values():
            if profile:
                out[profile] = out.get(profile, 0.0) + work
        return out

    def empty_in_s(self, read: SlurmRead) -> float:
        """Seconds until the node is expected to be empty of its jobs, as ``read`` shows them: where a change's
        reservation would start (``node_per_gpu``: the sibling that empties first plans first)."""
        return _close_at(read, self.cost.fixed_s)

    def _without_missed(self, read: SlurmRead) -> SlurmRead:
        """The read with hook jobs that missed an acknowledgement counted as immovable."""
        missed = self.missed_acks()
        if not missed or not any((r.job.job_id, r.job.restart_count) in missed for r in read.demand.movable):
            return read
        running = tuple(
            type(r)(r.job, r.instances, False, r.remaining_s, r.unknown_indices, r.elapsed_s)
            if (r.job.job_id, r.job.restart_count) in missed
            else r
            for r in read.demand.running
        )
        d = read.demand
        demand = SlurmDemand(d.node, d.pending, d.pending_jobs, running, d.ignored)
        return SlurmRead(
            read.jobs, read.node, read.inventory, read.view, demand, read.model, read.registered_as, read.expected,
            read.reservations, read.slurmd, read.now_s,
        )  # fmt: skip

    async def _restart_slurmd(self, read: SlurmRead, mode: str, why: str) -> SlurmRound:
        """Start slurmd again with the GRES it registered (or NVML's when it never did): its jobs run on."""
        want = gres_string(self.supply.records(read.inventory))
        registered = self.slurmd.registered_conf()
        gres = want
        if registered is not None and "Gres=" in registered:
            gres = registered.rsplit("Gres=", 1)[1].split()[0]
        note = f"{why}; starting it again with Gres={gres} (its jobs run on)"
        if mode != "act":
            return SlurmRound(read, note=f"{note}: mode {mode} changes nothing")
        await self.slurmd.start(gres)
        self._not_responding_since = None
        return SlurmRound(read, note=note, events=(("slurmd_restarted", {"reason": why, "gres": gres}),))

    async def _leave_alone(self, read: SlurmRead, mode: str, why: str) -> SlurmRound:
        """An administrator holds the node: abandon flexmig's own waiting change, change nothing else."""
        events: list[tuple[str, dict[str, Any]]] = []
        if read.mine is not None and mode == "act":
            await self.client.delete_reservation(flexmig_name(self.node))
            self._waiting = False
            events.append(("change_abandoned", {"reason": why}))
        return SlurmRound(read, note=why, events=(*events, ("left_alone", {"reason": why})))

    async def _resync(self, read: SlurmRead, mode: str) -> SlurmRound:
        """Slurm's view of the node differs from NVML's: register it again, without fighting anyone."""
        node = read.node
        now = self.clock()  # a duration (not responding for how long): monotonic
        if node is not None and read.slurmd == "running" and not node.responding:
            since = self._not_responding_since = self._not_responding_since or now
            if now - since < _NOT_RESPONDING_GRACE_S:
                return SlurmRound(read, note=f"node {self.node} is {node.state}, not responding; slurmd runs: waiting")
            return await self._restart_slurmd(read, mode, f"slurmctld has not heard slurmd for {now - since:.0f} s")
        if node is None and read.slurmd == "running" and self.settings.static_nodes:
            # A static node returns to slurm.conf's State=FUTURE when slurmctld starts again (and, from 23.11,
            # at every reconfigure) while its slurmd runs on: started again, it registers with its jobs.
            return await self._restart_slurmd(read, mode, f"slurmctld no longer lists static node {self.node}")
        if node is not None and read.slurmd == "stopped" and self.slurmd.registered_conf() is not None:
            return SlurmRound(
                read,
                note=f"slurmd of node {self.node} was stopped (not by flexmig); flexmig leaves it stopped",
                events=(("left_alone", {"reason": "slurmd was stopped"}),),
            )
        why = self._out_of_sync(read)
        if mode != "act":
            return SlurmRound(read, note=f"{why}; mode {mode} changes nothing")
        if node is not None and read.demand.running:
            # Registered with other GRES while jobs run: wait for them like any change.
            v = Verdict(True, 0.0, 0.0, 0.0, why, (), _close_by(read), forced=True)
            if read.mine is None:
                return await self._commit(read, Plan(), v)
            return SlurmRound(read, note=f"{why}; waiting for its jobs to end")
        res = await self.register(why)
        return SlurmRound(read, result=res, note=why)

    async def _committed(
        self, read: SlurmRead, mode: str, plan: Plan, v: Verdict, mine: SlurmReservation
    ) -> SlurmRound:
        """A change waits (flexmig's reservation exists): abandon it, move it earlier, or carry it out."""
        if mode != "act":
            return SlurmRound(read, plan, v, note=f"a change waits in reservation {mine.name}; mode {mode} leaves it")
        step = next_step(
            Committed(mine.start_s, mine.end_s, started=mine.active(read.now_s)),
            changes=changes_instances(plan), go=v.go, busy=read.busy, now_s=read.now_s,
            close_in_s=_close_at(read, self.cost.fixed_s),
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
        :func:`_close_at`: when the node is expected to be empty), unless the site-wide limit is reached."""
        if start_in is None:
            start_in = _close_at(read, self.cost.fixed_s)
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

    def _out_of_sync(self, read: SlurmRead) -> str:
        node = read.node
        want = gres_string(self.supply.records(read.inventory))
        if node is None:
            return f"node {self.node} is not registered with Slurm; registering it with {want}"
        if not node.responding:
            return f"node {self.node} is {node.state} and not responding; registering it again with {want}"
        return f"Slurm lists node {self.node} with GPUs {read.registered_as or 'none'}, NVML shows {read.expected}"


SlurmView = tuple[tuple[SlurmJob, ...], tuple[SlurmNode, ...], tuple[SlurmReservation, ...]]
"""What one look at slurmctld returns: its jobs, nodes and reservations."""


async def read_slurm(client: SlurmClient) -> SlurmView:
    """Slurm's jobs, nodes and reservations (three commands); SlurmError when Slurm cannot be read."""
    return await client.jobs(), await client.nodes(), await client.reservations()


def _without_taken(read: SlurmRead, taken: frozenset[str]) -> SlurmRead:
    """The read without the pending jobs in ``taken`` (a sibling GPU node's change serves them)."""
    d = read.demand
    if not taken or not any(r.name in taken for r in d.pending):
        return read
    pending = tuple(r for r in d.pending if r.name not in taken)
    jobs = tuple(j for j in d.pending_jobs if request_name(j.job_id) not in taken)
    return replace(read, demand=SlurmDemand(d.node, pending, jobs, d.running, d.ignored))


def _holders(read: SlurmRead) -> tuple[DrainHolder, ...]:
    """The node's running Slurm jobs as the layout choice sees them."""
    return tuple(
        DrainHolder(
            request_name(r.job.job_id), r.compute_slices, r.remaining_s, r.movable, r.elapsed_s,
            tuple(i.key for i in r.instances),
        )
        for r in read.demand.running
    )  # fmt: skip


def _close_by(read: SlurmRead) -> float | None:
    """Seconds until the node is surely empty by its immovable jobs' limits (None: one has no limit):
    :func:`~flexmig.plan.reregistration.close_by_s` of its running jobs."""
    return close_by_s(NodeNow(read.model, (), _holders(read), ()))


def _close_at(read: SlurmRead, floor_s: float) -> float:
    """Seconds until the node is expected to be empty, never later than the limits say: where flexmig's reservation
    starts (:func:`~flexmig.plan.reregistration.close_in_s` of its running jobs). Jobs that end before it still
    start; the few that run past it close the node for the rest of their run."""
    return close_in_s(NodeNow(read.model, (), _holders(read), ()), floor_s)


def _read_text(path: Path) -> str:
    """A small local file's text ('' when it is missing or unreadable)."""
    try:
        with open(path, "rb") as f:  # noqa: PTH123 - bounded read
            return f.read(_MAX_FILE).decode("utf-8", "replace")
    except OSError:
        return ""


def describe_error(exc: SlurmError) -> str:
    """One line for the log when Slurm cannot be read."""
    return f"Slurm cannot be read ({exc}); flexmig samples on and changes nothing until it answers"
