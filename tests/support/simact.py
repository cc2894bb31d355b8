"""The real Actuator on a simulated node, in this process: the part the actuator rigs share (not a test module).

:class:`SimActuator` installs the simulated node under a base directory, opens the real ``flexmig.nvml`` on it with
its worker thread, builds the Actuator (journal, supervisor, executor, jobs API) with short test timings, and takes
it all down again: every job terminated, any rank left killed, the simulated library uninstalled. The executor's
tests (``tests/act/test_act_executor.py``), the hostile-job rig (:mod:`support.hostile`) and the fuzzers' live node
(:mod:`support.actuator`) each add their own helpers around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self

from flexmig import sim
from flexmig.act.events import MemorySink
from flexmig.act.journal import StepEvent
from flexmig.act.mode import RuntimeMode
from flexmig.act.ranklogs import RankLogs
from flexmig.act.service import Actuator
from flexmig.config import Mode
from flexmig.jobspec import JobPolicy
from flexmig.nvml import Nvml, NvmlWorker
from support.jobs import kill_ranks


class SimActuator:
    """``async with SimActuator(base, "h200") as rig:`` the actuator on a simulated node under ``base``.

    ``base`` must be world-traversable when jobs run as another user. ``mode``, ``on_step``, ``ack_dir`` and
    ``rank_logs`` go to :meth:`flexmig.act.service.Actuator.build` (None: its defaults).
    """

    def __init__(
        self,
        base: Path,
        spec: str = "h200",
        *,
        mode: Mode | RuntimeMode = "act",
        events: MemorySink | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        ack_dir: Path | None = None,
        rank_logs: RankLogs | None = None,
    ) -> None:
        self.base = base
        self.spec = spec
        self.mode = mode
        self.events = events or MemorySink()
        self.on_step = on_step
        self.ack_dir = ack_dir
        self.rank_logs = rank_logs

    async def start(self) -> None:
        """Install the simulated node, open NVML on it and start a new actuator (it reconciles its journal)."""
        self.node = sim.install(self.spec, state_path=self.base / "sim.json")
        self.nvml = Nvml.open()
        self.offload = NvmlWorker()
        self.act = self.build()
        await self.act.start()

    def build(self) -> Actuator:
        """A new actuator on the same journal and node (a restart, when the old one was dropped)."""
        return Actuator.build(
            mode=self.mode,
            nvml=self.nvml,
            offload=self.offload.call,
            devices=sim.SimProcessTable(self.node),
            journal_path=self.base / "journal.sqlite3",
            logs_dir=self.base / "logs",
            policy=JobPolicy((self.base,)),
            events=self.events,
            on_step=self.on_step,
            ack_dir=self.ack_dir,
            rank_logs=self.rank_logs,
            poll_s=0.01,
            resend_s=0.3,
            term_grace_s=3.0,
        )

    async def restart(self) -> dict[str, Any]:
        """Drop the actuator without touching its jobs (as a crash would), build a new one, reconcile."""
        await self.act.close()
        self.act = self.build()
        return await self.act.start()

    async def stop(self, before_close: Callable[[], Awaitable[None]] | None = None) -> None:
        """Terminate every job and kill any rank left, then ``before_close()`` (what the caller opened on the
        actuator), close the actuator, the NVML worker and NVML, and uninstall the simulated node."""
        try:
            for rec in self.act.journal.jobs():
                await self.act.supervisor.terminate(rec.name, 3.0)
        finally:
            await asyncio.to_thread(kill_ranks, self.base / "journal.sqlite3", base=self.base)
            if before_close is not None:
                await before_close()
            await self.act.close()
            self.offload.shutdown()
            self.nvml.close()
            sim.uninstall()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def call(self, op: str, **args: Any) -> Any:
        """Run the jobs API operation ``op`` with ``args`` (as the control socket would) and return its answer."""
        return await self.act.jobs.handlers()[op](args)
