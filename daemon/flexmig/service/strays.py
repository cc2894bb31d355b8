"""Ranks of no job: processes with flexmig's markers on this node that no journalled job knows.

The journal's reconciliation at start finds the first ones; :class:`StrayWatch` looks again every planning interval
and at once after each stop and move: a process that escaped its job can appear at any time, not only while some
are already known. They are reported (``flexmig status``, ``flexmig_unknown_ranks``), never touched.

Looking again reads the environment of new processes only: the executor's scanner is a
:class:`~flexmig.act.marked_scan.MarkedScan` unless one was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from flexmig.act import recovery
from flexmig.act.service import Actuator
from flexmig.service.gate import ActionGate

__all__ = ["StrayWatch"]

log = logging.getLogger(__name__)


class StrayWatch:
    """Keeps :attr:`unknown_ranks` current on one actuator."""

    def __init__(self, act: Actuator, *, gate: ActionGate, interval_s: Callable[[], float]) -> None:
        self.act = act
        self.gate = gate
        self.interval_s = interval_s
        self.unknown_ranks: list[dict[str, Any]] | None = None
        """The ranks found the last time (None until the journal was reconciled)."""
        self._rescan = asyncio.Event()

    def rescan(self) -> None:
        """Look again now (a job stopped or moved)."""
        self._rescan.set()

    def count(self) -> int | None:
        """How many there are (None while nobody has looked)."""
        return None if self.unknown_ranks is None else len(self.unknown_ranks)

    async def run(self) -> None:
        """Look again every planning interval and after each :meth:`rescan`, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s()):
                    await self._rescan.wait()
            self._rescan.clear()
            if self.gate.stopping:
                continue
            try:
                async with self.act.executor.action_lock:  # between actions: a move's two generations are no strays
                    self.unknown_ranks = await recovery.unknown_ranks(self.act.executor)
            except Exception as exc:  # a report only
                log.warning("could not look for ranks of no journalled job again: %s", exc)
