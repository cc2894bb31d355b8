"""Signals that arrive before the event loop (or after it) are held, not fatal.

SIGHUP's default action is to terminate the process, and ``systemctl reload`` or a log rotation's ``kill -HUP`` may
come at any moment: while flexmigd still imports its modules, reads its configuration or opens NVML, or as it exits.
:func:`hold` is the first thing flexmigd does: from then on a held signal only marks itself pending. Once the event
loop runs, the daemon installs its own handlers and :func:`take_pending` tells it whether a reload was asked for
meanwhile (it then reloads once); when the loop's handlers are removed, :func:`hold` is called again.

Signal dispositions belong to the process, so this module keeps the one piece of process state it must: the set of
signals that arrived while held.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from types import FrameType

__all__ = ["HELD", "hold", "take_pending"]

#: What :func:`hold` holds by default: SIGHUP (a reload request). SIGTERM and SIGINT keep their default action
#: until the loop is up: stopping a daemon that has not started yet is exactly what they should do.
HELD: tuple[signal.Signals, ...] = (signal.SIGHUP,)
_pending: set[int] = set()


def _mark(signum: int, _frame: FrameType | None) -> None:
    _pending.add(signum)


def hold(signals: Iterable[signal.Signals] = HELD) -> None:
    """Make each of ``signals`` a pending mark instead of its default action (call from the main thread)."""
    for sig in signals:
        signal.signal(sig, _mark)


def take_pending(sig: signal.Signals) -> bool:
    """Whether ``sig`` arrived while held since the last call; clears the mark."""
    if sig in _pending:
        _pending.discard(sig)
        return True
    return False
