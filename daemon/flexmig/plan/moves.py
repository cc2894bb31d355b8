"""Moves of running jobs that make room for a blocked job: migrations, re-splits, and shrinking malleable jobs.

Rules every move obeys:

* only jobs marked movable, never a blocked instance, and never a job moved (or started) less than
  ``settling_s`` ago, nor one already moved in this plan (:class:`flexmig.plan.grow.MoveBook`);
* a move happens only when its expected gain is at least ``gain_ratio`` (1 + ``gain_margin``) times its cost. The
  cost of moving a job is its downtime (``move_cost``) plus, when it ends up slower, the extra run time that costs
  it; the gain of unblocking the head is the wait it is spared (until its reservation, or ``unknown_wait_s``);
* at most ``max_moves`` moves per plan.

A job in the way is, in this order of preference, migrated elsewhere as it is, re-split elsewhere over other
instances (elastic jobs), or, if malleable, *shrunk* onto those of its instances that are out of the way (fewer
ranks, lower speed; it is grown back when room frees, :mod:`flexmig.plan.grow`). A shrink costs the job the
speed it loses while the head runs (the head's run time, or ``unknown_wait_s``, at most what it would lose if it
never grew back) plus two re-splits.

Order inside a plan: the moved job's new instances are created first (its old ones are still held, so the two
never overlap), then MigrateJob/ResplitJob, and only then are its old instances destroyed to make room.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flexmig.mig.catalogue import GpuModel
from flexmig.plan.grow import MoveBook
from flexmig.plan.placer import BasePlacer
from flexmig.plan.queue import Reservation
from flexmig.plan.scratch import BLOCKED, Scratch
from flexmig.plan.shapes import Shape, shape_allowed, speed_of
from flexmig.plan.types import Instance, JobRequest, MigrateJob, PlannerSettings, ResplitJob, RunningJob, StartJob

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
    """Plans moves of running jobs on ``scratch`` at ``now_s`` that make room for a blocked head."""

    def __init__(
        self,
        scratch: Scratch,
        model: GpuModel,
        settings: PlannerSettings,
        *,
        weights: tuple[float, ...],
        book: MoveBook,
        now_s: float,
        placer: BasePlacer | None = None,
    ) -> None:
        self.scratch = scratch
        self.model = model
        self.settings = settings
        self.weights = weights
        self.book = book
        self.running: Mapping[str, RunningJob] = book.running
        self.now_s = now_s
        self.placer = placer
        self.notes: list[str] = []
        self._how: dict[str, str] = {}  # job moved out of the way -> "migrating", "re-splitting" or "shrinking"

    # --------------------------------------------------------------------------------------------- rules
    def movable(self, name: str) -> bool:
        """May ``name`` be moved now?"""
        return self.book.movable(name)

    def move_cost(self, job: RunningJob) -> float:
        """Downtime of moving ``job``."""
        return self.book.move_cost(job)

    def speed(self, job: RunningJob, shape: Shape) -> float:
        """Speed of ``job`` as ``shape`` (fraction of nominal)."""
        return speed_of(self.model, job.nominal, shape, self.settings)

    def slowdown_cost(self, job: RunningJob, new: Shape) -> float:
        """Extra run time ``job`` pays when re-split to ``new`` for good (0 when it does not get slower or is
        unknown)."""
        if job.remaining_s is None:
            return 0.0
        old = self.speed(job, Shape(job.ranks, job.profile))
        return max(0.0, job.remaining_s * (old / self.speed(job, new) - 1.0))

    def shrink_cost(self, job: RunningJob, new: Shape, head: JobRequest | None) -> float:
        """What shrinking ``job`` to ``new`` while ``head`` runs costs it beyond the shrink's own downtime: the speed
        it loses for the head's run time (``unknown_wait_s`` if unknown), at most what it would lose if it never grew
        back, plus the downtime of growing back."""
        old = self.speed(job, Shape(job.ranks, job.profile))
        new_speed = self.speed(job, new)
        if new_speed >= old:
            return 0.0
        runs = head.expected_runtime_s if head is not None and head.expected_runtime_s is not None else None
        span = runs if runs is not None else self.settings.unknown_wait_s
        lost = span * (1.0 - new_speed / old) + self.move_cost(job)
        if job.remaining_s is not None:
            lost = min(lost, self.slowdown_cost(job, new))
        return lost

    # ------------------------------------------------------------------------------------------ relocate
    def relocate(self, name: str, forbid: Mapping[int, range], head: JobRequest | None = None) -> float | None:
        """Move ``name`` off its instances in ``forbid``; its cost, or None (and no change)."""
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
                why = f"migrate {name} to make room{f' for {head.name}' if head is not None else ''}"
                self.scratch.emit(MigrateJob(name, old, new, why, cost))
                self._how[name] = "migrating"
            else:
                self._how[name] = "re-splitting"
                speed = self.speed(job, shape)
                why = (
                    f"re-split {name} to {shape.ranks}x{shape.profile.name} ({speed:.0%} speed) to make room"
                    f"{f' for {head.name}' if head is not None else ''}"
                )
                self.scratch.emit(ResplitJob(name, shape.ranks, shape.profile, old, new, why, cost))
            self.book.moved.add(name)
            return cost + self.slowdown_cost(job, shape)
        return self._shrink(job, forbid, head)

    def _shrink(self, job: RunningJob, forbid: Mapping[int, range], head: JobRequest | None) -> float | None:
        """Keep the malleable ``job`` on its instances outside ``forbid`` only (fewer ranks)."""
        if not (self.settings.malleable and job.nominal.malleable):
            return None
        keep = tuple(i for i in job.instances if not _inside(i, forbid))
        if not keep or len(keep) == job.ranks or len(keep) < job.nominal.min_ranks:
            return None
        shape = Shape(len(keep), job.profile)
        if not shape_allowed(self.model, job.nominal, shape):
            return None
        cost = self.move_cost(job)
        extra = self.shrink_cost(job, shape, head)
        old = self.scratch.release(job.name)
        self.scratch.hold(job.name, keep)
        why = (
            f"shrink {job.name} to {shape.ranks}x{shape.profile.name} ({self.speed(job, shape):.0%} speed) to make room"
            f"{f' for {head.name}' if head is not None else ''}; it grows back when room frees"
        )
        self.scratch.emit(ResplitJob(job.name, shape.ranks, shape.profile, old, keep, why, cost))
        self.book.moved.add(job.name)
        self._how[job.name] = "shrinking"
        return cost + extra

    # ------------------------------------------------------------------------------------------- unblock
    def unblock(self, head: JobRequest, reservation: Reservation | None) -> bool:
        """Make room for ``head`` by moving running jobs off one placement of it, if worth it; starts it."""
        if not self.settings.migrate and not self.settings.malleable:
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
            cost = self._clear(target, nominal, head)
            if cost is not None and gain >= need * cost:
                self._start_head(head, nominal, target, gain, cost)
                self.scratch.commit()
                return True
            self.scratch.rollback()
            for owner in target.owners:
                self.book.moved.discard(owner)
        return False

    def yield_to(self, job: JobRequest, reservation: Reservation | None) -> bool:
        """Start ``job`` (one rank, not the head) now by shrinking malleable jobs larger than it that stand in one
        placement of it, when the wait it is spared outweighs what they lose, and the head (``reservation``) still
        fits at its start. Larger malleable jobs so yield to smaller ones, as greedy backfilling would let them."""
        if not self.settings.malleable or self.placer is None:
            return False
        nominal = self.scratch.geo.nominal(job)
        if nominal.ranks != 1:
            return False
        size = nominal.compute_slices
        shrinkable = {
            name
            for name, run in self.running.items()
            if run.nominal.malleable
            and run.ranks > run.nominal.min_ranks
            and self.scratch.geo.nominal(run.nominal).compute_slices > size
            and self.movable(name)
        }
        if not shrinkable:
            return False
        targets = list(self._targets(nominal, float("inf"), only=shrinkable))
        if not targets:
            return False
        shadow = self.placer.shadow(job)
        gain = self.settings.unknown_wait_s if shadow is None else shadow.start_s - self.now_s
        if shadow is not None and shadow.start_s == float("inf"):
            gain = self.settings.unknown_wait_s
        need = self.settings.gain_ratio
        for target in targets[:_MAX_TRIALS]:
            self.scratch.begin()
            cost = 0.0
            for name in target.owners:
                got = self._shrink(
                    self.running[name],
                    {target.gpu: range(target.start, target.start + nominal.profile.memory_slices)},
                    job,
                )
                if got is None:
                    cost = float("inf")
                    break
                cost += got
            fits = target.start in self.scratch.geo.starts(self.scratch.keys[target.gpu], nominal.profile)
            if fits and gain >= need * cost:
                self._start_head(job, nominal, target, gain, cost)
                ends = {job.name: self.now_s + (job.expected_runtime_s or float("inf"))}
                if reservation is None or self.placer.keeps_head(reservation, ends):
                    self.placer.ends.update(ends)
                    self.scratch.commit()
                    return True
                self.notes.pop()
            self.scratch.rollback()
            for owner in target.owners:
                self.book.moved.discard(owner)
        return False

    def _targets(self, nominal: Shape, gain: float, only: set[str] | None = None) -> list[_Target]:
        """Placements of ``nominal`` that only movable jobs (of ``only``, if given) stand in, cheapest first."""
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
                if not all(self.movable(n) and self._may_go(n) for n in names):
                    continue
                if only is not None and not set(names) <= only:
                    continue
                cost = sum(self.move_cost(self.running[n]) for n in names)
                if gain < self.settings.gain_ratio * cost:
                    continue
                out.append(_Target(cost, tuple(names), g, s))
        out.sort(key=lambda t: (t.cost, len(t.owners), t.gpu, t.start))
        return out

    def _may_go(self, name: str) -> bool:
        """The job in the way may migrate (migrations on), re-split (elastic, re-splits on) or shrink (malleable)."""
        req = self.running[name].nominal
        return (
            self.settings.migrate
            or (self.settings.resplit and req.elastic)
            or (self.settings.malleable and req.malleable)
        )

    def _clear(self, target: _Target, nominal: Shape, head: JobRequest) -> float | None:
        """Relocate the target's owners; the total cost, or None when they cannot all go or the head still can't."""
        region = {target.gpu: range(target.start, target.start + nominal.profile.memory_slices)}
        total = 0.0
        for name in target.owners:
            cost = (
                self.relocate(name, region, head)
                if self.settings.migrate
                else self._shrink(self.running[name], region, head)
            )
            if cost is None:
                return None
            total += cost
        if target.start not in self.scratch.geo.starts(self.scratch.keys[target.gpu], nominal.profile):
            return None
        return total

    def _start_head(self, head: JobRequest, nominal: Shape, target: _Target, gain: float, cost: float) -> None:
        moves = ", ".join(f"{self._how.get(n, 'moving')} {n}" for n in target.owners)
        why = f"start {head.name} after {moves}"
        inst = self.scratch.ensure(target.gpu, nominal.profile, target.start, why)
        self.scratch.hold(head.name, (inst,))
        reason = f"{why}: spares ~{gain:.0f}s of waiting for {cost:.0f}s of moves"
        self.scratch.emit(StartJob(head.name, (inst,), reason, 0.0))
        self.notes.append(reason)


def _inside(inst: Instance, forbid: Mapping[int, range]) -> bool:
    block = forbid.get(inst.gpu)
    return block is not None and inst.start < block.stop and block.start < inst.start + inst.profile.memory_slices
