"""Growing jobs that run below their nominal speed back up when room frees: narrow malleable jobs and spreads.

A job runs below nominal speed when it started (or was shrunk) narrow, or when it was spread over smaller
instances. Each planning pass looks at such jobs, oldest submission first, and re-splits one up when:

* it may move (movable, settled, not moved yet in this plan, fewer than ``max_moves`` moves so far);
* a faster shape fits now under the policy's rules: more ranks of its own profile (the job keeps the instances it
  has and gains new ones; up to its nominal rank count), or its nominal shape elsewhere (for a job on ranks of
  another profile), placed while it still holds what it has, so the two never overlap;
* the run time saved, ``remaining x (1 - old speed / new speed)``, is at least ``gain_ratio`` times the re-split's
  downtime. A remaining time that is not known counts as ``unknown_wait_s``;
* with the head's reservation given (EASY), the head still fits at its start.

The planner grows jobs *after* admitting the queue, with what admission left: a job that already runs, if slowly,
does not take room from one that waits. That is what keeps a narrow start from costing the queue more than the
capacity nobody else could use (the measured trade-off is in the replay results).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from flexmig.plan.placer import BasePlacer, rigid
from flexmig.plan.queue import Reservation
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape, covers
from flexmig.plan.types import PlannerSettings, ResplitJob, RunningJob

__all__ = ["Grower", "MoveBook"]


class MoveBook:
    """Which jobs a plan has moved so far, shared by everything that moves jobs in one plan."""

    def __init__(self, settings: PlannerSettings, running: Mapping[str, RunningJob], now_s: float) -> None:
        self.settings = settings
        self.running = dict(running)
        self.now_s = now_s
        self.moved: set[str] = set()

    def movable(self, name: str) -> bool:
        """May ``name`` be moved now?"""
        job = self.running.get(name)
        if job is None or not job.movable or name in self.moved:
            return False
        if len(self.moved) >= self.settings.max_moves:
            return False
        return job.last_moved_s is None or self.now_s - job.last_moved_s >= self.settings.settling_s

    def move_cost(self, job: RunningJob) -> float:
        """Downtime of moving ``job``."""
        own = job.move_cost_s if job.move_cost_s is not None else job.nominal.move_cost_s
        return self.settings.move_cost(own, standby=job.nominal.standby)


class Grower:
    """Re-splits slow jobs up on ``placer``'s scratch, by ``placer``'s rules."""

    def __init__(self, placer: BasePlacer, book: MoveBook, notes: list[str]) -> None:
        self.placer = placer
        self.book = book
        self.notes = notes

    @property
    def scratch(self) -> Scratch:
        """The plan's scratch."""
        return self.placer.scratch

    def slow(self) -> list[RunningJob]:
        """Running jobs below their nominal speed, oldest submission first."""
        out = []
        for job in self.book.running.values():
            if job.name in self.scratch.jobs and self.placer.speed(job.nominal, Shape(job.ranks, job.profile)) < 1.0:
                out.append(job)
        out.sort(key=lambda j: (j.nominal.submitted_s, j.name))
        return out

    def grow(self, jobs: Iterable[RunningJob], reservation: Reservation | None = None) -> None:
        """Try each of ``jobs`` in turn (see the module docstring)."""
        for job in jobs:
            if self.book.movable(job.name):
                self._grow(job, reservation)

    def _grow(self, job: RunningJob, reservation: Reservation | None) -> bool:
        settings = self.book.settings
        placer = self.placer
        scratch = self.scratch
        current = Shape(job.ranks, job.profile)
        old_speed = placer.speed(job.nominal, current)
        nominal = scratch.geo.nominal(job.nominal)
        remaining = job.remaining_s if job.remaining_s is not None else settings.unknown_wait_s
        cost = self.book.move_cost(job)
        need = settings.gain_ratio * cost
        gpus = scratch.usable_gpus()
        tag = f"{job.name}\x00growing"
        own = covers(job.profile, nominal.profile)
        if not (settings.malleable if own else settings.resplit):
            return False  # more ranks of its own: malleability; the nominal shape back from a spread: re-splitting
        options: list[int] = list(range(nominal.ranks - job.ranks, 0, -1)) if own else [0]
        for extra in options:
            new_shape = Shape(job.ranks + extra, job.profile) if own else nominal
            new_speed = placer.speed(job.nominal, new_shape)
            if new_speed <= old_speed:
                continue
            gain = remaining * (1.0 - old_speed / new_speed)
            if gain < need:
                continue
            scratch.begin()
            if own:
                added = placer.place_exact(scratch, tag, Shape(extra, job.profile), gpus, f"grow {job.name}")
                same = added is not None and all(i.profile == job.profile for i in added)
                placed = (*job.instances, *added) if added is not None and same else None
            else:
                fit = placer.fit_nominal(scratch, rigid(job.nominal, tag), gpus, f"grow {job.name}")
                placed = None if fit is None else fit[1]
            if placed is None:
                scratch.rollback()
                continue
            end = self.book.now_s + cost + remaining * old_speed / new_speed
            if reservation is not None and not placer.keeps_head(reservation, {job.name: end}):
                scratch.rollback()
                continue
            old = scratch.release(job.name)
            scratch.release(tag)
            scratch.hold(job.name, placed)
            scratch.commit()
            shape = Shape(len(placed), placed[0].profile)
            why = (
                f"grow {job.name} to {shape.ranks}x{shape.profile.name} ({new_speed:.0%} speed, from "
                f"{old_speed:.0%}): saves ~{gain:.0f}s for {cost:.0f}s of downtime"
            )
            scratch.emit(ResplitJob(job.name, shape.ranks, shape.profile, old, placed, why, cost))
            self.book.moved.add(job.name)
            placer.ends[job.name] = end
            return True
        return False
