"""Bounded waits on events, the one place tests wait: until a predicate holds, a file appears, a log holds a line, a
socket answers; and a free port to listen on.

Every wait has a bound and, past it, raises AssertionError naming what it waited for and the last value or error it
saw. A wait is never a fixed sleep standing in for an event: the poll interval only sets how soon a wait notices.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["NOT_YET", "WAIT_S", "free_port", "until", "wait_for_file", "wait_for_socket", "wait_for_text", "wait_until"]

WAIT_S = 60.0
"""The default bound: long enough for a loaded machine, short enough that a hang fails the test, not the run."""

NOT_YET: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, AssertionError)
"""Errors a probe may raise while what it looks at is not there yet (a file, a port, a line, a record)."""


def _failed(what: str, timeout_s: float, last: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float = WAIT_S,
    what: str = "the condition",
    *,
    every_s: float = 0.05,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> Any:
    """Call ``predicate()`` until it returns something truthy, and return that (typed by the caller, as the
    predicate's ``x and y`` chains are); errors in ``not_yet`` count as "not yet". AssertionError naming ``what``
    once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            got = predicate()
        except not_yet as exc:
            last = exc
        else:
            if got:
                return got
            last = got
        if time.monotonic() >= deadline:
            raise _failed(what, timeout_s, last)
        time.sleep(every_s)


async def until(
    predicate: Callable[[], object],
    timeout_s: float = WAIT_S,
    what: str = "the condition",
    *,
    every_s: float = 0.02,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> Any:
    """:func:`wait_until` on the event loop: ``predicate()`` may return an awaitable, which is awaited; the loop runs
    on between tries."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            got = predicate()
            if inspect.isawaitable(got):
                got = await got
        except not_yet as exc:
            last = exc
        else:
            if got:
                return got
            last = got
        if time.monotonic() >= deadline:
            raise _failed(what, timeout_s, last)
        await asyncio.sleep(every_s)


def wait_for_file(path: Path, timeout_s: float = WAIT_S, what: str | None = None) -> Path:
    """``path`` once it exists."""
    found: Path = wait_until(lambda: path if path.exists() else None, timeout_s, what or f"{path} to appear")
    return found


def wait_for_text(
    path: Path,
    *needles: str,
    timeout_s: float = WAIT_S,
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
) -> str:
    """The text of ``path`` (a log) once it holds every one of ``needles``; fails at once, with the log's end, if
    ``proc`` (the process writing it) exits first."""

    def holds() -> str | None:
        text = path.read_text(errors="replace") if path.exists() else ""
        if all(n in text for n in needles):
            return text
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited ({proc.returncode}) before {needles!r}:\n{text[-3000:]}")
        return None

    try:
        text: str = wait_until(holds, timeout_s, f"{needles!r} in {path.name}", not_yet=(OSError,))
        return text
    except AssertionError:
        text = path.read_text(errors="replace") if path.exists() else "(no file)"
        raise AssertionError(f"no {needles!r} in {path} within {timeout_s:g} s; it ends:\n{text[-3000:]}") from None


def wait_for_socket(address: Path | tuple[str, int], timeout_s: float = WAIT_S) -> None:
    """Until something accepts connections at ``address`` (a unix socket path, or a TCP host and port)."""

    def answers() -> bool:
        family = socket.AF_UNIX if isinstance(address, Path) else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(min(5.0, timeout_s))
            s.connect(str(address) if isinstance(address, Path) else address)
        return True

    wait_until(answers, timeout_s, f"a listener at {address}", not_yet=(OSError,))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
