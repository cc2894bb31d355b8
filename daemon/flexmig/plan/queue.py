"""The queue discipline every policy shares: FIFO with EASY backfilling.

Jobs are considered in arrival order. The first job that cannot start (the *head*) gets a reservation: the
earliest time it could start if nothing else started, found by releasing the running jobs in the order they are
expected to end (:meth:`Placer.shadow`), and the resources it would use then. A job behind the head may start
now (backfill) if it fits and either ends before that time or leaves the head's reserved resources alone. So
small jobs fill holes but never delay the head (EASY, Lifka 1995), and a big job cannot starve.

How a job fits, what a reservation holds (GPUs, slices) and what "leaves it alone" means are the placer's: the
static, drain, flex and fluid policies differ only there, which is the point of sharing this module. Without
run-time estimates (``duration`` returns None) a backfilled job is assumed to run past the head's start.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from flexmig.plan.types import JobRequest

__all__ = ["Admission", "Placer", "Reservation", "admit"]


@dataclass(frozen=True, slots=True)
class Reservation:
    """The head ``job`` may start at ``start_s``, using ``token`` (GPUs, slices: the placer's to interpret)."""

    job: str
    start_s: float
    token: Hashable


@dataclass(frozen=True, slots=True)
class Admission:
    """What one pass of the discipline did: the jobs it started, and the head's reservation if one waits."""

    started: tuple[str, ...]
    reservation: Reservation | None


class Placer(Protocol):
    """Where jobs go under one policy. It keeps its own working state and commits what :meth:`try_place` places."""

    def shape_key(self, job: JobRequest) -> Hashable:
        """Jobs with equal keys fit or fail together (used to skip repeats within one pass)."""
        ...

    def try_place(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """Start ``job`` now if it fits, leaving ``reservation``'s resources alone when one is given."""
        ...

    def shadow(self, job: JobRequest) -> Reservation | None:
        """When and where ``job`` could start if nothing else started; None when unknown or never."""
        ...

    def exhausted(self) -> bool:
        """True when no job at all could start now (the node is full): the pass may stop early."""
        ...


def admit(
    queue: Sequence[JobRequest],
    placer: Placer,
    now_s: float,
    duration: Callable[[JobRequest], float | None],
    unblock: Callable[[JobRequest, Reservation | None], bool] | None = None,
) -> Admission:
    """Start what the discipline allows, in order.

    ``unblock`` (flex only) gets one chance at the head before it waits: it may make room by moving other jobs,
    and returns True when it started the head.
    """
    started: list[str] = []
    reservation: Reservation | None = None
    failed: set[tuple[Hashable, bool]] = set()
    for job in queue:
        key = placer.shape_key(job)
        if reservation is None:
            if (key, False) not in failed and placer.try_place(job, None):
                started.append(job.name)
                continue
            failed.add((key, False))
            if placer.exhausted():
                break
            reservation = placer.shadow(job)
            if unblock is not None and unblock(job, reservation):
                started.append(job.name)
                reservation = None
                continue
            if reservation is None:
                # The head cannot be given a start time (run times unknown, or it never fits): it does not hold
                # the queue up; later jobs are tried as if it were not there.
                reservation = Reservation(job.name, float("inf"), None)
            continue
        runs = duration(job)
        ends_first = runs is not None and now_s + runs <= reservation.start_s
        guard = None if ends_first else reservation
        fkey = (key, guard is not None)
        if fkey in failed:
            continue
        if placer.try_place(job, guard):
            started.append(job.name)
        else:
            failed.add(fkey)
            if placer.exhausted():
                break
    return Admission(tuple(started), reservation)
