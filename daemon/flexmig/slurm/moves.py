"""Which running hook jobs to move so that a waiting job gets the room it needs (one Slurm node per MIG instance).

Carving (:mod:`flexmig.plan.carving`) only re-cuts idle instances: a waiting job whose profile fits nowhere in the
free slices waits until the busy instances of some placement end by themselves (a 7g job for every small job on a
GPU), while other GPUs, of this host or another, have room those small jobs could run in. A move checkpoints such
a job and requeues it (as the whole-node mode does for a re-registration); Slurm restarts it on a free instance of
any host, where it resumes right after its acknowledged step, and the room it left goes to the waiting job.

The decision, for the waiting jobs in Slurm's priority order, the first that no free instance serves and no carving
of idle slices can serve (a blocked job):

* a **region** is a placement of its profile (host, GPU, start) that holds no closed instance (registering, an
  administrator's, or inside another job's held region);
* the jobs to move are the region's hook jobs (those that opted in and were moved fewer than ``max_moves_per_job``
  times) that would end later than the jobs that stay (by the time limits), the longest-running first, each as long
  as it finds a **target** outside the region now: a free instance of its profile or one carved from free slices
  and idle instances, on any host; the targets are chosen one after the other, so that two moved jobs never count
  on the same slices. The region is then free once the jobs that stay have ended (at once when none stays), and
  the caller holds it for the waiting job;
* the move is worth it when the waiting job's **gain**, the time it would otherwise wait (the earliest any of its
  placements empties, by the running jobs' time limits) less the time until the region is free, times its compute
  slices, exceeds what the moved jobs **lose**: each one's checkpoint, requeue and cold start times its compute
  slices;
* among the regions worth it, the one that gains the most over what it loses, then the one that moves the fewest,
  then the one the job holds already. The moves of earlier rounds are not wasted by it: they brought the held
  region's end forward, so the job's wait (the earliest any placement empties) is short, and another region gains
  over it only when its own end comes sooner still. A hold the carving took without a move (by the time limits
  alone, blind to which jobs may move) does not keep the moves from another region.

Why a region may keep jobs that stay: on a busy cluster a whole region of hook jobs with room elsewhere for all of
them at once is rare; moving the ones that would hold the region longest, as room appears, brings its end forward
round by round, and the hold keeps new work out of it meanwhile.

Why the fewest jobs: a move is the one step that can go wrong for a running job (its checkpoint may time out, it
may find its target taken), so two long 1g jobs on two GPUs and a 7g arriving is one move, the job whose GPU then
empties, never both.

Why a target may be room that a waiting job of the moved job's profile takes first: requeued, a job waits behind
every job already waiting (Slurm's ``batch_requeue_fini`` gives it the requeue's submit time and restarts its age),
so its target is often theirs and it restarts only when room comes again. Counting a target only after room for
each of them (``requeue_behind``) was tried: on the cluster mix (``bench/slurm_moves.py``, 2 hosts x 2 GPUs, half
hook jobs, seeds 161-200) it moved fewer jobs (4 a run, 6 before) and lengthened the 7g jobs' longest wait (600 s
against 564 s, median; 870 s against 806 s, worst) for the same utilisation; the waiting job gains its slices
either way, and the moved job, one of the smallest, waits its turn as it would have on arrival.

Pure: no I/O; the expected remaining times are computed by the caller at its own clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.layout import Layout, PlacedInstance

__all__ = ["MAX_MOVES_PER_JOB", "Blocked", "Move", "MovePlan", "Place", "Region", "Running", "plan_moves"]

MAX_MOVES_PER_JOB = 2
"""How often one job may be moved at most (``[slurm] max_moves_per_job``): a job is moved for another's gain, and
a bound keeps it from being moved again and again by a stream of big jobs."""

Place = tuple[str, int, int]
"""An instance's place in the cluster: ``(host, gpu, start)``."""


@dataclass(frozen=True, slots=True)
class Region:
    """A placement of ``profile`` at memory slice ``start`` of GPU ``gpu`` on ``host``."""

    host: str
    gpu: int
    start: int
    profile: str

    def covers(self, model: GpuModel, host: str, gpu: int, inst: PlacedInstance) -> bool:
        """True when ``inst`` on ``host``'s GPU ``gpu`` overlaps this region."""
        end = self.start + model.profile(self.profile).memory_slices
        return host == self.host and gpu == self.gpu and inst.start < end and self.start < inst.end


@dataclass(frozen=True, slots=True)
class Running:
    """A running job on one instance: where, its profile, whether it opted into the hook (``--requeue`` and
    ``flexmig:hook``, its hook set up), how often it was moved so far, the seconds to its time limit (None: no
    limit) and what a move costs it in seconds (checkpoint, requeue and cold start)."""

    name: str
    place: Place
    profile: str
    hook: bool
    moves: int
    remaining_s: float | None
    cost_s: float


@dataclass(frozen=True, slots=True)
class Blocked:
    """A waiting job, in Slurm's priority order: its name, the profile it asks for and how long it has waited."""

    name: str
    profile: str
    waited_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Move:
    """One job to checkpoint and requeue: it leaves ``source`` and can restart at ``target`` at once, an instance
    of its profile that is free there or (``create``) is made from free slices and idle instances."""

    job: str
    profile: str
    source: Place
    target: Place
    create: bool


@dataclass(frozen=True, slots=True)
class MovePlan:
    """A round's decision: the moves (none: nothing worth moving), the waiting job they make room for and its
    region, the gain and loss in slice-seconds, why, in words, and when the region is free (seconds from now by
    the time limits of the jobs that stay there; 0: once the moved jobs left)."""

    moves: tuple[Move, ...]
    waiting: str | None
    region: Region | None
    gain: float
    loss: float
    reason: str
    free_in_s: float = 0.0


_NONE = MovePlan((), None, None, 0.0, 0.0, "no waiting job is blocked")


def plan_moves(
    model: GpuModel,
    hosts: Mapping[str, Sequence[Layout]],
    running: Sequence[Running],
    waiting: Sequence[Blocked],
    *,
    max_moves_per_job: int = MAX_MOVES_PER_JOB,
    closed: frozenset[Place] = frozenset(),
    held: Sequence[tuple[str, Region]] = (),
    requeue_behind: bool = False,
    regions_on: str | None = None,
) -> MovePlan:
    """The moves that give the first blocked job of ``waiting`` its room, or an empty plan saying why not.

    ``hosts`` maps each host to its GPUs' layouts; ``running`` are the jobs on instances of them; ``closed`` are
    instances neither destroyed nor used as a target (registering, an administrator's); ``held`` are regions kept
    for waiting jobs (job, region): no move takes room there for another job. ``requeue_behind``: a target only
    after room for every waiting job of the moved job's profile (a rejected variant, see the module docstring).
    ``regions_on``: the waiting job's region only on that host (the host that moves: it can requeue only its own
    jobs), the moved jobs' targets on any host (Slurm restarts a requeued job on any); None: regions on any host.
    """
    if max_moves_per_job < 0:
        raise ValueError(f"plan_moves: max_moves_per_job must be at least 0, not {max_moves_per_job}")
    if regions_on is not None and regions_on not in hosts:
        raise ValueError(f"plan_moves: regions_on names host {regions_on!r}, which is not among the hosts")
    cluster = _Cluster(model, hosts, running, closed, held, ahead=waiting if requeue_behind else (), on_host=regions_on)
    for job in waiting:
        profile = model.profile(job.profile)
        if cluster.served(profile, job.name):
            continue
        return cluster.best(job, profile, max_moves_per_job)
    return _NONE


class _Cluster:
    """The hosts' layouts with their running jobs, as one decision sees them."""

    def __init__(
        self, model: GpuModel, hosts: Mapping[str, Sequence[Layout]], running: Sequence[Running],
        closed: frozenset[Place], held: Sequence[tuple[str, Region]], *, ahead: Sequence[Blocked] = (),
        on_host: str | None = None,
    ) -> None:  # fmt: skip
        self.model = model
        self.ahead = ahead
        self.on_host = on_host
        self.hosts = {h: list(lays) for h, lays in hosts.items()}
        self.on: dict[Place, Running] = {}
        for r in running:
            inst = self._at(r.place)
            if inst is None or inst.profile.name != r.profile:
                raise ValueError(f"plan_moves: job {r.name} runs on no {r.profile} instance at {r.place}")
            if r.place in self.on:
                raise ValueError(f"plan_moves: jobs {self.on[r.place].name} and {r.name} on one instance {r.place}")
            self.on[r.place] = r
        for p in closed:
            if self._at(p) is None:
                raise ValueError(f"plan_moves: no instance at {p} to keep closed")
        self.closed = closed
        self.held = tuple(held)

    def _at(self, place: Place) -> PlacedInstance | None:
        host, gpu, start = place
        lays = self.hosts.get(host)
        if lays is None or not 0 <= gpu < len(lays):
            return None
        return lays[gpu].at(start)

    def _fenced(self, job: str, host: str, gpu: int, inst: PlacedInstance) -> bool:
        return any(owner != job and r.covers(self.model, host, gpu, inst) for owner, r in self.held)

    def _fenced_at(self, job: str, host: str, gpu: int, profile: Profile, start: int) -> bool:
        return self._fenced(job, host, gpu, PlacedInstance(start, profile))

    def served(self, profile: Profile, job: str) -> bool:
        """True when a free instance of ``profile`` or a carving of idle slices serves ``job`` without a move."""
        for host, lays in self.hosts.items():
            for g, lay in enumerate(lays):
                for start in profile.starts:
                    if self._fenced_at(job, host, g, profile, start):
                        continue
                    inst = lay.at(start)
                    if inst is not None and inst.profile == profile and self._idle((host, g, start)):
                        return True
                    if self._carvable(lay, host, g, profile, start, taken=frozenset()):
                        return True
        return False

    def _idle(self, place: Place) -> bool:
        return place not in self.on and place not in self.closed

    def _overlap(self, lay: Layout, profile: Profile, start: int) -> list[PlacedInstance]:
        return [i for i in lay if i.start < start + profile.memory_slices and start < i.end]

    def _carvable(
        self, lay: Layout, host: str, g: int, profile: Profile, start: int, *, taken: frozenset[Place]
    ) -> Layout | None:
        """``lay`` with ``profile`` carved at ``start`` from free slices and idle instances (none in ``taken``),
        or None."""
        rest = lay
        for i in self._overlap(lay, profile, start):
            place = (host, g, i.start)
            if not self._idle(place) or place in taken:
                return None
            rest = rest.remove(i.start)
        return rest.place(profile, start) if rest.can_place(profile, start) else None

    def best(self, job: Blocked, profile: Profile, max_moves: int) -> MovePlan:
        """The most worthwhile move plan for the blocked ``job``, or an empty one saying why; of two as good, the
        one in the region the job holds already."""
        own = [r for owner, r in self.held if owner == job.name and r.profile == profile.name]
        regions = [
            Region(host, g, start, profile.name)
            for host, lays in self.hosts.items()
            if self.on_host is None or host == self.on_host
            for g in range(len(lays))
            for start in profile.starts
            if Layout.empty(self.model).can_place(profile, start)
            and not self._fenced_at(job.name, host, g, profile, start)
        ]
        wait = min((self._empties_in(profile, r) for r in regions), default=math.inf)
        found: tuple[tuple[float, int, bool, int], MovePlan] | None = None
        why = f"{job.name}: {profile.name} has no region whose hook jobs may move"
        for order, region in enumerate(regions):
            plan = self._region(job, profile, region, max_moves, wait)
            if isinstance(plan, str):
                why = plan or why
                continue
            key = (plan.loss - plan.gain, len(plan.moves), region not in own, order)
            if found is None or key < found[0]:
                found = (key, plan)
        return found[1] if found is not None else MovePlan((), job.name, None, 0.0, 0.0, why)

    def _empties_in(self, profile: Profile, region: Region) -> float:
        """Seconds until ``region`` is free of busy instances by their limits (closed ones never are)."""
        left = 0.0
        for i in self._overlap(self.hosts[region.host][region.gpu], profile, region.start):
            place = (region.host, region.gpu, i.start)
            if place in self.closed:
                return math.inf
            if place in self.on:
                r = self.on[place].remaining_s
                left = max(left, math.inf if r is None else max(r, 0.0))
        return left

    def _region(self, job: Blocked, profile: Profile, region: Region, max_moves: int, wait: float) -> MovePlan | str:
        """The plan that empties ``region`` for ``job`` soonest: its hook jobs that may move and end later than the
        jobs that stay, the longest-running first, as long as each finds a target elsewhere; or why not (empty:
        nothing there to move). The region is then free once the jobs that stay end (by their limits)."""
        lay = self.hosts[region.host][region.gpu]
        stay = 0.0
        movable: list[Running] = []
        for i in self._overlap(lay, profile, region.start):
            place = (region.host, region.gpu, i.start)
            if place in self.closed:
                return ""
            r = self.on.get(place)
            if r is None:
                continue
            left = math.inf if r.remaining_s is None else max(r.remaining_s, 0.0)
            if r.hook and r.moves < max_moves:
                movable.append(r)
            else:
                stay = max(stay, left)
        movable.sort(key=lambda r: -(math.inf if r.remaining_s is None else r.remaining_s))
        movers = [r for r in movable if (math.inf if r.remaining_s is None else r.remaining_s) > stay]
        if not movers:
            return ""
        moves, stay = self._targets(job, profile, region, movers, stay)
        if not moves:
            return f"{job.name}: no room elsewhere for {movers[0].name}"
        gain = (wait - stay) * profile.compute_slices
        loss = sum(self.on[m.source].cost_s * self.model.profile(m.profile).compute_slices for m in moves)
        names = ", ".join(m.job for m in moves)
        if not gain > loss:
            return f"{job.name}: moving {names} loses {loss:.0f} slice-s, more than the {gain:.0f} it gains"
        to = ", ".join(f"{m.job} to {m.target[0]} GPU {m.target[1]} @{m.target[2]}" for m in moves)
        after = "at once" if stay == 0 else f"in {stay:.0f} s, when the jobs that stay end"
        reason = (f"{job.name}: {profile.name}@{region.start} on {region.host} GPU {region.gpu} free {after}, "
                  f"moving {to} (gains {gain:.0f} slice-s, loses {loss:.0f})")  # fmt: skip
        return MovePlan(moves, job.name, region, gain, loss, reason, stay)

    def _targets(
        self, job: Blocked, profile: Profile, region: Region, movers: Sequence[Running], stay: float
    ) -> tuple[tuple[Move, ...], float]:
        """A target outside ``region`` for each of ``movers`` (the longest-running first) up to the first that
        finds none, none sharing slices; and when the region is then free (the latest end of what stays)."""
        lays = {h: list(ls) for h, ls in self.hosts.items()}
        g_lay = lays[region.host][region.gpu]
        for i in self._overlap(g_lay, profile, region.start):
            g_lay = g_lay.remove(i.start)
        lays[region.host][region.gpu] = g_lay.place(profile, region.start)
        taken: set[Place] = {(region.host, region.gpu, region.start)}
        out: list[Move] = []
        behind: set[str] = set()
        for r in movers:
            got = self._target(job, r, lays, taken) if self._behind(job, r.profile, lays, taken, behind) else None
            if got is None:
                return tuple(out), max(stay, math.inf if r.remaining_s is None else r.remaining_s)
            out.append(got)
        return tuple(out), stay

    def _behind(
        self, job: Blocked, profile: str, lays: dict[str, list[Layout]], taken: set[Place], done: set[str]
    ) -> bool:
        """Room taken first (in ``lays`` and ``taken``) for the waiting jobs of ``profile`` other than ``job``: a
        moved job waits again behind them, as Slurm gives a requeued job the requeue's submit time. False when they
        take all the room there is (a job of the profile moved now would not restart until one of them ends);
        ``done``: the profiles whose waiting jobs have their room already."""
        if profile in done:
            return True
        done.add(profile)
        for w in self.ahead:
            if w.profile == profile and w.name != job.name:
                got = self._target(job, Running(w.name, ("", -1, -1), profile, False, 0, None, 0.0), lays, taken)
                if got is None:
                    return False
        return True

    def _target(self, job: Blocked, r: Running, lays: dict[str, list[Layout]], taken: set[Place]) -> Move | None:
        """A free instance of ``r``'s profile, else the carving that destroys the fewest idle compute slices (then
        the highest start); recorded in ``lays`` and ``taken``."""
        profile = self.model.profile(r.profile)
        best: tuple[tuple[int, int], Place, Layout] | None = None
        for host, ls in lays.items():
            for g, lay in enumerate(ls):
                for inst in lay:
                    place = (host, g, inst.start)
                    if (inst.profile == profile and place not in taken and self._idle(place)
                            and not self._fenced(job.name, host, g, inst)):  # fmt: skip
                        taken.add(place)
                        return Move(r.name, r.profile, r.place, place, False)
                for start in profile.starts:
                    if self._fenced_at(job.name, host, g, profile, start):
                        continue
                    carved = self._carvable(lay, host, g, profile, start, taken=frozenset(taken))
                    if carved is None:
                        continue
                    lost = sum(i.profile.compute_slices for i in self._overlap(lay, profile, start))
                    key = (lost, -start)
                    if best is None or key < best[0]:
                        best = (key, (host, g, start), carved)
        if best is None:
            return None
        _, place, carved = best
        lays[place[0]][place[1]] = carved
        taken.add(place)
        return Move(r.name, r.profile, r.place, place, True)
