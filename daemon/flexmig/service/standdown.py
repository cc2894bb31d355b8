"""The ``standdown`` control request in the running daemon: restore the baseline layout, then mode observe.

The rules (which GPU is re-laid, to what, and what may be stopped) are :mod:`flexmig.act.standdown`'s; this
module reads the baseline, works the stand-down out on a fresh inventory, runs it as one journalled plan in mode
``act`` and reports before and after. ``dry_run`` only says what it would do, in any mode. Its arguments are
checked by its row of :data:`flexmig.act.operation_table.OPERATIONS`, and the daemon runs it under its action lock,
as every acting operation (:meth:`flexmig.service.control.DaemonControl.standdown_request`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, Protocol

from flexmig.act.nodeview import NodeView
from flexmig.act.service import Actuator
from flexmig.act.standdown import StandDown, plan_standdown, standdown_document
from flexmig.config import Config, Mode
from flexmig.config.migparted import load_baseline
from flexmig.errors import ConfigError, PlanRejectedError

__all__ = ["StandDownHost", "standdown_request"]


class StandDownHost(Protocol):
    """What a stand-down needs of the daemon's control (:class:`flexmig.service.control.DaemonControl`)."""

    @property
    def config(self) -> Config:
        """The configuration now."""
        ...

    @property
    def mode(self) -> Mode:
        """The mode now."""
        ...

    act: Actuator

    def set_mode(self, mode: Mode, why: str) -> None:
        """Switch the running daemon's mode."""
        ...


async def standdown_request(host: StandDownHost, args: Mapping[str, Any]) -> dict[str, Any]:
    """Answer one ``standdown`` request (checked arguments ``stop_jobs`` and ``dry_run``, both booleans), with the
    action lock held."""
    stop_jobs: bool = args["stop_jobs"]
    dry_run: bool = args["dry_run"]
    try:
        baseline = await asyncio.to_thread(load_baseline, host.config.baseline)
    except ConfigError as exc:
        raise PlanRejectedError(f"the baseline cannot be read: {exc}") from None
    if baseline is None:
        raise PlanRejectedError(
            "no baseline layout is configured: set [baseline] mig_parted_file (and mig_parted_config)"
        )
    act = host.act
    if not dry_run and host.mode != "act":
        raise PlanRejectedError(
            f"mode is {host.mode!r}: flexmig changes nothing outside mode 'act' (--dry-run shows what a "
            "stand-down would do)"
        )

    async def work_out() -> StandDown:
        inventory = await act.executor.mig.inventory()
        jobs = act.journal.jobs()
        return plan_standdown(
            NodeView.of(inventory),
            {g.index: g.mig_current for g in inventory.gpus},
            baseline.entries,
            jobs,
            {rec.name: act.supervisor.pids(rec.name) for rec in jobs},
            stop_jobs=stop_jobs,
            reconfigure_s=host.config.planner.reconfigure_s,
        )

    with contextlib.suppress(Exception):
        await act.executor.offload(act.executor.devices.prune)
    before = await work_out()
    result = None
    if not dry_run:
        if before.actions:
            result = await act.executor.execute_encoded(list(before.actions), "standdown")
        host.set_mode("observe", f"stood down to {baseline.describe()}")
        after = await work_out()
    else:
        after = before
    return standdown_document(baseline.describe(), before, after, result, dry_run=dry_run, mode=host.mode)
