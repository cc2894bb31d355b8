"""Which MIG instances to destroy and create next when every MIG instance is its own Slurm node (Slurm 23.11+
dynamic nodes, one slurmd each): free instances are re-carved while the busy ones run on untouched.

A whole-node or whole-GPU change (:mod:`flexmig.plan.reregistration`) has to wait until every job of the node (or
the GPU) has ended, because Slurm cannot change a node's GRES while a job runs on it. With one node per instance,
no node's GRES ever changes: an instance is created together with its node and destroyed with it, and only
*idle* instances are destroyed. So a change never waits for unrelated jobs; what remains is MIG's own geometry:
a waiting job whose profile fits nowhere in the slices that are free or held by idle instances has to wait for
busy instances to end.

Each round, the waiting jobs are taken in Slurm's priority order:

* a free instance of the job's profile (one being registered counts) serves it (Slurm starts it there); a free
  instance of more than one compute slice is given to the first job that asks for its profile (and runs on one
  node) before any job is carved for, so it is never destroyed for an older job of another profile
  (:data:`KEEP_FREE_SLICES`);
* otherwise the job's profile is **carved** where it destroys the fewest idle compute slices (then as high up the
  GPU as it goes, so that the low starts that only big profiles can use stay whole); instances another waiting job
  was given, instances still registering, instances an administrator closed (``pinned``) and the held region
  below are never destroyed;
* otherwise the job is **blocked**. The first blocked job gets a **hold** once it has waited ``hold_after_s``, or
  at once in a round where a compute slice idles and no waiting job can use one (no free instance serves any of
  them, nothing can be carved for any): the placement of its profile (on any GPU) whose busy instances are
  expected to end first (by their time limits). No instance is carved inside the
  held region for other jobs, and the caller keeps the region's free instances to jobs whose time limit ends
  before the hold's time (a Slurm reservation on their nodes). As soon as the region's busy instances are gone,
  its idle instances are destroyed and the held job's instance is created there. Later blocked jobs wait, as they
  would behind a job Slurm plans to start: nothing starves, because the hold always serves the oldest blocked job
  and its region only empties.

Why a hold at once when the node idles for want of a taker: those slices idle whether the region is held or not,
and without a hold the small jobs that arrive next are carved into the region one by one, each with its own end,
so that the blocked job's region empties only when the last of them happens to end (on the administrator's mix,
``bench/slurm_model.py``, a 7g job waited 880 s while its GPU ran at 2 of 7 slices with nothing else waiting).

Why a free instance is kept for a job of its profile: Slurm starts that job there the moment it looks, so
destroying the instance for an older job of another profile is a race with Slurm, and when flexmig wins it the
slices it took a drain to gather are scattered again (a free 7g carved into 3g and 2g instances while 7g jobs wait
means draining the whole GPU once more for them). The smallest instances are re-made from any idle slice, so a
free 1g is still carved into a bigger instance for an older job, as Slurm's priority order asks.

A hold is dropped when its job no longer waits, or can be served elsewhere.

Pure: time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.layout import Layout, PlacedInstance

__all__ = ["HOLD_AFTER_S", "KEEP_FREE_SLICES", "Carving", "Hold", "Waiting", "Where", "carve"]

HOLD_AFTER_S = 900.0
"""How long a blocked job waits before it holds a region. A hold idles the region's free slices until its busy
instances end, so at once it costs more than it saves: on the administrator's mix (``bench/slurm_model.py``, seeds
1-20) holding at once gave 81 % (71 % worst) utilisation while jobs wait and 1.27x (1.40x) the packing bound,
after 600 s 87 % (79 %) and 1.19x (1.33x), after 900 s 85 % (78 %) and 1.19x (1.28x), and later no better; the
bound on waiting is what keeps a big job from starving behind a stream of small ones."""

KEEP_FREE_SLICES = 2
"""A free instance of at least this many compute slices is given to a waiting job of its profile before any carving
of the round, so that it is not destroyed for an older job of another profile (outside a held region). On the
administrator's mix (``bench/slurm_model.py --race``, where flexmig may act on a job's end before Slurm does, as it
does in the real runs) keeping every free instance (1) and keeping only those of 2 or 3 slices gave the same median
on seeds 1-80, but keeping a free 1g let new 1g jobs take freed 1g instances ahead of older bigger jobs (worst seed
74 % against 79 %)."""

Where = tuple[int, int]
"""An instance's place on the node: ``(gpu, start)``."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting job, in Slurm's priority order: its name, the profile it asks for, its time limit (seconds; None:
    none), how long it has waited, and whether Slurm starts it on one instance alone (False: one part of a job of
    several nodes, which starts only once every part has an instance)."""

    name: str
    profile: str
    limit_s: float | None = None
    waited_s: float = 0.0
    alone: bool = True


@dataclass(frozen=True, slots=True)
class Hold:
    """The region kept for a blocked job: ``profile`` at ``start`` on ``gpu``, expected empty at ``at_s`` (the
    clock ``now_s`` is on; ``math.inf``: a busy instance there has no time limit)."""

    job: str
    gpu: int
    start: int
    profile: str
    at_s: float

    def slices(self, model: GpuModel) -> range:
        """The memory slices of the held region."""
        return range(self.start, self.start + model.profile(self.profile).memory_slices)

    def covers(self, model: GpuModel, gpu: int, inst: PlacedInstance) -> bool:
        """True when ``inst`` on ``gpu`` overlaps the held region."""
        region = self.slices(model)
        return gpu == self.gpu and inst.start < region.stop and region.start < inst.end


@dataclass(frozen=True, slots=True)
class Carving:
    """A round's decision: the idle instances to destroy, the instances to create (each for the waiting job
    named), the hold to keep (None: none), and why, in words."""

    destroy: tuple[Where, ...]
    create: tuple[tuple[int, PlacedInstance, str], ...]
    hold: Hold | None
    reasons: tuple[str, ...]


def carve(
    model: GpuModel,
    layouts: Sequence[Layout],
    busy: Mapping[Where, float | None],
    queue: Sequence[Waiting],
    *,
    now_s: float,
    hold: Hold | None = None,
    registering: frozenset[Where] = frozenset(),
    pinned: frozenset[Where] = frozenset(),
    hold_after_s: float = HOLD_AFTER_S,
    hold_when_idle: bool = True,
    keep_free: bool = True,
    numbers: Sequence[int] = (),
) -> Carving:
    """The next carving of the node's GPUs ``layouts`` for the waiting ``queue`` (Slurm's priority order).

    ``busy`` maps each instance a job runs on to the seconds until that job's time limit (None: no limit);
    ``registering`` are instances whose nodes are not registered yet (they serve waiting jobs but are not
    destroyed); ``pinned`` are instances left alone (their node closed by an administrator: they serve nobody and
    are not destroyed). ``hold`` is the previous round's; a blocked job gets one once it has waited
    ``hold_after_s``, or (``hold_when_idle``) at once when a compute slice idles and no waiting job can be served.
    ``keep_free``: free instances of :data:`KEEP_FREE_SLICES` or more go to jobs of their profile before any
    carving (False: strictly in priority order, an older job's carving may destroy them).
    ``numbers`` are the GPUs' own numbers (NVML's) that the reasons name, by default their indices in ``layouts``.
    """
    for g, start in (*busy, *registering, *pinned):
        if not 0 <= g < len(layouts) or layouts[g].at(start) is None:
            raise ValueError(f"carve: no instance at GPU {g}, memory slice {start}")
    if numbers and len(numbers) != len(layouts):
        raise ValueError(f"carve: {len(numbers)} GPU numbers for {len(layouts)} GPUs")
    number = list(numbers) or list(range(len(layouts)))

    def once(after_s: float, *, early: bool = False) -> tuple[Carving, int]:
        return _carve(model, layouts, busy, queue, now_s=now_s, hold=hold, registering=registering, pinned=pinned,
                      hold_after_s=after_s, number=number, early=early, keep_free=keep_free)  # fmt: skip

    c, served = once(hold_after_s)
    if hold_when_idle and c.hold is None and not c.create and not served and _idles(model, layouts, busy, pinned):
        c, _ = once(0.0, early=True)
    return c


def _idles(
    model: GpuModel, layouts: Sequence[Layout], busy: Mapping[Where, float | None], pinned: frozenset[Where]
) -> bool:
    """True when a compute slice of the node runs no job (and is not an administrator's)."""
    used = sum(i.profile.compute_slices for g, lay in enumerate(layouts) for i in lay
               if (g, i.start) in busy or (g, i.start) in pinned)  # fmt: skip
    return used < model.compute_slices * len(layouts)


def _carve(
    model: GpuModel,
    layouts: Sequence[Layout],
    busy: Mapping[Where, float | None],
    queue: Sequence[Waiting],
    *,
    now_s: float,
    hold: Hold | None,
    registering: frozenset[Where],
    pinned: frozenset[Where],
    hold_after_s: float,
    number: Sequence[int],
    early: bool = False,
    keep_free: bool = True,
) -> tuple[Carving, int]:
    """One pass of :func:`carve` with ``hold_after_s``; and how many waiting jobs it served (a free instance or a
    new one). ``early``: the hold is taken because nothing can use the idle slices (its reason says so)."""
    node = _Node(model, list(layouts), busy, registering, pinned)
    reasons: list[str] = []
    names = {j.name for j in queue}
    fence = hold if hold is not None and hold.job in names else None
    if hold is not None and fence is None:
        reasons.append(f"{hold.job}: no longer waits; hold dropped")
    kept: Hold | None = None
    given: dict[Where, float | None] = {}
    kept_free: set[str] = set()
    if keep_free:
        fence = _keep_free(node, queue, fence, now_s=now_s, given=given, kept_free=kept_free)
    for job in queue:
        if job.name in kept_free:
            continue
        profile = model.profile(job.profile)
        mine = fence is not None and fence.job == job.name
        other = None if mine else fence
        free = node.free_instance(profile, given, other, job.limit_s, now_s)
        if free is None:
            spot = node.spot(profile, given, other)
            if spot is not None:
                node.make(spot, profile, job.name)
                reasons.append(f"{job.name}: {profile.name}@{spot[1]} carved on GPU {number[spot[0]]}")
                free = spot
        if free is not None:
            given[free] = job.limit_s
            if mine:
                fence = None
            continue
        if kept is not None or (not mine and job.waited_s < hold_after_s):
            continue  # waits behind the hold (as behind a job Slurm plans to start), or for its turn to hold
        target = fence if mine else node.earliest(profile, job.name, given, now_s)
        if target is None:
            reasons.append(f"{job.name}: {profile.name} fits no GPU of this node")
            continue
        if not mine:
            why = " (no waiting job can use the idle slices)" if early else ""
            reasons.append(
                f"{job.name}: blocked; holds {profile.name}@{target.start} on GPU {number[target.gpu]}{why}"
            )
        kept = fence = target
    return Carving(tuple(node.destroyed), tuple(node.created), kept, tuple(reasons)), len(given)


def _keep_free(
    node: _Node, queue: Sequence[Waiting], fence: Hold | None, *, now_s: float, given: dict[Where, float | None],
    kept_free: set[str],
) -> Hold | None:  # fmt: skip
    """Give each free instance of :data:`KEEP_FREE_SLICES` or more outside the held region to the first waiting job
    of its profile that Slurm would start on it alone (into ``given`` and ``kept_free``); the hold that remains
    (None once its own job was served). A part of a job of several nodes is left to the priority order: Slurm does
    not start it on one free instance while its other parts have none."""
    for job in queue:
        profile = node.model.profile(job.profile)
        if profile.compute_slices < KEEP_FREE_SLICES or not job.alone:
            continue
        w = node.free_instance(profile, given, fence, job.limit_s, now_s, outside=True)
        if w is not None:
            given[w] = job.limit_s
            kept_free.add(job.name)
            if fence is not None and fence.job == job.name:
                fence = None
    return fence


class _Node:
    """The node's layouts as a round carves them."""

    def __init__(
        self,
        model: GpuModel,
        layouts: list[Layout],
        busy: Mapping[Where, float | None],
        registering: frozenset[Where],
        pinned: frozenset[Where],
    ) -> None:
        self.model = model
        self.layouts = layouts
        self.busy = busy
        self.registering = registering
        self.pinned = pinned
        self.destroyed: list[Where] = []
        self.created: list[tuple[int, PlacedInstance, str]] = []

    def _overlap(self, g: int, start: int, profile: Profile) -> list[PlacedInstance]:
        return [i for i in self.layouts[g] if i.start < start + profile.memory_slices and start < i.end]

    def free_instance(
        self, profile: Profile, given: Mapping[Where, float | None], fence: Hold | None, limit_s: float | None,
        now_s: float, *, outside: bool = False,
    ) -> Where | None:  # fmt: skip
        """A free instance of ``profile`` not given to another job (in the region ``fence`` holds only when the
        job's limit ends before the hold's time; ``outside``: never there, whose instances the priority order
        gives)."""
        for g, lay in enumerate(self.layouts):
            for inst in lay:
                w = (g, inst.start)
                if inst.profile != profile or w in self.busy or w in given or w in self.pinned:
                    continue
                late = limit_s is None or now_s + limit_s > (fence.at_s if fence is not None else math.inf)
                if fence is not None and fence.covers(self.model, g, inst) and (late or outside):
                    continue
                return w
        return None

    def spot(self, profile: Profile, given: Mapping[Where, float | None], fence: Hold | None) -> Where | None:
        """Where ``profile`` can be carved destroying only idle instances, outside ``fence``: the fewest idle
        compute slices destroyed, then the highest start, then the lowest GPU."""
        best: tuple[tuple[int, int, int], Where] | None = None
        for g, lay in enumerate(self.layouts):
            for start in profile.starts:
                if fence is not None and g == fence.gpu:
                    held = fence.slices(self.model)
                    if start < held.stop and held.start < start + profile.memory_slices:
                        continue
                over = self._overlap(g, start, profile)
                if any((g, i.start) in self.busy or (g, i.start) in self.registering
                       or (g, i.start) in self.pinned or (g, i.start) in given for i in over):  # fmt: skip
                    continue
                rest = lay
                for i in over:
                    rest = rest.remove(i.start)
                if not rest.can_place(profile, start):
                    continue
                key = (sum(i.profile.compute_slices for i in over), -start, g)
                if best is None or key < best[0]:
                    best = (key, (g, start))
        return None if best is None else best[1]

    def make(self, where: Where, profile: Profile, job: str) -> None:
        """Destroy the idle instances that overlap ``profile`` at ``where`` and create it, given to ``job``."""
        g, start = where
        lay = self.layouts[g]
        for i in self._overlap(g, start, profile):
            lay = lay.remove(i.start)
            self.destroyed.append((g, i.start))
        self.layouts[g] = lay.place(profile, start)
        self.created.append((g, PlacedInstance(start, profile), job))

    def earliest(self, profile: Profile, job: str, given: Mapping[Where, float | None], now_s: float) -> Hold | None:
        """The placement of ``profile`` whose busy instances (those given to jobs before it count, with their
        limits) are expected to end first (by their time limits; then the fewest busy slices, then the highest
        start, then the lowest GPU), as a hold for ``job``; None when every placement holds a pinned instance (or
        the profile fits no GPU)."""
        taken = {**self.busy, **given}
        best: tuple[tuple[float, int, int, int], Hold] | None = None
        empty = Layout.empty(self.model)
        for g in range(len(self.layouts)):
            for start in profile.starts:
                if not empty.can_place(profile, start):
                    continue
                over = self._overlap(g, start, profile)
                if any((g, i.start) in self.pinned for i in over):
                    continue
                ends = [taken[(g, i.start)] for i in over if (g, i.start) in taken]
                left = max((math.inf if e is None else e for e in ends), default=0.0)
                slices = sum(i.profile.compute_slices for i in over if (g, i.start) in taken)
                key = (left, slices, -start, g)
                if best is None or key < best[0]:
                    best = (key, Hold(job, g, start, profile.name, now_s + left))
        return None if best is None else best[1]
