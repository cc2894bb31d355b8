"""The queue discipline every policy shares: FIFO with EASY backfilling (the default), or greedy backfilling.

Jobs are considered in arrival order.

* **EASY** (Lifka 1995; what ``flexmigd`` does): the first job that cannot start (the *head*) gets a reservation:
  the earliest time ``T`` it could start if nothing else started, found by releasing the running jobs in the order
  they are expected to end, every job that ends at ``T`` together (:meth:`Placer.shadow`). A job behind the head
  may start now (backfill) if it fits and either ends by ``T`` or leaves the head able to start at ``T`` with it
  still running. So small jobs fill holes but never delay the head, and a big job cannot starve.
* **greedy**: no reservation; every job that fits starts, in arrival order. Holes are filled best, and jobs that
  need much of the node at once (multi-GPU jobs) can wait without bound while smaller ones keep arriving.

Under both, malleable jobs that could not start at their nominal shape may then start *narrow* on what the pass
left, in arrival order (:meth:`Placer.try_narrow`): a malleable job takes only capacity no job before it in the
queue could use now, so it never keeps a rigid job from starting, yet under EASY its reservation may be a narrow
one (what it needs to start at all), which is what keeps it from waiting without bound.

How a job fits, what a reservation holds and what "the head still fits at ``T``" means are the placer's: the
static, drain, flex, fluid and repack policies differ only there, which is the point of sharing this module.
Without run-time estimates a backfilled job is assumed to run past the head's start.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from flexmig.plan.types import DISCIPLINES, Discipline, JobRequest

__all__ = ["DISCIPLINES", "Admission", "Discipline", "Placer", "Reservation", "admit"]

_YIELD_TRIES = 4  # later blocked jobs per pass that may have larger malleable jobs shrink for them


@dataclass(frozen=True, slots=True)
class Reservation:
    """The head ``job`` may start at ``start_s``, using ``token`` (GPUs, slices: the placer's to interpret).

    ``request`` is the head itself, so a placer can check that it still fits at ``start_s`` with a backfilled job.
    """

    job: str
    start_s: float
    token: Hashable
    request: JobRequest | None = None


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
        """Start ``job`` now if it fits; with ``reservation``, only if it ends by the head's start or the head
        still fits then with it running."""
        ...

    def try_narrow(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """Start the malleable ``job`` now below its nominal compute, on what is left, if that pays; with
        ``reservation``, only if the head still fits at its start (False for policies without malleable jobs)."""
        ...

    def shadow(self, job: JobRequest) -> Reservation | None:
        """When and where ``job`` could start if nothing else started (for a malleable job, possibly narrow);
        None when unknown or never."""
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
    *,
    discipline: Discipline = "easy",
    yield_to: Callable[[JobRequest, Reservation | None], bool] | None = None,
) -> Admission:
    """Start what the discipline allows, in order.

    ``unblock`` (flex only) gets one chance at the first job that cannot start: it may make room by moving other
    jobs, and returns True when it started that job. ``yield_to`` (flex only) gets a chance at a few of the later
    jobs that cannot start: it may shrink larger malleable jobs for them, keeping the head's reservation.
    ``duration`` (a job's run time at its nominal shape, or a bound) only sorts backfill candidates into those that
    end before the head's start and those that do not, to skip repeats; the placer decides on the shape it actually
    places.
    """
    run = _Pass(placer, now_s, duration, unblock=unblock, discipline=discipline, yield_to=yield_to)
    for job in queue:
        key = placer.shape_key(job)
        reservation = run.reservation
        if run.unreserved(job, key) if reservation is None else run.reserved(job, key, reservation):
            break  # the node is full: no later job could start
    _start_narrow(run.waiting, placer, run.reservation, run.started)
    return Admission(tuple(run.started), run.reservation)


class _Pass:
    """One pass of :func:`admit` over the queue: the jobs started and left waiting, the head's reservation once
    one is set, and what failed (to skip repeats). :meth:`unreserved` and :meth:`reserved` each take one job and
    return True when the pass may stop (the placer is exhausted)."""

    def __init__(
        self,
        placer: Placer,
        now_s: float,
        duration: Callable[[JobRequest], float | None],
        *,
        unblock: Callable[[JobRequest, Reservation | None], bool] | None,
        discipline: Discipline,
        yield_to: Callable[[JobRequest, Reservation | None], bool] | None,
    ) -> None:
        self._placer = placer
        self._now_s = now_s
        self._duration = duration
        self._unblock = unblock
        self._discipline = discipline
        self._yield_to = yield_to
        self._yields = _YIELD_TRIES if yield_to is not None else 0
        self._failed = _Failures()
        self._blocked = False
        self.started: list[str] = []
        self.waiting: list[JobRequest] = []
        self.reservation: Reservation | None = None

    def unreserved(self, job: JobRequest, key: Hashable) -> bool:
        """Before any reservation (EASY until the head, greedy throughout): start ``job`` if it fits; the first
        job that does not is the head, later ones (greedy) get a chance to have larger malleable jobs yield."""
        if not self._failed.skips((key, False), job) and self._placer.try_place(job, None):
            self.started.append(job.name)
            return False
        self._failed.add((key, False), job)
        if not self._blocked:
            self._head(job)
            return False
        # greedy: only the first blocked job gets a look-ahead and a chance to unblock
        if self._yielded(job, None):
            return False
        self.waiting.append(job)
        return self._placer.exhausted()

    def _head(self, job: JobRequest) -> None:
        """The first job that cannot start: a chance to make room for it, else (EASY) its reservation."""
        self.waiting.append(job)
        self._blocked = True
        placer = self._placer
        shadow = placer.shadow(job) if self._discipline == "easy" or self._unblock is not None else None
        if self._unblock is not None and self._unblock(job, shadow):
            self.started.append(job.name)
            self.waiting.pop()
            self._blocked = False
            return
        if self._discipline == "greedy":
            return
        # The head cannot be given a start time (run times unknown, or it never fits): it does not hold the
        # queue up; later jobs are tried as if it were not there.
        self.reservation = shadow or Reservation(job.name, float("inf"), None, job)

    def reserved(self, job: JobRequest, key: Hashable, reservation: Reservation) -> bool:
        """Behind the head (EASY): backfill ``job`` if it fits without delaying the head's start."""
        runs = self._duration(job)
        short = runs is not None and self._now_s + runs <= reservation.start_s
        fkey = (key, not short)
        if self._failed.skips(fkey, job):
            self.waiting.append(job)
            return False
        if self._placer.try_place(job, reservation):
            self.started.append(job.name)
            return False
        if self._yielded(job, reservation):
            return False
        self.waiting.append(job)
        self._failed.add(fkey, job)
        return self._placer.exhausted()

    def _yielded(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """One of the few later blocked jobs that may have larger malleable jobs shrink for it: True if it started."""
        if self._yields <= 0 or self._yield_to is None:
            return False
        self._yields -= 1
        if not self._yield_to(job, reservation):
            return False
        self.started.append(job.name)
        return True


def _start_narrow(
    waiting: Sequence[JobRequest], placer: Placer, reservation: Reservation | None, started: list[str]
) -> None:
    """Malleable jobs still waiting may start narrow on what the others left, in order (the head first: its
    reservation may be a narrow one that holds what it needs)."""
    narrowed = _Failures()
    for job in waiting:
        if placer.exhausted():
            break
        key = placer.shape_key(job)
        if narrowed.skips(key, job):
            continue
        if placer.try_narrow(job, reservation):
            started.append(job.name)
        else:
            narrowed.add(key, job)


class _Failures:
    """Jobs that failed in this pass, to skip the ones that would fail the same way.

    A rigid job fails or fits by its shape alone: once one fails, every later one of that shape is skipped. Whether
    an elastic or malleable job spreads or starts narrow also depends on its run time, and a longer job gains less
    from either: so a later one of that shape is skipped only if it runs at least as long as one that failed.
    """

    def __init__(self) -> None:
        self._shortest: dict[Hashable, float] = {}

    def add(self, key: Hashable, job: JobRequest) -> None:
        runs = _runtime_key(job)
        self._shortest[key] = min(runs, self._shortest.get(key, runs))

    def skips(self, key: Hashable, job: JobRequest) -> bool:
        shortest = self._shortest.get(key)
        return shortest is not None and _runtime_key(job) >= shortest


def _runtime_key(job: JobRequest) -> float:
    if not (job.elastic or job.malleable):
        return 0.0  # its run time does not change where it fits
    return float("inf") if job.expected_runtime_s is None else job.expected_runtime_s
