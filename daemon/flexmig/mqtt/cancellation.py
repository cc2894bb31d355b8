"""Cancellation that survives Python 3.11's ``asyncio.wait_for``, for the loops that talk to the MQTT broker.

Python 3.11's ``asyncio.wait_for`` (aiomqtt waits for CONNACK, SUBACK and PUBACK through it) returns normally when
the awaited result lands in the same loop turn as a cancellation of the waiting task, swallowing the
cancellation. A loop that then waits again keeps its TaskGroup (the daemon's shutdown) waiting forever. The task
still counts the request (``Task.cancelling()``), so checking it after each such await restores it.
"""

from __future__ import annotations

import asyncio

__all__ = ["honour_cancel"]


def honour_cancel() -> None:
    """Raise CancelledError if this task was asked to stop: call it after every await that may go through
    ``asyncio.wait_for`` (an aiomqtt connect, subscribe or publish), and before waiting again."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
