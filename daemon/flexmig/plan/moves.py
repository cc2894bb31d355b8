"""Moves of running jobs: migrations that make room for a blocked job, and re-splits that consolidate a spread job.

Rules every move obeys:

* only jobs marked movable, never a blocked instance, and never a job moved (or started) less than
  ``settling_s`` ago, nor one already moved in this plan;
* a move happens only when its expected gain is at least ``gain_ratio`` (1 + ``gain_margin``) times its cost. The
  cost of moving a job is its downtime (``move_cost``) plus, when it ends up slower (spread), the extra run time
  that costs it; the gain of unblocking the head is the wait it is spared (until its reservation, or
  ``unknown_wait_s``), the gain of a consolidation the run time the job saves at full speed;
* at most ``max_moves`` moves per plan.

Order inside a plan: the moved job's new instances are created first (its old ones are still held, so the two
never overlap), then MigrateJob/ResplitJob, and only then are its old instances destroyed to make room.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flexmig.mig.catalogue import GpuModel
from flexmig.plan.queue import Reservation
from flexmig.plan.scratch import BLOCKED, Scratch
from flexmig.plan.shapes import Shape, speed_of
from flexmig.plan.types import JobRequest, MigrateJob, PlannerSettings, ResplitJob, RunningJob, StartJob

__all__ = ["Mover"]

_MAX_OWNERS = 3  # jobs moved to free one placement
_MAX_TRIALS = 48  # candidate placements tried per blocked job


@dataclass(frozen=True, slots=True)
class _Target:
    cost: float
    owners: tuple[str, ...]
    gpu: int
    start: int


class Mover:
    """Plans moves of ``running`` jobs on ``scratch`` at ``now_s``."""

    def __init__(
        self,
        scratch: Scratch,
        model: GpuModel,
        settings: PlannerSettings,
        *,
        weights: tuple[float, ...],
        running: Mapping[str, RunningJob],
        now_s: float,
    ) -> None:
        self.scratch = scratch
        self.model = model
        self.settings = settings
        self.weights = weights
        self.running = dict(running)
        self.now_s = now_s
        self.moved: set[str] = set()
        self.notes: list[str] = []

    # --------------------------------------------------------------------------------------------- rules
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
        return self.settings.move_cost(own)

    def speed(self, job: RunningJob, shape: Shape) -> float:
        """Speed of ``job`` as ``shape`` (fraction of nominal)."""
        return speed_of(self.model, job.nominal, shape, self.settings)

    def slowdown_cost(self, job: RunningJob, new: Shape) -> float:
        """Extra run time ``job`` pays when re-split to ``new`` (0 when it does not get slower or is unknown)."""
        if job.remaining_s is None:
            return 0.0
        old = self.speed(job, Shape(job.ranks, job.profile))
        return max(0.0, job.remaining_s * (old / self.speed(job, new) - 1.0))

    # ------------------------------------------------------------------------------------------ relocate
    def relocate(self, name: str, forbid: Mapping[int, range]) -> float | None:
        """Move ``name`` off its instances, keeping clear of ``forbid``; its cost, or None (and no change)."""
        job = self.running[name]
        current = Shape(job.ranks, job.profile)
        tag = f"{name}\x00moving"
        gpus = self.scratch.usable_gpus()
        options = [current]
        if self.settings.resplit and job.nominal.elastic:
            options += [s for s in self.scratch.geo.shapes(job.nominal, resplit=True) if s != current]
        for shape in options:
            got = self.scratch.place_shape(tag, shape, self.weights, gpus, f"move {name}", forbid=forbid, exact=True)
            if got is None:
                continue
            new = got[0]
            cost = self.move_cost(job)
            old = self.scratch.release(name)
            self.scratch.rename(tag, name)
            if shape == current:
                why = f"migrate {name} to make room"
                self.scratch.emit(MigrateJob(name, old, new, why, cost))
            else:
                speed = self.speed(job, shape)
                why = f"re-split {name} to {shape.ranks}x{shape.profile.name} ({speed:.0%} speed) to make room"
                self.scratch.emit(ResplitJob(name, shape.ranks, shape.profile, old, new, why, cost))
            self.moved.add(name)
            return cost + self.slowdown_cost(job, shape)
        return None

    # ------------------------------------------------------------------------------------------- unblock
    def unblock(self, head: JobRequest, reservation: Reservation | None) -> bool:
        """Make room for ``head`` by moving running jobs off one placement of it, if worth it; starts it."""
        if not self.settings.migrate:
            return False
        nominal = self.scratch.geo.nominal(head)
        if nominal.ranks != 1:
            return False  # room for several whole ranks is made by spreading, not by evicting
        if reservation is not None and reservation.start_s != float("inf"):
            gain = reservation.start_s - self.now_s
        else:
            gain = self.settings.unknown_wait_s
        need = self.settings.gain_ratio
        for target in self._targets(nominal, gain)[:_MAX_TRIALS]:
            self.scratch.begin()
            cost = self._clear(target, nominal)
            if cost is not None and gain >= need * cost:
                self._start_head(head, nominal, target, gain, cost)
                self.scratch.commit()
                return True
            self.scratch.rollback()
            for owner in target.owners:
                self.moved.discard(owner)
        return False

    def _targets(self, nominal: Shape, gain: float) -> list[_Target]:
        """Placements of ``nominal`` that only movable jobs stand in, cheapest first."""
        p = nominal.profile
        out: list[_Target] = []
        for g in self.scratch.usable_gpus():
            owner = self.scratch.owner[g]
            layout = self.scratch.layouts[g]
            for s in p.starts:
                end = s + p.memory_slices
                names = sorted(
                    {owner[i.start] for i in layout.instances if i.start in owner and i.start < end and s < i.end}
                )
                if not names or len(names) > _MAX_OWNERS or BLOCKED in names:
                    continue
                if not all(self.movable(n) for n in names):
                    continue
                cost = sum(self.move_cost(self.running[n]) for n in names)
                if gain < self.settings.gain_ratio * cost:
                    continue
                out.append(_Target(cost, tuple(names), g, s))
        out.sort(key=lambda t: (t.cost, len(t.owners), t.gpu, t.start))
        return out

    def _clear(self, target: _Target, nominal: Shape) -> float | None:
        """Relocate the target's owners; the total cost, or None when they cannot all go or the head still can't."""
        region = {target.gpu: range(target.start, target.start + nominal.profile.memory_slices)}
        total = 0.0
        for name in target.owners:
            cost = self.relocate(name, region)
            if cost is None:
                return None
            total += cost
        if target.start not in self.scratch.geo.starts(self.scratch.keys[target.gpu], nominal.profile):
            return None
        return total

    def _start_head(self, head: JobRequest, nominal: Shape, target: _Target, gain: float, cost: float) -> None:
        why = f"start {head.name} after moving {', '.join(target.owners)}"
        inst = self.scratch.ensure(target.gpu, nominal.profile, target.start, why)
        self.scratch.hold(head.name, (inst,))
        reason = f"{why}: spares ~{gain:.0f}s of waiting for {cost:.0f}s of moves"
        self.scratch.emit(StartJob(head.name, (inst,), reason, 0.0))
        self.notes.append(reason)

    # -------------------------------------------------------------------------------------- consolidate
    def consolidate(self, avoid: frozenset[int]) -> None:
        """Give spread jobs their nominal shape back where that pays (not on ``avoid``)."""
        if not self.settings.resplit:
            return
        gpus = self.scratch.usable_gpus(avoid)
        for name in sorted(self.running):
            job = self.running[name]
            if name not in self.scratch.jobs or not self.movable(name) or job.remaining_s is None:
                continue
            current = Shape(job.ranks, job.profile)
            nominal = self.scratch.geo.nominal(job.nominal)
            speed = self.speed(job, current)
            if current == nominal or speed >= 1.0:
                continue
            gain = job.remaining_s * (1.0 - speed)
            cost = self.move_cost(job)
            if gain < self.settings.gain_ratio * cost:
                continue
            tag = f"{name}\x00moving"
            got = self.scratch.place_shape(tag, nominal, self.weights, gpus, f"consolidate {name}")
            if got is None:
                continue
            old = self.scratch.release(name)
            self.scratch.rename(tag, name)
            why = (
                f"re-split {name} back to {nominal.ranks}x{nominal.profile.name}: saves ~{gain:.0f}s "
                f"for {cost:.0f}s of downtime"
            )
            self.scratch.emit(ResplitJob(name, nominal.ranks, nominal.profile, old, got[0], why, cost))
            self.moved.add(name)
