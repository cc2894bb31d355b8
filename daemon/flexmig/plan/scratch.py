"""The planner's working copy of a node: layouts, who holds which instance, and the actions emitted so far.

This is the one mutable thing in ``plan/``. A plan is built by mutating a :class:`Scratch` created from a frozen
:class:`~flexmig.plan.types.NodeState`; every mutation that changes a GPU's layout emits the matching action, so
the action list replays onto the input layouts exactly. Trials (``begin``/``rollback``/``commit``, nestable)
let the planner try a placement and take it back.

Placement rules used here (the flex rules):

* a rank may use an existing free instance whose profile covers its need (no reconfiguration), or a new
  instance of exactly its profile, created wherever the GPU's *held* instances leave room; free instances in the
  way are destroyed first;
* among all candidates the one that keeps the most demand-weighted capacity
  (:meth:`flexmig.plan.geometry.Geometry.value`) wins; ties go to fewer reconfigurations, then the lower GPU
  index and start, so plans are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from flexmig.mig.catalogue import Profile
from flexmig.mig.layout import Layout, PlacedInstance
from flexmig.plan.geometry import Geometry, LayoutKey
from flexmig.plan.shapes import Shape, covers
from flexmig.plan.types import Action, CreateInstance, DestroyInstance, Instance, PlannerSettings

__all__ = ["BLOCKED", "Candidate", "GpuTally", "Scratch"]

BLOCKED = "\x00blocked"
"""Owner of instances the planner must neither use nor destroy."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """Where one rank could go: ``profile`` at ``gpu``/``start``, reusing a free instance or creating one."""

    gpu: int
    start: int
    profile: Profile
    reuse: bool
    gain: float  # change of demand-weighted capacity (<= 0)
    ops: int  # reconfiguration actions it needs

    def rank(self) -> tuple[float, int, int, int]:
        """Sort key: best first."""
        return (-round(self.gain, 9), self.ops, self.gpu, self.start)


@dataclass(slots=True)
class _Frame:
    gpus: dict[int, tuple[Layout, dict[int, str], LayoutKey]]
    jobs: dict[str, tuple[Instance, ...] | None]
    actions: int


class Scratch:
    """A mutable node view for building one plan. Not shared between threads or plans."""

    def __init__(
        self,
        geometry: Geometry,
        layouts: Sequence[Layout],
        holds: Mapping[str, Sequence[Instance]],
        settings: PlannerSettings,
        *,
        blocked: Iterable[tuple[int, int]] = (),
        blocked_gpus: Iterable[int] = (),
    ) -> None:
        self.geo = geometry
        self.settings = settings
        self.layouts: list[Layout] = list(layouts)
        self.owner: list[dict[int, str]] = [{} for _ in self.layouts]
        self.jobs: dict[str, tuple[Instance, ...]] = {}
        self.blocked_gpus = frozenset(blocked_gpus)
        self.actions: list[Action] = []
        self._frames: list[_Frame] = []
        for gpu, start in blocked:
            if 0 <= gpu < len(self.layouts) and self.layouts[gpu].at(start) is not None:
                self.owner[gpu][start] = BLOCKED
        for name, instances in holds.items():
            self.jobs[name] = tuple(instances)
            for inst in instances:
                self.owner[inst.gpu][inst.start] = name
        self.keys: list[LayoutKey] = [self._key(g) for g in range(len(self.layouts))]
        self._free: list[list[PlacedInstance] | None] = [None] * len(self.layouts)
        self._states: list[Hashable | None] = [None] * len(self.layouts)
        self._usable = tuple(g for g in range(len(self.layouts)) if g not in self.blocked_gpus)
        self._rooms: dict[int, GpuTally] = {}
        self.changes: list[int] = []
        """Every GPU whose layout or holders changed (or were rolled back), in order, one entry per change: what
        :class:`GpuTally` reads to keep per-GPU answers current without looking at every GPU again."""

    # ------------------------------------------------------------------------------------------- queries
    @property
    def gpu_count(self) -> int:
        """GPUs of the node."""
        return len(self.layouts)

    def _key(self, gpu: int) -> LayoutKey:
        own = self.owner[gpu]
        return tuple((i.start, i.profile.profile_id) for i in self.layouts[gpu].instances if i.start in own)

    def state_of(self, gpu: int) -> Hashable:
        """What :meth:`candidates` depends on for ``gpu``: its held instances, its free ones and whether it is idle
        (two GPUs of one state offer the same candidates)."""
        got = self._states[gpu]
        if got is None:
            free = tuple((i.start, i.profile.profile_id) for i in self.free_instances(gpu))
            got = self._states[gpu] = (self.keys[gpu], free, not self.owner[gpu])
        return got

    def free_instances(self, gpu: int) -> list[PlacedInstance]:
        """Instances of ``gpu`` that exist and nobody holds."""
        got = self._free[gpu]
        if got is None:
            own = self.owner[gpu]
            got = self._free[gpu] = [i for i in self.layouts[gpu].instances if i.start not in own]
        return got

    def room(self, profile: Profile, gpus: Iterable[int]) -> int:
        """How many ``profile`` instances ``gpus`` could host around their held instances (an upper bound on
        what :meth:`place_shape` can place, and nearly always exact). Over :meth:`usable_gpus` (the same tuple) the
        answer comes from a :class:`GpuTally`, so asking again after a few changes costs those changes only."""
        if gpus is self._usable:
            tally = self._rooms.get(profile.profile_id)
            if tally is None:
                geo, keys = self.geo, self.keys
                tally = self._rooms[profile.profile_id] = GpuTally(self, lambda g: geo.room(keys[g], profile))
            return tally.total()
        return sum(self.geo.room(self.keys[g], profile) for g in gpus)

    def is_idle(self, gpu: int) -> bool:
        """True when no job (and nothing blocked) holds an instance of ``gpu``."""
        return not self.owner[gpu]

    def usable_gpus(self, avoid: Iterable[int] = ()) -> tuple[int, ...]:
        """GPUs the planner may touch, minus ``avoid`` (without ``avoid``: the same tuple every time)."""
        skip = frozenset(avoid)
        if not skip:
            return self._usable
        return tuple(g for g in self._usable if g not in skip)

    def value(self, gpu: int, weights: tuple[float, ...]) -> float:
        """Demand-weighted usable capacity of ``gpu`` around its held instances."""
        return self.geo.value(self.keys[gpu], weights)

    # ---------------------------------------------------------------------------------------- candidates
    def candidates(
        self,
        gpu: int,
        profile: Profile,
        weights: tuple[float, ...],
        *,
        create: bool = True,
        forbid: range | None = None,
        exact: bool = False,
    ) -> list[Candidate]:
        """Where one rank of ``profile`` could go on ``gpu`` now (flex rules), each with its capacity change.

        ``exact`` limits reuse to free instances of exactly ``profile`` (not larger ones that cover it). With the
        settings' ``repartition_busy`` off, new instances are created only on GPUs where nothing is held.
        """
        key = self.keys[gpu]
        base = self.geo.value(key, weights)
        out: list[Candidate] = []
        same: set[int] = set()
        for inst in self.free_instances(gpu):
            if not covers(inst.profile, profile) or _overlaps(inst.start, inst.end, forbid):
                continue
            if exact and inst.profile != profile:
                continue
            if inst.profile == profile:
                same.add(inst.start)
            gain = self.geo.value(self.geo.add(key, inst.profile, inst.start), weights) - base
            out.append(Candidate(gpu, inst.start, inst.profile, True, gain, 0))
        if create and (self.settings.repartition_busy or not self.owner[gpu]):
            free = self.free_instances(gpu)
            for s in self.geo.starts(key, profile):
                end = s + profile.memory_slices
                if s in same or _overlaps(s, end, forbid):
                    continue
                in_way = sum(1 for i in free if i.start < end and s < i.end)
                gain = self.geo.value(self.geo.add(key, profile, s), weights) - base
                out.append(Candidate(gpu, s, profile, False, gain, 1 + in_way))
        return out

    # ------------------------------------------------------------------------------------------ mutations
    def _touch(self, gpu: int) -> None:
        self._free[gpu] = None
        self._states[gpu] = None
        self.changes.append(gpu)
        if self._frames:
            frame = self._frames[-1]
            if gpu not in frame.gpus:
                frame.gpus[gpu] = (self.layouts[gpu], dict(self.owner[gpu]), self.keys[gpu])

    def _touch_job(self, name: str) -> None:
        if self._frames:
            frame = self._frames[-1]
            if name not in frame.jobs:
                frame.jobs[name] = self.jobs.get(name)

    def emit(self, action: Action) -> None:
        """Append an action that changes no layout (start, migrate, re-split)."""
        self.actions.append(action)

    def destroy(self, gpu: int, start: int, reason: str) -> None:
        """Destroy the free instance at ``gpu``/``start`` (emits DestroyInstance)."""
        inst = self.layouts[gpu].at(start)
        assert inst is not None and start not in self.owner[gpu], "only free instances are destroyed"
        self._touch(gpu)
        self.layouts[gpu] = self.layouts[gpu].remove(start)
        cost = self.settings.reconfigure_s
        self.actions.append(DestroyInstance(gpu, start, inst.profile, reason, cost))

    def ensure(self, gpu: int, profile: Profile, start: int, reason: str) -> Instance:
        """An instance of ``profile`` at ``gpu``/``start``: the free one there, or a new one after clearing room.

        Free instances overlapping it are destroyed, then (if the GPU's instance or compute limit still forbids
        it) other free instances, highest start first. The caller has checked that the held instances leave room.
        """
        existing = self.layouts[gpu].at(start)
        if existing is not None and existing.profile == profile and start not in self.owner[gpu]:
            return Instance(gpu, start, profile)
        end = start + profile.memory_slices
        for inst in self.free_instances(gpu):
            if inst.start < end and start < inst.end:
                self.destroy(gpu, inst.start, f"make room for {profile.name}@{start}")
        while self.layouts[gpu].why_not(profile, start):
            spare = self.free_instances(gpu)
            assert spare, f"no room for {profile.name}@{start} on GPU {gpu} around held instances"
            self.destroy(gpu, spare[-1].start, f"free a slot for {profile.name}@{start}")
        self._touch(gpu)
        self.layouts[gpu] = self.layouts[gpu].place(profile, start)
        self.actions.append(CreateInstance(gpu, start, profile, reason, self.settings.reconfigure_s))
        return Instance(gpu, start, profile)

    def hold(self, owner: str, instances: Sequence[Instance]) -> None:
        """Mark ``instances`` as held by ``owner`` (they exist and are free)."""
        for inst in instances:
            assert inst.start not in self.owner[inst.gpu], f"{inst.spec()} is already held"
            self._touch(inst.gpu)
            self.owner[inst.gpu][inst.start] = owner
            self.keys[inst.gpu] = self.geo.add(self.keys[inst.gpu], inst.profile, inst.start)
        self._touch_job(owner)
        self.jobs[owner] = (*self.jobs.get(owner, ()), *instances)

    def release(self, owner: str) -> tuple[Instance, ...]:
        """Free every instance ``owner`` holds (they keep existing); returns them."""
        held = self.jobs.get(owner, ())
        self._touch_job(owner)
        self.jobs.pop(owner, None)
        for inst in held:
            self._touch(inst.gpu)
            del self.owner[inst.gpu][inst.start]
            self.keys[inst.gpu] = Geometry.drop(self.keys[inst.gpu], inst.start)
        return held

    def rename(self, old: str, new: str) -> None:
        """Hand everything ``old`` holds to ``new`` (which holds nothing)."""
        held = self.release(old)
        self.hold(new, held)

    def place_rank(self, owner: str, candidate: Candidate, reason: str) -> Instance:
        """Realise ``candidate`` (reuse or create) and hold it for ``owner``."""
        if candidate.reuse:
            inst = Instance(candidate.gpu, candidate.start, candidate.profile)
        else:
            inst = self.ensure(candidate.gpu, candidate.profile, candidate.start, reason)
        self.hold(owner, (inst,))
        return inst

    def place_shape(
        self,
        owner: str,
        shape: Shape,
        weights: tuple[float, ...],
        gpus: Sequence[int],
        reason: str,
        *,
        create: bool = True,
        forbid: Mapping[int, range] | None = None,
        exact: bool = False,
    ) -> tuple[tuple[Instance, ...], float] | None:
        """Place every rank of ``shape`` for ``owner`` on ``gpus``, greedily best-first; None (and no change) if
        some rank finds no room. Returns the instances and the total capacity change.

        All ranks of a job share one profile: when the first rank takes a larger free instance that covers the
        shape's profile, the other ranks must be of that larger profile too. ``exact`` forbids such upsizing.
        """
        self.begin()
        placed: list[Instance] = []
        total = 0.0
        want = shape.profile
        order = sorted(gpus)
        for _ in range(shape.ranks):
            best: Candidate | None = None
            # GPUs in the same state offer the same candidates, and of equal candidates the lowest GPU wins: only the
            # lowest GPU of each state is looked at, so a node of many alike GPUs costs its distinct states, not its
            # size (the choice is the same as looking at every GPU).
            seen: set[Hashable] = set()
            for g in order:
                block = forbid.get(g) if forbid else None
                state = (self.state_of(g), block)
                if state in seen:
                    continue
                seen.add(state)
                for cand in self.candidates(g, want, weights, create=create, forbid=block, exact=exact):
                    if best is None or cand.rank() < best.rank():
                        best = cand
            if best is None:
                self.rollback()
                return None
            placed.append(self.place_rank(owner, best, reason))
            total += best.gain
            want, exact = best.profile, True  # the other ranks take exactly this profile
        self.commit()
        return tuple(placed), total

    # --------------------------------------------------------------------------------------------- trials
    def begin(self) -> None:
        """Open a trial: everything until the matching rollback/commit can be taken back."""
        self._frames.append(_Frame({}, {}, len(self.actions)))

    def rollback(self) -> None:
        """Undo everything since the matching :meth:`begin`."""
        frame = self._frames.pop()
        for gpu, (layout, owner, key) in frame.gpus.items():
            self.layouts[gpu] = layout
            self.owner[gpu] = owner
            self.keys[gpu] = key
            self._free[gpu] = None
            self._states[gpu] = None
            self.changes.append(gpu)
        for name, held in frame.jobs.items():
            if held is None:
                self.jobs.pop(name, None)
            else:
                self.jobs[name] = held
        del self.actions[frame.actions :]

    def commit(self) -> None:
        """Keep everything since the matching :meth:`begin` (folding it into an enclosing trial, if any)."""
        frame = self._frames.pop()
        if self._frames:
            parent = self._frames[-1]
            for gpu, saved in frame.gpus.items():
                parent.gpus.setdefault(gpu, saved)
            for name, held in frame.jobs.items():
                parent.jobs.setdefault(name, held)

    def fork(self) -> Scratch:
        """An independent copy with no actions and no open trial (for looking ahead)."""
        twin = Scratch.__new__(Scratch)
        twin.geo = self.geo
        twin.settings = self.settings
        twin.layouts = list(self.layouts)
        twin.owner = [dict(o) for o in self.owner]
        twin.jobs = dict(self.jobs)
        twin.blocked_gpus = self.blocked_gpus
        twin.actions = []
        twin._frames = []
        twin.keys = list(self.keys)
        twin._free = list(self._free)
        twin._states = list(self._states)
        twin._usable = self._usable
        twin._rooms = {}
        twin.changes = []
        return twin


class GpuTally:
    """The sum of ``value(gpu)`` over a scratch's usable GPUs, kept current by re-reading only the GPUs that changed.

    Planning asks the same node-wide questions again and again while little changes: after every job that fails to
    start, whether the node is full (:meth:`flexmig.plan.queue.Placer.exhausted`); at every release of a look-ahead,
    how many instances of a profile the node could still host (:meth:`Scratch.room`). Summing every GPU each time
    made a pass cost pending jobs (or running jobs) times GPUs. A tally reads every GPU once, then the scratch's
    change log (:attr:`Scratch.changes`), and re-reads only the GPUs named there since it last looked.
    """

    def __init__(self, scratch: Scratch, value: Callable[[int], int]) -> None:
        self.scratch = scratch
        self.value = value
        self.seen = len(scratch.changes)
        self.values = {g: value(g) for g in scratch.usable_gpus()}
        self.sum = sum(self.values.values())

    def total(self) -> int:
        """The sum now."""
        log = self.scratch.changes
        if self.seen < len(log):
            values = self.values
            for g in set(log[self.seen :]):
                was = values.get(g)
                if was is None:
                    continue  # a GPU the planner may not use
                now = self.value(g)
                if now != was:
                    values[g] = now
                    self.sum += now - was
            self.seen = len(log)
        return self.sum


def _overlaps(start: int, end: int, block: range | None) -> bool:
    return block is not None and start < block.stop and block.start < end
