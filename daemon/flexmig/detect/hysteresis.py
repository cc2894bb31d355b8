"""A two-threshold, two-duration switch, as a pure function of (state, signal, window, thresholds).

Each window reads as ``ON`` (the condition to start a finding holds), ``OFF`` (the condition to end it holds) or
``HOLD`` (in the dead band between the two thresholds). The switch turns on once ``ON`` has held without a break
for ``on_after`` seconds and off once ``OFF`` has held for ``off_after``; a ``HOLD`` window, or one of the other
sign, restarts the count. A gap in observations longer than ``max_gap`` also restarts it, so that a condition is
never said to have held while nobody looked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from flexmig.mig.fastinit import fast_init

__all__ = ["Signal", "Switch", "step"]


class Signal(enum.Enum):
    """How one window reads against the thresholds."""

    ON = "on"
    OFF = "off"
    HOLD = "hold"


@fast_init
@dataclass(frozen=True, slots=True)
class Switch:
    """State of one switch: whether it is on, since when, and since when the opposite condition has held."""

    on: bool = False
    since: float | None = None
    """When the switch last changed (None: never)."""
    pending_since: float | None = None
    """Start of the unbroken run of windows that would flip the switch (None: no such run)."""
    last_at: float | None = None
    """End of the last window seen."""


def step(
    state: Switch,
    signal: Signal,
    window_from: float,
    window_to: float,
    *,
    on_after: float,
    off_after: float,
    max_gap: float,
) -> tuple[Switch, bool]:
    """The switch after one window ``(window_from, window_to]``, and whether it flipped."""
    gap = state.last_at is not None and window_from - state.last_at > max_gap
    wanted = Signal.OFF if state.on else Signal.ON
    if signal is not wanted:
        return Switch(state.on, state.since, None, window_to), False
    pending = window_from if state.pending_since is None or gap else state.pending_since
    if window_to - pending >= (off_after if state.on else on_after):
        return Switch(not state.on, window_to, None, window_to), True  # on, since, pending_since, last_at
    return Switch(state.on, state.since, pending, window_to), False
