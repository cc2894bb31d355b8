"""The discrete-event replay: jobs arrive, queue, start, move and end in simulated time.

Deterministic: events at equal times are handled completions first, then arrivals in trace order, then one
scheduling pass; nothing reads a clock or draws a random number here. Progress of a job is tracked in nominal
seconds of work: it runs at its grant's speed (1.0; the spread efficiency; below 1 when narrow) once its grant's
delay (the plan's reconfiguration and move costs before it) has passed, and ends when its work is done.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flexmig.errors import PlanRejectedError
from flexmig.plan.types import JobRequest, RankNeed
from flexmig.replay.managers import Grant, Manager, RunView
from flexmig.replay.trace import TraceJob

__all__ = ["SIZE_CLASSES", "JobOutcome", "Replay", "Sample", "replay", "request_for", "size_class"]

SIZE_CLASSES: tuple[str, ...] = ("share", "whole", "multi")
"""Job size classes in the figures: a share of one GPU, one whole GPU, several GPUs."""


def size_class(job: TraceJob) -> str:
    """``share`` (a fraction of one GPU), ``whole`` (one whole GPU) or ``multi`` (several GPUs), by what the trace
    row asked for."""
    if job.ranks > 1:
        return "multi"
    return "whole" if job.gpu_milli >= 1000 else "share"


def request_for(job: TraceJob, *, malleable: bool = False) -> JobRequest:
    """The queue entry of a trace job: its nominal shape, elastic range and true run time; with ``malleable``, an
    elastic job may also run below its nominal compute, down to one rank."""
    ranks_max = job.ranks * job.profile.compute_slices if job.elastic else job.ranks
    return JobRequest(
        name=job.name,
        need=RankNeed(profile=job.profile.name),
        ranks=job.ranks,
        min_ranks=1 if job.elastic else job.ranks,
        max_ranks=max(ranks_max, job.ranks),
        submitted_s=job.arrival_s,
        expected_runtime_s=job.runtime_s,
        malleable=malleable and job.elastic,
    )


@dataclass(frozen=True, slots=True)
class Sample:
    """The node right after the events at ``t``: compute slices the running jobs asked for, jobs waiting,
    fragmentation."""

    t: float
    used_slices: int
    queued: int
    fragmentation: float


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one job (times in seconds of simulated time): when it arrived, first ran and ended, how
    often it moved, whether it started spread or narrow, its nominal run time and its size class."""

    name: str
    arrival_s: float
    start_s: float | None
    end_s: float | None
    moves: int
    resplits: int
    spread_start: bool
    runtime_s: float = 0.0
    size: str = "share"
    narrow_start: bool = False

    @property
    def jct_s(self) -> float | None:
        """Completion time: end minus arrival."""
        return None if self.end_s is None else self.end_s - self.arrival_s

    @property
    def wait_s(self) -> float | None:
        """Time from arrival to first running."""
        return None if self.start_s is None else self.start_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class Replay:
    """The raw outcome of one replay (metrics are computed by :mod:`flexmig.replay.metrics`)."""

    capacity_slices: int
    records: tuple[JobOutcome, ...]
    unplaceable: tuple[str, ...]
    samples: tuple[Sample, ...]
    migrations: int
    resplits: int
    busy_slice_seconds: float
    fragmentation_integral: float
    first_arrival_s: float
    last_end_s: float


@dataclass(slots=True)
class _Run:
    request: JobRequest
    arrival_s: float
    work_left: float
    speed: float = 1.0
    mark_s: float = 0.0
    resume_s: float = 0.0
    end_s: float = math.inf
    start_s: float | None = None
    last_moved_s: float = 0.0
    version: int = 0
    moves: int = 0
    resplits: int = 0
    spread_start: bool = False
    narrow_start: bool = False
    slices: int = 0
    useful: int = 0  # slices that do the job's work: what it holds, at most its nominal compute
    busy: float = 0.0

    def advance(self, now: float) -> None:
        begin = max(self.mark_s, self.resume_s)
        if now > begin:
            self.work_left = max(0.0, self.work_left - (now - begin) * self.speed)
            self.busy += (now - begin) * self.useful
        self.mark_s = max(self.mark_s, now)

    def remaining(self, now: float) -> float:
        wait = max(0.0, self.resume_s - now)
        begin = max(self.mark_s, self.resume_s)
        done = max(0.0, now - begin) * self.speed
        return wait + max(0.0, self.work_left - done) / self.speed


@dataclass(slots=True)
class _Totals:
    migrations: int = 0
    resplits: int = 0
    busy: float = 0.0
    frag: float = 0.0
    samples: list[Sample] = field(default_factory=list)


@dataclass(slots=True)
class _Sim:
    """The replay's state between events: the queue, the running and finished jobs, and the end-time heap."""

    order: list[TraceJob]
    manager: Manager
    tick: Callable[[int], None]
    malleable: bool
    by_name: dict[str, TraceJob] = field(default_factory=dict)
    queue: list[JobRequest] = field(default_factory=list)
    running: dict[str, _Run] = field(default_factory=dict)
    done: dict[str, _Run] = field(default_factory=dict)
    unplaceable: list[str] = field(default_factory=list)
    heap: list[tuple[float, int, str]] = field(default_factory=list)
    tot: _Totals = field(default_factory=_Totals)
    arrived: int = 0  # jobs of ``order`` that have arrived

    def next_event(self) -> float:
        """The time of the next completion or arrival (infinity when there is none); drops stale heap entries."""
        heap, running = self.heap, self.running
        while heap and (heap[0][2] not in running or running[heap[0][2]].version != heap[0][1]):
            heapq.heappop(heap)
        t_arr = self.order[self.arrived].arrival_s if self.arrived < len(self.order) else math.inf
        t_end = heap[0][0] if heap else math.inf
        return min(t_arr, t_end)

    def complete(self, t: float) -> None:
        """Every job whose end is at or before ``t`` ends: its instances go back to the manager."""
        heap = self.heap
        while heap and heap[0][0] <= t:
            _, version, name = heapq.heappop(heap)
            run = self.running.get(name)
            if run is None or run.version != version:
                continue
            del self.running[name]
            run.advance(run.end_s)
            self.done[name] = run
            self.tot.busy += run.busy
            self.manager.release(name)
            self.tick(1)

    def arrive(self, t: float) -> None:
        """Every job arriving at or before ``t`` joins the queue, or is set aside if it can never run here."""
        order = self.order
        while self.arrived < len(order) and order[self.arrived].arrival_s <= t:
            req = request_for(order[self.arrived], malleable=self.malleable)
            self.arrived += 1
            self.tick(1)
            if self.manager.placeable(req):
                self.queue.append(req)
            else:
                self.unplaceable.append(req.name)
                self.tick(1)

    def schedule(self, t: float) -> None:
        """One scheduling pass: the manager's grants start and move jobs; a queue that can never start (nothing
        runs, nothing arrives, nothing was granted) is set aside as unplaceable."""
        views = {
            name: RunView(run.request, run.remaining(t), run.last_moved_s, run.speed)
            for name, run in self.running.items()
        }
        grants = self.manager.schedule(t, self.queue, views)
        if grants:
            started = _apply(
                grants, t, self.queue, running=self.running, by_name=self.by_name, heap=self.heap, tot=self.tot
            )
            if started:
                self.queue = [r for r in self.queue if r.name not in started]
        if self.queue and not self.running and not grants and self.arrived >= len(self.order):
            self.unplaceable.extend(r.name for r in self.queue)
            for _ in self.queue:
                self.tick(1)
            self.queue = []

    def records(self) -> list[JobOutcome]:
        """One outcome per job, in arrival order."""
        out = []
        for j in self.order:
            run = self.done.get(j.name)
            size = size_class(j)
            if run is None:
                out.append(JobOutcome(j.name, j.arrival_s, None, None, 0, 0, False, j.runtime_s, size))
                continue
            out.append(
                JobOutcome(
                    j.name,
                    j.arrival_s,
                    run.start_s,
                    run.end_s,
                    run.moves,
                    run.resplits,
                    run.spread_start,
                    j.runtime_s,
                    size,
                    run.narrow_start,
                )
            )
        return out


def replay(
    jobs: Sequence[TraceJob],
    manager: Manager,
    capacity_slices: int,
    mix: dict[str, float],
    progress: Callable[[int], None] | None = None,
    *,
    malleable: bool = False,
) -> Replay:
    """Replay ``jobs`` (in arrival order) on ``manager``; ``mix`` weighs profiles in the fragmentation figure.

    ``progress`` is called with 1 for every job that arrives and every job that ends (2 per job in all).
    ``malleable``: elastic jobs may run below their nominal compute (:func:`request_for`).
    """
    order = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    sim = _Sim(order, manager, progress or (lambda _n: None), malleable, by_name={j.name: j for j in order})
    if len(sim.by_name) != len(order):
        raise PlanRejectedError("trace has duplicate job names")
    tot = sim.tot
    last_t = order[0].arrival_s if order else 0.0
    frag = 0.0
    # Events at one time: completions first, then arrivals, then one scheduling pass; then a sample of the node.
    while (t := sim.next_event()) != math.inf:
        tot.frag += frag * (t - last_t)
        last_t = t
        sim.complete(t)
        sim.arrive(t)
        sim.schedule(t)
        frag = manager.fragmentation(mix)
        tot.samples.append(Sample(t, sum(r.useful for r in sim.running.values()), len(sim.queue), frag))
    records = sim.records()
    ends = [r.end_s for r in records if r.end_s is not None]
    return Replay(
        capacity_slices=capacity_slices,
        records=tuple(records),
        unplaceable=tuple(sim.unplaceable),
        samples=tuple(tot.samples),
        migrations=tot.migrations,
        resplits=tot.resplits,
        busy_slice_seconds=tot.busy,
        fragmentation_integral=tot.frag,
        first_arrival_s=order[0].arrival_s if order else 0.0,
        last_end_s=max(ends) if ends else (order[0].arrival_s if order else 0.0),
    )


def _apply(
    grants: Sequence[Grant],
    t: float,
    queue: Sequence[JobRequest],
    *,
    running: dict[str, _Run],
    by_name: dict[str, TraceJob],
    heap: list[tuple[float, int, str]],
    tot: _Totals,
) -> set[str]:
    waiting = {r.name: r for r in queue}
    started: set[str] = set()
    for g in grants:
        if g.kind == "start":
            req = waiting.get(g.job)
            if req is None or g.job in running:
                raise PlanRejectedError(f"t={t}: {g.job!r} started but not waiting")
            job = by_name[g.job]
            run = _Run(req, job.arrival_s, job.runtime_s, mark_s=t)
            run.start_s = t + g.delay_s
            run.spread_start = g.speed < 1.0 and g.slices >= job.compute_slices
            run.narrow_start = g.slices < job.compute_slices
            running[g.job] = run
            started.add(g.job)
        else:
            moved = running.get(g.job)
            if moved is None:
                raise PlanRejectedError(f"t={t}: {g.job!r} moved but not running")
            run = moved
            run.advance(t)
            run.moves += 1
            if g.kind == "resplit":
                run.resplits += 1
                tot.resplits += 1
            else:
                tot.migrations += 1
        run.speed = g.speed
        run.resume_s = t + g.delay_s
        run.mark_s = t
        run.last_moved_s = t
        run.slices = g.slices
        run.useful = min(g.slices, by_name[g.job].compute_slices)
        run.version += 1
        run.end_s = run.resume_s + run.work_left / run.speed
        heapq.heappush(heap, (run.end_s, run.version, g.job))
    return started
