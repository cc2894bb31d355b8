"""Bounded ring buffers of timed samples, and the window statistics read from them.

Every MIG instance gets a few of these (SM activity, memory used). They are bounded twice: by a fixed number of
points (so a daemon that runs for months holds the same memory as one that runs for minutes) and by the window
the reader asks for (so a late sweep never mixes old and new). Unavailable readings are simply not appended: a
window over points that were never measured is ``None``, never a row of zeros.

Time is passed in (monotonic seconds); nothing here reads a clock.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from dataclasses import dataclass

from flexmig.mig.fastinit import fast_init

__all__ = ["RingBuffer", "WindowStats", "capacity_for"]


@fast_init
@dataclass(frozen=True, slots=True)
class WindowStats:
    """Statistics of the points of one ring buffer that fall in the last ``seconds`` before ``now``.

    ``span_s`` is how much time the points actually cover (last minus first); a window that just started has a
    short span, which readers such as the detector use to refuse judging an instance on two seconds of data.
    """

    seconds: float
    count: int
    span_s: float
    mean: float
    min: float
    max: float
    p95: float
    last: float


def capacity_for(window_s: float, interval_s: float, slack: int = 2) -> int:
    """How many points a buffer needs to hold ``window_s`` seconds sampled every ``interval_s`` seconds."""
    if window_s <= 0 or interval_s <= 0:
        raise ValueError(f"window ({window_s}) and interval ({interval_s}) must be positive")
    return math.ceil(window_s / interval_s) + slack


class RingBuffer:
    """The last ``capacity`` (time, value) points, oldest first; appending beyond capacity drops the oldest.

    Two preallocated arrays of doubles used circularly: 16 bytes a point whatever the values, so an hour of
    one-second history costs 56 KiB per quantity and instance, fixed at creation.
    """

    __slots__ = ("_cap", "_head", "_last", "_run_since", "_size", "_times", "_values")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ring buffer capacity must be at least 1, not {capacity}")
        self._cap = capacity
        self._times = array("d", bytes(8 * capacity))
        self._values = array("d", bytes(8 * capacity))
        self._head = 0  # where the next point goes
        self._size = 0
        self._run_since = math.inf  # time of the first point of the run of equal values that ends the buffer
        self._last: WindowStats | None = None  # the last window of such a run, given again while it still holds

    @property
    def capacity(self) -> int:
        """The most points this buffer holds."""
        return self._cap

    def __len__(self) -> int:
        return self._size

    def append(self, t: float, value: float) -> None:
        """Add a point. Time must not go backwards (a monotonic clock); a point at the same time replaces the last.

        NaN is refused: it would poison every mean computed after it, and it is never a real reading.
        """
        if math.isnan(value):
            raise ValueError("NaN is not a sample; leave unavailable readings out")
        if self._size:
            last_i = (self._head - 1) % self._cap
            last = self._times[last_i]
            if t < last:
                raise ValueError(f"sample time {t} is before the previous one ({last})")
            if value != self._values[last_i]:
                self._run_since = t  # a new run (a replaced point starts one too: shorter than it may be, never longer)
            if t == last:
                self._values[last_i] = value
                return
        else:
            self._run_since = t
        self._times[self._head] = t
        self._values[self._head] = value
        self._head = (self._head + 1) % self._cap
        if self._size < self._cap:
            self._size += 1

    def latest(self) -> tuple[float, float] | None:
        """The newest (time, value), or None when empty."""
        if not self._size:
            return None
        i = (self._head - 1) % self._cap
        return self._times[i], self._values[i]

    def window(self, now: float, seconds: float) -> WindowStats | None:
        """Mean, min, max, p95 (nearest rank) and last value over ``(now - seconds, now]``; None if empty.

        The times of a buffer never go down, so the window's points are found by bisection in the (at most two)
        parts the ring holds, and the statistics are computed on array slices: no Python loop over the points. When
        every point in the window has the newest value (a reading that does not change), the figures are that value,
        and the same window as last time is given again while its count and span hold.
        """
        if seconds <= 0:
            raise ValueError(f"window must be positive, not {seconds}")
        start = now - seconds
        times, values, cap, size, head = self._times, self._values, self._cap, self._size, self._head
        one = size if size < cap or head == 0 else head if times[cap - 1] <= start else 0
        if one:  # the window's points lie in [0, one): the ring has not wrapped, or they are all past the wrap
            a = bisect_right(times, start, 0, one)
            b = bisect_right(times, now, a, one)
            if a >= b:
                return None
            oldest_t, newest_t, count, last = times[a], times[b - 1], b - a, values[b - 1]
            if oldest_t >= self._run_since and newest_t == times[(head - 1) % cap]:
                return self._constant(seconds, count, newest_t - oldest_t, last)
            vals = values[a:b]
        else:
            spans = []
            for lo, hi in ((head, cap), (0, head)):  # oldest part first
                a = bisect_right(times, start, lo, hi)
                b = bisect_right(times, now, a, hi)
                if a < b:
                    spans.append((a, b))
            if not spans:
                return None
            oldest_t, newest_t = times[spans[0][0]], times[spans[-1][1] - 1]
            count, last = sum(b - a for a, b in spans), values[spans[-1][1] - 1]
            if oldest_t >= self._run_since and newest_t == times[(head - 1) % cap]:
                return self._constant(seconds, count, newest_t - oldest_t, last)
            vals = values[spans[0][0] : spans[0][1]]
            if len(spans) > 1:
                vals += values[spans[1][0] : spans[1][1]]
        ordered = sorted(vals)
        return WindowStats(
            seconds,
            count,
            newest_t - oldest_t,
            math.fsum(vals) / count,
            ordered[0],
            ordered[-1],
            ordered[max(1, math.ceil(0.95 * count)) - 1],
            last,
        )

    def _constant(self, seconds: float, count: int, span: float, value: float) -> WindowStats:
        """The window of ``count`` points all of ``value``, over ``span`` seconds."""
        last = self._last
        if (
            last is not None
            and last.last == value
            and last.count == count
            and last.span_s == span
            and last.seconds == seconds
            and last.mean == value
        ):
            return last
        self._last = WindowStats(seconds, count, span, value, value, value, value, value)
        return self._last
