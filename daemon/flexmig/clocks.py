"""How long ago something happened, on the monotonic clock: the wall clock is for timestamps only.

The journal stamps what it records with the wall clock (people read those times, and they must survive a restart).
Measuring a duration as ``wall() - stamp`` breaks as soon as the wall clock is set: set back an hour, a job moved a
minute ago looks moved in an hour's time, and everything that waits for it to settle waits an hour, saying
nothing. :class:`Ages` measures instead: the first time it is asked about an event (a key and its wall stamp), it
takes the event's age from the wall clock once (never below zero), and from then on lets it grow with the
monotonic clock, which no one sets. It also notices when the wall clock jumps, and says so in one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

__all__ = ["Ages"]

log = logging.getLogger(__name__)

_JUMP_S = 2.0  # a wall clock that drifts from the monotonic one by more than this between two looks was set


class Ages:
    """Ages of events stamped with the wall clock, measured on the monotonic one (see the module doc)."""

    def __init__(
        self, wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.wall = wall
        self.clock = clock
        self._seen: dict[Hashable, tuple[float, float]] = {}  # key -> (wall stamp, monotonic time of the event)
        self._last: tuple[float, float] | None = None  # (wall, monotonic) at the previous look

    def ago(self, key: Hashable, stamp: float) -> float:
        """Seconds since the event ``key`` stamped ``stamp`` (wall time); never negative, and unmoved by a wall
        clock that is set after the event was first asked about."""
        self.check()
        now = self.clock()
        seen = self._seen.get(key)
        if seen is None or seen[0] != stamp:
            age = max(0.0, self.wall() - stamp)
            seen = (stamp, now - age)
            self._seen[key] = seen
        return max(0.0, now - seen[1])

    def forget(self, keep: set[Hashable], *, kind: Hashable) -> None:
        """Drop what is known of the events ``(kind, name)`` whose name is not in ``keep`` (jobs that are gone)."""
        for key in [k for k in self._seen if isinstance(k, tuple) and k[0] == kind and k[1] not in keep]:
            del self._seen[key]

    def check(self) -> float:
        """How far the wall clock jumped since the last look (negative: set back), 0.0 when it did not; a jump is
        logged once, when it is first seen."""
        wall, mono = self.wall(), self.clock()
        last, self._last = self._last, (wall, mono)
        if last is None:
            return 0.0
        jump = (wall - last[0]) - (mono - last[1])
        if abs(jump) < _JUMP_S:
            return 0.0
        way = "back" if jump < 0 else "forward"
        log.warning(
            "the wall clock was set %s by %.0f s; flexmig measures every duration (settling, batching, timeouts) on "
            "the monotonic clock, so nothing waits longer or shorter for it", way, abs(jump),
        )  # fmt: skip
        return jump
