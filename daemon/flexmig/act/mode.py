"""The daemon's mode while it runs: one :class:`RuntimeMode`, shared by everything that reads it.

The configuration names the mode at start and at each reload, a stand-down switches to ``observe`` until the next
reload, and the executor, the jobs API, the planning loop, the status document and the MQTT publisher all read it.
They hold this one object instead of copies synced by hand; those that must react to a change (the planning loop
forgets the plan it last published, the MQTT publisher tags its events) are told by :meth:`RuntimeMode.on_change`.
"""

from __future__ import annotations

from collections.abc import Callable

from flexmig.config import Mode

__all__ = ["RuntimeMode"]


class RuntimeMode:
    """The mode now (``observe``, ``advise`` or ``act``), changed by :meth:`set` alone."""

    __slots__ = ("_listeners", "_value")

    def __init__(self, mode: Mode) -> None:
        self._value: Mode = mode
        self._listeners: list[Callable[[Mode, Mode], None]] = []

    @property
    def value(self) -> Mode:
        """The mode now."""
        return self._value

    def set(self, mode: Mode) -> Mode:
        """Switch to ``mode``; returns the mode before. Each listener hears ``(old, new)`` when it changed."""
        old, self._value = self._value, mode
        if old != mode:
            for listener in self._listeners:
                listener(old, mode)
        return old

    def on_change(self, listener: Callable[[Mode, Mode], None]) -> None:
        """Call ``listener(old, new)`` after each change."""
        self._listeners.append(listener)

    def __repr__(self) -> str:
        return f"RuntimeMode({self._value!r})"
