"""Background tasks whose death is reported, never silent.

A task started with :func:`spawn` (a rank's watcher, a job's settling) is watched by its own done-callback: when it
ends with an exception, that exception is taken from the task at once (so asyncio never logs "Task exception was
never retrieved", which it does only when the task is garbage-collected, if ever) and handed to the event loop's
exception handler with ``FATAL_TASK`` set to the task's name. The daemon installs a handler that stops it with one
line naming the task (:class:`~flexmig.errors.BackgroundTaskError`); without one, asyncio's default handler logs the
task, the error and its traceback. A task's cancellation is no death.

Tasks that are safe to run again are restarted by their owner instead (the daemon's loops with ``restart=True``);
what is restarted and how often is the owner's policy, counted and logged there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

__all__ = ["FATAL_TASK", "cancel_and_wait", "describe", "spawn"]

#: Key of an exception-handler context that reports the death of a task started with :func:`spawn`.
FATAL_TASK = "flexmig_fatal_task"
T = TypeVar("T")


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start ``coro`` as a task named ``name`` on the running loop; its death goes to the loop's exception handler."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(_report)
    return task


def _report(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()  # retrieved now: asyncio will not complain about it later
    if exc is None:
        return
    name = task.get_name()
    task.get_loop().call_exception_handler(
        {"message": f"background task {name!r} died", "exception": exc, "task": task, FATAL_TASK: name}
    )


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task of ``tasks`` (taken once, as they are now), then wait until each has ended; a task's
    cancellation is not an error, any other exception it ended with is raised."""
    pending = list(tasks)
    for t in pending:
        t.cancel()
    for t in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await t


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for the one line that names a dead task."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
