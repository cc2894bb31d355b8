"""The discrete-event replay: jobs arrive, queue, start, move and end in simulated time.

Deterministic: events at equal times are handled completions first, then arrivals in trace order, then one
scheduling pass; nothing reads a clock or draws a random number here. Progress of a job is tracked in nominal
seconds of work: it runs at its grant's speed (1.0, or the spread efficiency) once its grant's delay (the plan's
reconfiguration and move costs before it) has passed, and ends when its work is done.
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

__all__ = ["JobOutcome", "Replay", "Sample", "replay", "request_for"]


def request_for(job: TraceJob) -> JobRequest:
    """The queue entry of a trace job: its nominal shape, elastic range and true run time."""
    ranks_max = job.ranks * job.profile.compute_slices if job.elastic else job.ranks
    return JobRequest(
        name=job.name,
        need=RankNeed(profile=job.profile.name),
        ranks=job.ranks,
        min_ranks=1 if job.elastic else job.ranks,
        max_ranks=max(ranks_max, job.ranks),
        submitted_s=job.arrival_s,
        expected_runtime_s=job.runtime_s,
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
    """What happened to one job (times in seconds of simulated time)."""

    name: str
    arrival_s: float
    start_s: float | None
    end_s: float | None
    moves: int
    resplits: int
    spread_start: bool

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
    slices: int = 0
    ran_s: float = 0.0

    def advance(self, now: float) -> None:
        begin = max(self.mark_s, self.resume_s)
        if now > begin:
            self.work_left = max(0.0, self.work_left - (now - begin) * self.speed)
            self.ran_s += now - begin
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


def replay(
    jobs: Sequence[TraceJob],
    manager: Manager,
    capacity_slices: int,
    mix: dict[str, float],
    progress: Callable[[int], None] | None = None,
) -> Replay:
    """Replay ``jobs`` (in arrival order) on ``manager``; ``mix`` weighs profiles in the fragmentation figure.

    ``progress`` is called with 1 for every job that arrives and every job that ends (2 per job in all).
    """
    order = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    by_name = {j.name: j for j in order}
    if len(by_name) != len(order):
        raise PlanRejectedError("trace has duplicate job names")
    queue: list[JobRequest] = []
    running: dict[str, _Run] = {}
    done: dict[str, _Run] = {}
    unplaceable: list[str] = []
    heap: list[tuple[float, int, str]] = []
    tot = _Totals()
    tick = progress or (lambda _n: None)
    i = 0
    last_t = order[0].arrival_s if order else 0.0
    used = 0
    frag = 0.0
    while True:
        while heap and (heap[0][2] not in running or running[heap[0][2]].version != heap[0][1]):
            heapq.heappop(heap)
        t_arr = order[i].arrival_s if i < len(order) else math.inf
        t_end = heap[0][0] if heap else math.inf
        t = min(t_arr, t_end)
        if t == math.inf:
            break
        tot.frag += frag * (t - last_t)
        last_t = t
        while heap and heap[0][0] <= t:
            _, version, name = heapq.heappop(heap)
            run = running.get(name)
            if run is None or run.version != version:
                continue
            del running[name]
            run.advance(run.end_s)
            done[name] = run
            used -= by_name[name].compute_slices
            tot.busy += by_name[name].compute_slices * run.ran_s
            manager.release(name)
            tick(1)
        while i < len(order) and order[i].arrival_s <= t:
            req = request_for(order[i])
            i += 1
            tick(1)
            if manager.placeable(req):
                queue.append(req)
            else:
                unplaceable.append(req.name)
                tick(1)
        views = {
            name: RunView(run.request, run.remaining(t), run.last_moved_s, run.speed) for name, run in running.items()
        }
        grants = manager.schedule(t, queue, views)
        if grants:
            started = _apply(grants, t, queue, running=running, by_name=by_name, heap=heap, tot=tot)
            if started:
                queue = [r for r in queue if r.name not in started]
                used += sum(by_name[name].compute_slices for name in started)
        if queue and not running and not grants and i >= len(order):
            # Nothing runs, nothing arrives, and the queue cannot start: those jobs can never run here.
            unplaceable.extend(r.name for r in queue)
            for _ in queue:
                tick(1)
            queue = []
        frag = manager.fragmentation(mix)
        tot.samples.append(Sample(t, used, len(queue), frag))

    records = []
    for j in order:
        run = done.get(j.name)
        if run is None:
            records.append(JobOutcome(j.name, j.arrival_s, None, None, 0, 0, False))
        else:
            records.append(
                JobOutcome(j.name, j.arrival_s, run.start_s, run.end_s, run.moves, run.resplits, run.spread_start)
            )
    ends = [r.end_s for r in records if r.end_s is not None]
    return Replay(
        capacity_slices=capacity_slices,
        records=tuple(records),
        unplaceable=tuple(unplaceable),
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
            run.spread_start = g.speed < 1.0
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
        run.version += 1
        run.end_s = run.resume_s + run.work_left / run.speed
        heapq.heappush(heap, (run.end_s, run.version, g.job))
    return started
