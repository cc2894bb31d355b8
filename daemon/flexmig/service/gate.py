"""The action gate: one lock that whoever changes the node holds, and the stop that lets nothing new begin.

A planning round, an acting control request, a stand-down and a Slurm re-registration each hold :attr:`ActionGate.lock`
while they change the node, so they never overlap and a stop (SIGTERM) waits for the one in flight the same way.
"""

from __future__ import annotations

import asyncio

__all__ = ["ActionGate"]


class ActionGate:
    """The action lock and the stop flag of one daemon."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        """Held while a plan or a mutating request runs."""
        self.stopping = False
        """True once a stop was asked: start nothing new."""
