"""Losses said out loud, but not once per item: one warning per kind of loss at most every ``window_s``.

Bounded buffers drop what no longer fits (the outbox when full, events the disk refused, command results the
broker did not take in time). Every drop is counted by its owner for the metrics; :class:`DropLog` turns the drops
into log lines an operator can read: the first at once, then at most one per window for that kind, saying how many
went since the last line and in all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["DropLog"]


@dataclass
class DropLog:
    """Rate-limited warnings about drops, one stream per ``key``."""

    logger: logging.Logger
    window_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, float] = field(default_factory=dict)
    _pending: dict[str, int] = field(default_factory=dict)
    _total: dict[str, int] = field(default_factory=dict)

    def dropped(self, key: str, n: int, what: str) -> None:
        """``n`` more items of kind ``key`` were dropped; ``what`` says what and why (``outbox X full: oldest
        events dropped``). Logged now unless a line for ``key`` went out less than ``window_s`` ago."""
        if n <= 0:
            return
        self._pending[key] = self._pending.get(key, 0) + n
        self._total[key] = self._total.get(key, 0) + n
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            return
        pending, self._pending[key] = self._pending[key], 0
        self._last[key] = now
        self.logger.warning(
            "%s: %d dropped%s (%d in all since start)",
            what,
            pending,
            f" in the last {self.window_s:g} s" if last is not None else "",
            self._total[key],
        )

    def total(self, key: str) -> int:
        """Items of kind ``key`` dropped since start."""
        return self._total.get(key, 0)
