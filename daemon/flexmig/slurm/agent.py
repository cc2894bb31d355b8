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
from pathlib import Path, PurePosixPath
from typing import Any

from flexmig.act.executor import Executor
from flexmig.act.journal import ActionRow
from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.act.results import PlanResult
from flexmig.clocks import Ages
from flexmig.errors import FlexmigError, PlanRejectedError, SlurmError
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.enumerate import maximal_layouts
from flexmig.mig.layout import Layout
from flexmig.nvml.types import Inventory
from flexmig.plan.reregistration import (
    NodeNow,
    RegistrationCost,
    Verdict,
    changes_instances,
    choose,
)
from flexmig.plan.types import Plan, PlannerSettings
from flexmig.plan.waiting import next_step
from flexmig.slurm.agent_build import make_change, make_slurmd, make_supply
from flexmig.slurm.agent_commit import CommitSteps
from flexmig.slurm.agent_read import (
    SlurmRead,
    SlurmRound,
    SlurmView,
    close_at,
    close_by,
    holders,
    read_slurm,
    read_text,
    without_taken,
)
from flexmig.slurm.change import KIND, encode_change
from flexmig.slurm.change_admin import admin_down, admin_hold
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.demand import SlurmDemand, SlurmRunning, read_demand, request_name
from flexmig.slurm.gresconf import check_node_name, gres_string
from flexmig.slurm.hookcheck import hook_problem
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
from flexmig.slurm.slurmd import SlurmdControl

__all__ = ["SlurmAgent"]

log = logging.getLogger(__name__)

_CONFIG_TTL_S = 300.0
_NOT_RESPONDING_GRACE_S = 30.0  # slurmd runs but slurmctld does not hear it: wait this long, then restart it
_RECENT_S = 900.0  # the recent demand the layout choice matches: jobs submitted in the last 15 minutes
_MAX_SEEN = 10_000
_UNKNOWN_RUN_S = 60.0  # the run time a job without a time limit counts for in the recent demand


class SlurmAgent(CommitSteps):
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
        self.supply = make_supply(settings, node, simulated=simulated, gpu=gpu, start=start, profile=profile)
        self.change = make_change(
            settings, node, client=self.client, slurmd=self.slurmd, supply=self.supply, executor=executor,
            on_event=on_event,
        )  # fmt: skip
        self.on_event = on_event or (lambda kind, detail: None)
        self.cost = self.registration_cost(settings)
        self._init_memory()

    def _init_memory(self) -> None:
        """What the agent remembers from round to round (all empty at first)."""
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
            why = shared_fs_problem(PurePosixPath(self.settings.gres_conf.absolute()), read_text(self.mountinfo))
        if why is None:
            cgroup = parse_cgroup_conf(read_text(conf.parent / "cgroup.conf"))
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
            running=holders(read),
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
        read = self._without_missed(without_taken(read, self.taken))
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
            close_in_s=close_at(read, self.cost.fixed_s),
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
        return close_at(read, self.cost.fixed_s)

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
            v = Verdict(True, 0.0, 0.0, 0.0, why, (), close_by(read), forced=True)
            if read.mine is None:
                return await self._commit(read, Plan(), v)
            return SlurmRound(read, note=f"{why}; waiting for its jobs to end")
        res = await self.register(why)
        return SlurmRound(read, result=res, note=why)

    def _out_of_sync(self, read: SlurmRead) -> str:
        node = read.node
        want = gres_string(self.supply.records(read.inventory))
        if node is None:
            return f"node {self.node} is not registered with Slurm; registering it with {want}"
        if not node.responding:
            return f"node {self.node} is {node.state} and not responding; registering it again with {want}"
        return f"Slurm lists node {self.node} with GPUs {read.registered_as or 'none'}, NVML shows {read.expected}"


