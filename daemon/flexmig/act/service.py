"""The actuator assembled: journal, supervisor, executor, jobs API and control server.

The daemon builds one :class:`Actuator` in its TaskGroup::

    act = Actuator.build(mode=cfg.mode, nvml=nvml, offload=worker.call, devices=DriverProcessTable(),
                         journal_path=cfg.state.journal, logs_dir=cfg.state.directory / "logs",
                         policy=JobPolicy(cfg.jobs.allowed_dirs, default_ack_timeout_s=cfg.jobs.ack_timeout_s),
                         events=mqtt_sink)
    await act.start()                                   # reconcile journal vs NVML vs process table
    control = act.control_server(cfg.control.socket, cfg.control.socket_mode)
    tg.create_task(control.serve())                     # the jobs.* rows of flexmig.act.operation_table
    ...
    await act.execute(plan)                             # planner plans, in mode act
    await act.close()                                   # on shutdown (jobs keep running)

``python -m flexmig.actuatord`` runs the same thing standalone (see :mod:`flexmig.actuatord`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flexmig.act import jobcgroups, recovery
from flexmig.act.control import ControlServer
from flexmig.act.devices import DeviceProcessTable
from flexmig.act.durable import Durable
from flexmig.act.events import ActEvent, EventSink
from flexmig.act.executor import ActionRunner, Executor
from flexmig.act.journal import Journal, StepEvent
from flexmig.act.marked_scan import MarkedScan
from flexmig.act.migops import NvmlLike, NvmlMigOps, Offload
from flexmig.act.mode import RuntimeMode
from flexmig.act.operations import JobsApi
from flexmig.act.procs import Launcher, ProcessScanner, PsutilScanner, SubprocessLauncher
from flexmig.act.ranklogs import RankLogs
from flexmig.act.records import AckPlacement
from flexmig.act.results import PlanResult
from flexmig.act.supervisor import Supervisor
from flexmig.config import Mode
from flexmig.jobspec.spec import JobPolicy
from flexmig.plan.types import Plan, PlannerSettings

__all__ = ["Actuator"]

log = logging.getLogger("flexmig.act.supervisor")


@dataclass
class Actuator:
    """Everything ``act/`` runs, wired together. Build with :meth:`build`."""

    journal: Journal
    supervisor: Supervisor
    executor: Executor
    jobs: JobsApi
    job_cgroups: bool = True
    """Place each job in a cgroup of its own where the system allows (:mod:`flexmig.act.jobcgroups`), probed at
    :meth:`start`."""
    job_cgroups_off: str = ""
    """Why jobs get no cgroup of their own (empty when they do, or before :meth:`start`)."""

    @classmethod
    def build(
        cls,
        *,
        mode: Mode | RuntimeMode,
        nvml: NvmlLike,
        offload: Offload,
        devices: DeviceProcessTable,
        journal_path: Path,
        logs_dir: Path,
        policy: JobPolicy,
        events: EventSink,
        settings: PlannerSettings | None = None,
        launcher: Launcher | None = None,
        scanner: ProcessScanner | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        wall: Callable[[], float] = time.time,
        poll_s: float = 0.005,
        resend_s: float = 1.0,
        term_grace_s: float = 10.0,
        journal_synchronous: Literal["FULL", "NORMAL", "OFF"] = "FULL",
        ack_dir: Path | None = None,
        rank_logs: RankLogs | None = None,
        runners: Mapping[str, ActionRunner] | None = None,
    ) -> Actuator:
        """Wire the parts; nothing runs until :meth:`start`.

        ``ack_dir``: where jobs acknowledge (see :class:`~flexmig.act.records.AckPlacement`); None puts each
        acknowledgement in the job's checkpoint directory. Under the shipped systemd unit (no CAP_DAC_OVERRIDE)
        pass a directory the daemon owns that job users can reach, e.g. ``/run/flexmig/acks``. ``runners``: the
        executor's, for kinds outside ``act/`` (Slurm's), there before :meth:`start` reconciles the journal.
        """
        journal = Journal(journal_path, wall=wall, on_step=on_step, synchronous=journal_synchronous)
        scanner = scanner or MarkedScan(PsutilScanner())
        supervisor = Supervisor(
            launcher=launcher or SubprocessLauncher(), devices=devices, offload=offload, logs_dir=logs_dir,
            events=events, wall=wall, acks=AckPlacement(ack_dir), rank_logs=rank_logs, scanner=scanner,
        )  # fmt: skip
        executor = Executor(
            mode=mode,
            mig=NvmlMigOps(nvml, offload),
            supervisor=supervisor,
            journal=journal,
            events=events,
            scanner=scanner,
            devices=devices,
            offload=offload,
            wall=wall,
            poll_s=poll_s,
            resend_s=resend_s,
            term_grace_s=term_grace_s,
            runners=runners,
        )
        executor.policy = policy
        return cls(journal, supervisor, executor, JobsApi(executor, policy, settings, wall))

    async def start(self) -> dict[str, Any]:
        """Reconcile the journal with NVML and the process table (adopt ranks, finish or roll back actions)."""
        self.supervisor.acks = self.supervisor.acks.prepare()
        if self.job_cgroups and self.supervisor.cgroups is None:
            cgroups, why = await asyncio.to_thread(jobcgroups.probe)
            if cgroups is not None:
                log.info("job cgroups under %s: what a job starts is counted and stopped with it", cgroups.base)
            else:
                self.job_cgroups_off = why
                (log.warning if self.executor.mode == "act" else log.info)(
                    "no job cgroups (%s): a job's processes that leave its ranks' process groups are found by their "
                    "environment only (docs/security.md)", why,
                )  # fmt: skip
            self.supervisor.cgroups = cgroups
        return await recovery.reconcile(self.executor)

    async def execute(self, plan: Plan, origin: str = "planner") -> PlanResult:
        """Run a plan (PlanRejectedError outside mode ``act``)."""
        return await self.executor.execute(plan, origin)

    def set_mode(self, mode: Mode) -> None:
        """Change the mode (configuration reload); takes effect for the next action."""
        self.executor.mode = mode

    def set_policy(self, policy: JobPolicy) -> None:
        """Change what job specs may do (configuration reload): for submissions, and for every later launch of a
        job already in the journal."""
        self.jobs.policy = policy
        self.executor.policy = policy

    def apply(self, *, policy: JobPolicy, settings: PlannerSettings, rank_logs: RankLogs, max_pending: int) -> None:
        """Apply a (re)loaded configuration's ``[jobs]`` and ``[planner]``: the job policy (:meth:`set_policy`), the
        planner settings of the jobs API, what is kept of each rank's output for later launches, and the most jobs
        that may wait."""
        self.set_policy(policy)
        self.jobs.settings = settings
        self.supervisor.rank_logs = rank_logs
        self.jobs.max_pending = max_pending

    def serve_daemon(self, *, real_node: bool, refuse_submit: str | None) -> None:
        """Set up for the daemon (rather than ``actuatord``): a submission that finds no room now is queued for its
        planner, ``refuse_submit`` (if any) refuses submissions, and on a real node MIG device UUIDs name its
        instances alone."""
        self.jobs.queue_when_full = True
        self.jobs.refuse_submit = refuse_submit
        self.executor.device_uuids_unique = real_node

    def begin_stop(self) -> None:
        """The daemon stops: a plan already running starts none of its actions not yet begun."""
        self.executor.stopping = True

    def holds_jobs(self) -> bool:
        """Whether the journal holds a job running or waiting (a simulated node's directory then stays)."""
        return any(rec.state in ("running", "pending") for rec in self.journal.jobs())

    @property
    def durable(self) -> Durable:
        """The journal writes of actions in flight (:mod:`flexmig.act.durable`), for their metrics."""
        return self.executor.durable

    def control_server(self, path: Path, mode: int = 0o600, *, max_wait_s: float = 900.0) -> ControlServer:
        """A control server with the ``jobs.*`` operations (the operation table's rows this actuator serves); the
        daemon serves the other rows too (:class:`flexmig.service.control.DaemonControl`). A request dropped at
        its deadline (:mod:`flexmig.act.deadline`) becomes a ``request_dropped`` event."""
        ex = self.executor

        def dropped(op: str, why: str) -> None:
            ex.events.emit(ActEvent(kind="request_dropped", time_s=ex.wall(), reason=why, detail={"op": op}))

        return ControlServer(path, self.jobs.handlers(), mode=mode, max_wait_s=max_wait_s, on_dropped=dropped)

    async def close(self) -> None:
        """Stop watching ranks (they keep running) and close the journal."""
        await self.executor.close()
        await self.supervisor.close()
        self.journal.close()
