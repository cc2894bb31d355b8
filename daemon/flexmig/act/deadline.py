"""A control request's deadline: past it, the request is dropped before it changes anything.

A client waits so long for its answer (``flexmig jobs --timeout``, 900 s by default) and then gives up, telling its
user the request failed; a request that then ran anyway, minutes later, would do what nobody is waiting for any
more. So a request carries the client's own wait (``deadline_s``, relative, measured from when the daemon reads the
request, as gRPC's ``grpc-timeout`` is), the daemon caps it (``control.max_wait_s``, which is also the deadline of
a request that states none), and a request that has not *begun* by then is dropped: it answers
``RequestExpiredError``, one warning line and a ``request_dropped`` event say so, and nothing was changed.

*Begun* is the moment the request first changes something: the executor journals its plan (after waiting for the
action in flight), or a submission writes its queued job. That is where :func:`begin` is called; past that point a
request runs to its end like any action, and the client is told it began (the control socket's ``{"begun": true}``
line), so it knows to wait for the end rather than give up. Until then the request is cancelled at its deadline
wherever it waits (a lock, the NVML thread), so its client hears why before it gives up; what it did before
beginning only read.

The deadline travels with the request's task (a :class:`contextvars.ContextVar`), so the code between the socket
and the executor passes nothing along; outside a request (the planner's rounds, recovery) :func:`begin` does
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from flexmig.errors import RequestExpiredError

__all__ = ["Deadline", "RequestExpiredError", "begin", "within"]


@dataclass
class Deadline:
    """Request ``op`` read at ``received`` (monotonic seconds) may begin until ``wait_s`` later; ``began`` tells its
    client when it does."""

    op: str
    wait_s: float
    received: float
    began: Callable[[], None] | None = None
    clock: Callable[[], float] = time.monotonic
    disarm: Callable[[], None] | None = None
    """Stops the timer that cancels the request at its deadline (set by whoever armed it)."""
    _begun: bool = field(default=False, init=False)

    @property
    def begun(self) -> bool:
        """The request has begun (and runs to its end)."""
        return self._begun

    def expired(self) -> RequestExpiredError:
        """The error of this request, dropped at its deadline."""
        waited = self.clock() - self.received
        return RequestExpiredError(
            f"{self.op} dropped: it could not begin within {self.wait_s:g} s, its client's deadline (it waited "
            f"{waited:.1f} s for the work before it); nothing was done"
        )

    def begin(self) -> None:
        """The request starts to change the node now: RequestExpiredError if its deadline passed, otherwise (the
        first time) stop the deadline's timer and tell the client it began."""
        if self._begun:
            return
        if self.clock() - self.received > self.wait_s:
            raise self.expired()
        self._begun = True
        if self.disarm is not None:
            self.disarm()
        if self.began is not None:
            self.began()


_current: ContextVar[Deadline | None] = ContextVar("flexmig_request_deadline", default=None)


def begin() -> None:
    """Called where a request first changes something: raises RequestExpiredError past the request's deadline;
    nothing outside a request."""
    deadline = _current.get()
    if deadline is not None:
        deadline.begin()


@contextmanager
def within(deadline: Deadline) -> Iterator[Deadline]:
    """Run the ``with`` body (one request's handler) under ``deadline``."""
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)
