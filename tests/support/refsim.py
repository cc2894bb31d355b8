"""An independent reference simulator of the replay's baselines, to check the replay against (not a test module).

It shares no code with ``flexmig.replay`` or ``flexmig.plan``: its own H200 placement table, its own event loop,
its own queue disciplines and its own placement of every policy, written from the rules as the replay's
documentation states them (docs/replay.md), in the simplest way that is still fast enough. Only the job list
(trace rows mapped to jobs) is taken as input. If both implementations read the rules the same way they agree job
for job; the check in ``tests/replay/test_replay_reference.py`` and ``bench/reference.py`` is that they agree within 5%
in mean completion time.

The rules implemented:

* **events**: at one time, completions first, then arrivals (in arrival, then name, order), then one scheduling
  pass. A job that cannot run on the empty node is dropped at arrival. When nothing runs, nothing is left to arrive
  and the queue cannot start, the queue is dropped.
* **a pass** tries the queue in arrival order. EASY: the first job that does not fit is the head; its start time
  ``T`` is found by letting the running jobs end in end order (all jobs ending at one time together) until it fits;
  a later job may start if it fits and ends by ``T``, or if the head still fits at ``T`` with it running. Its
  placement is the policy's first choice, or, if that keeps the head from fitting at ``T``, the first choice among
  GPUs other than those the head would take at ``T``. Greedy: every job that fits starts.
* **costs**: each instance created or destroyed in a pass costs ``reconfigure_s``, one after another; a job starts
  when the creates and destroys of the pass up to its own are done. Run-time estimates (for ``T``) are exact and
  ignore those delays.
* **static**: a fixed layout; a job's ranks all take free instances of one profile, the smallest profile that
  covers the rank and has room for all of them; each rank the free instance on a busy GPU before an idle one, then
  the lowest GPU, then the lowest start.
* **drain** (strong): ranks take free instances only on busy GPUs (the smallest covering profile with room for all
  ranks, lowest GPU and start); else ranks of the job's own profile, each on a free one of a busy GPU or else on an
  idle GPU re-laid out as: the job's ranks still to place, then the waiting jobs' ranks in queue order (the first 32
  waiting jobs not started), each instance at the highest start it may take if it still fits, then the largest
  instances that fit (most compute, then most memory) until none does; the idle GPU needing the fewest creates and
  destroys (then the lowest) is taken, and the rank takes the highest-start instance of its profile there.
* **fluid**: one pool of compute slices. **repack**: whole instances, re-packed onto the GPUs for free whenever
  a job starts (a set of jobs fits when some assignment of its instances to GPUs and starts is valid).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["PROFILES", "RefJob", "RefResult", "simulate"]


@dataclass(frozen=True, slots=True)
class RefProfile:
    """One H200 GPU-instance profile: compute slices, memory slices, allowed starts, instances per GPU."""

    name: str
    compute: int
    memory: int
    starts: tuple[int, ...]
    most: int
    mem_mib: int


PROFILES: dict[str, RefProfile] = {
    p.name: p
    for p in (
        RefProfile("1g.18gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, 16384),
        RefProfile("1g.35gb", 1, 2, (0, 2, 4, 6), 4, 33024),
        RefProfile("2g.35gb", 2, 2, (0, 2, 4), 3, 33024),
        RefProfile("3g.71gb", 3, 4, (0, 4), 2, 71168),
        RefProfile("4g.71gb", 4, 4, (0,), 1, 71168),
        RefProfile("7g.141gb", 7, 8, (0,), 1, 143104),
    )
}
_COMPUTE, _INSTANCES = 7, 7


@dataclass(frozen=True, slots=True)
class RefJob:
    """A job: ``ranks`` ranks of ``profile`` arriving at ``arrival_s``, running ``runtime_s``."""

    name: str
    arrival_s: float
    runtime_s: float
    profile: str
    ranks: int = 1


@dataclass
class RefResult:
    """Start and end of every job that ran (by name), and the jobs that never could."""

    start: dict[str, float] = field(default_factory=dict)
    end: dict[str, float] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def mean_jct(self, jobs: Sequence[RefJob]) -> float:
        """Mean of end minus arrival over the jobs that ran."""
        ran = [j for j in jobs if j.name in self.end]
        return sum(self.end[j.name] - j.arrival_s for j in ran) / len(ran) if ran else 0.0


# ------------------------------------------------------------------------------------------ one GPU
Inst = tuple[int, str]  # (start, profile name)


def _can_add(layout: Sequence[Inst], name: str, start: int) -> bool:
    p = PROFILES[name]
    if start not in p.starts or len(layout) >= _INSTANCES:
        return False
    if sum(1 for _, q in layout if q == name) >= p.most:
        return False
    if sum(PROFILES[q].compute for _, q in layout) + p.compute > _COMPUTE:
        return False
    mine = set(range(start, start + p.memory))
    return all(not mine & set(range(s, s + PROFILES[q].memory)) for s, q in layout)


def _covers(big: str, small: str) -> bool:
    a, b = PROFILES[big], PROFILES[small]
    return a.compute >= b.compute and a.mem_mib >= b.mem_mib


def _covering(name: str) -> list[str]:
    return sorted((p for p in PROFILES if _covers(p, name)), key=lambda p: (PROFILES[p].compute, PROFILES[p].memory))


def _drain_target(wanted: Sequence[str]) -> list[Inst]:
    layout: list[Inst] = []
    for name in wanted:
        starts = [s for s in PROFILES[name].starts if _can_add(layout, name, s)]
        if starts:
            layout.append((max(starts), name))
    fill = sorted(PROFILES, key=lambda p: (-PROFILES[p].compute, -PROFILES[p].memory))
    while True:
        for name in fill:
            starts = [s for s in PROFILES[name].starts if _can_add(layout, name, s)]
            if starts:
                layout.append((max(starts), name))
                break
        else:
            return sorted(layout)


# ---------------------------------------------------------------------------------------- node states
@dataclass
class _Node:
    """GPU layouts and who holds which instance (static, drain), or held slices and instances (fluid, repack)."""

    layouts: list[list[Inst]]
    owner: list[dict[int, str]]  # gpu -> start -> job
    held: dict[str, list[str]] = field(default_factory=dict)  # job -> its ranks' profiles (fluid, repack)

    def copy(self) -> _Node:
        return _Node([list(lay) for lay in self.layouts], [dict(o) for o in self.owner], dict(self.held))

    def busy(self, g: int) -> bool:
        return bool(self.owner[g])

    def release(self, job: str) -> None:
        for o in self.owner:
            for s in [s for s, j in o.items() if j == job]:
                del o[s]
        self.held.pop(job, None)


class _Policy:
    """How jobs fit under one policy: ``place`` changes the node and returns the reconfiguration ops, or None."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus

    def place(
        self, node: _Node, job: RefJob, gpus: Iterable[int], waiting: Sequence[RefJob]
    ) -> tuple[int, set[int]] | None:
        raise NotImplementedError

    def empty(self, initial: Sequence[Sequence[Inst]]) -> _Node:
        return _Node([list(x) for x in initial], [{} for _ in initial])


def _free_on(node: _Node, g: int, name: str) -> list[int]:
    return sorted(s for s, q in node.layouts[g] if q == name and s not in node.owner[g])


class _Static(_Policy):
    def place(
        self, node: _Node, job: RefJob, gpus: Iterable[int], waiting: Sequence[RefJob]
    ) -> tuple[int, set[int]] | None:
        gs = list(gpus)
        for name in _covering(job.profile):
            trial = node.copy()
            got: list[tuple[int, int]] = []
            for _ in range(job.ranks):
                options = [(not trial.busy(g), g, s) for g in gs for s in _free_on(trial, g, name)]
                if not options:
                    break
                _, g, s = min(options)
                trial.owner[g][s] = job.name
                got.append((g, s))
            if len(got) == job.ranks:
                node.layouts, node.owner = trial.layouts, trial.owner
                return 0, {g for g, _ in got}
        return None


class _Drain(_Policy):
    def place(
        self, node: _Node, job: RefJob, gpus: Iterable[int], waiting: Sequence[RefJob]
    ) -> tuple[int, set[int]] | None:
        gs = list(gpus)
        for name in _covering(job.profile):
            trial = node.copy()
            got: list[int] = []
            for _ in range(job.ranks):
                options = [(g, s) for g in gs if trial.busy(g) for s in _free_on(trial, g, name)]
                if not options:
                    break
                g, s = min(options)
                trial.owner[g][s] = job.name
                got.append(g)
            if len(got) == job.ranks:
                node.layouts, node.owner = trial.layouts, trial.owner
                return 0, set(got)
        trial = node.copy()
        ops = 0
        used: set[int] = set()
        for r in range(job.ranks):
            options = [(g, s) for g in gs if trial.busy(g) for s in _free_on(trial, g, job.profile)]
            if options:
                g, s = min(options)
            else:
                idle = [g for g in gs if not trial.busy(g)]
                if not idle:
                    return None
                wanted = [job.profile] * (job.ranks - r)
                for w in waiting[:32]:
                    wanted += [w.profile] * w.ranks
                target = _drain_target(wanted)
                want = set(target)

                def steps(g: int, want: set[Inst] = want) -> int:
                    have = set(trial.layouts[g])
                    return len(have - want) + len(want - have)

                g = min(idle, key=lambda g: (steps(g), g))
                ops += steps(g)
                trial.layouts[g] = list(target)
                s = max(s for s, q in target if q == job.profile)
            trial.owner[g][s] = job.name
            used.add(g)
        node.layouts, node.owner = trial.layouts, trial.owner
        return ops, used


class _Fluid(_Policy):
    def place(
        self, node: _Node, job: RefJob, gpus: Iterable[int], waiting: Sequence[RefJob]
    ) -> tuple[int, set[int]] | None:
        used = sum(PROFILES[p].compute for ps in node.held.values() for p in ps)
        if used + PROFILES[job.profile].compute * job.ranks > _COMPUTE * self.gpus:
            return None
        node.held[job.name] = [job.profile] * job.ranks
        return 0, set()


class _Repack(_Policy):
    def __init__(self, gpus: int) -> None:
        super().__init__(gpus)
        self._memo: dict[tuple[str, ...], bool] = {}

    def packs(self, profiles: Sequence[str]) -> bool:
        """Some assignment of the instances to GPUs and starts is valid (exhaustive, memoised)."""
        key = tuple(sorted(profiles, key=lambda p: (-PROFILES[p].compute, -PROFILES[p].memory, p)))
        got = self._memo.get(key)
        if got is None:
            if sum(PROFILES[p].compute for p in key) > _COMPUTE * self.gpus:
                got = False
            else:
                got = self._assign(list(key), [[] for _ in range(self.gpus)])
            self._memo[key] = got
        return got

    def _assign(self, todo: list[str], gpus: list[list[Inst]]) -> bool:
        if not todo:
            return True
        name, rest = todo[0], todo[1:]
        seen: set[tuple[Inst, ...]] = set()
        for lay in gpus:
            state = tuple(sorted(lay))
            if state in seen:  # alike GPUs: trying one is enough
                continue
            seen.add(state)
            for s in PROFILES[name].starts:
                if _can_add(lay, name, s):
                    lay.append((s, name))
                    if self._assign(rest, gpus):
                        lay.pop()
                        return True
                    lay.pop()
        return False

    def place(
        self, node: _Node, job: RefJob, gpus: Iterable[int], waiting: Sequence[RefJob]
    ) -> tuple[int, set[int]] | None:
        now = [p for ps in node.held.values() for p in ps]
        mine = [job.profile] * job.ranks
        if not self.packs(now + mine):
            return None
        node.held[job.name] = mine
        return 0, set()


def _policy(name: str, gpus: int) -> _Policy:
    return {"static": _Static, "drain": _Drain, "fluid": _Fluid, "repack": _Repack}[name](gpus)


# --------------------------------------------------------------------------------------------- the run
def simulate(
    jobs: Sequence[RefJob],
    policy: str,
    gpus: int,
    discipline: str = "easy",
    layout: Sequence[Inst] = (),
    reconfigure_s: float = 2.0,
) -> RefResult:
    """Replay ``jobs`` under ``policy`` (static, drain, fluid, repack) and ``discipline`` (easy, greedy) on
    ``gpus`` H200s, starting from ``layout`` on every GPU (static: the fixed layout)."""
    rule = _policy(policy, gpus)
    node = rule.empty([list(layout) for _ in range(gpus)])
    empty = rule.empty([list(layout) if policy == "static" else [] for _ in range(gpus)])
    arrivals = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    result = RefResult()
    queue: list[RefJob] = []
    ends: dict[str, float] = {}
    heap: list[tuple[float, str]] = []
    i = 0
    while i < len(arrivals) or heap:
        t = min(arrivals[i].arrival_s if i < len(arrivals) else math.inf, heap[0][0] if heap else math.inf)
        while heap and heap[0][0] <= t:
            _, name = heapq.heappop(heap)
            node.release(name)
            del ends[name]
        while i < len(arrivals) and arrivals[i].arrival_s <= t:
            job = arrivals[i]
            i += 1
            if rule.place(empty.copy(), job, range(gpus), ()) is None:
                result.dropped.append(job.name)
            else:
                queue.append(job)
        started = _pass(rule, node, queue, ends, t, discipline, gpus, reconfigure_s)
        for name, delay in started:
            job = next(j for j in queue if j.name == name)
            result.start[name] = t + delay
            result.end[name] = t + delay + job.runtime_s
            ends[name] = result.end[name]  # what later passes' estimates see: the true end
            heapq.heappush(heap, (result.end[name], name))
        if started:
            names = {n for n, _ in started}
            queue = [j for j in queue if j.name not in names]
        if queue and not heap and i >= len(arrivals):
            result.dropped += [j.name for j in queue]
            queue = []
    return result


def _pass(
    rule: _Policy,
    node: _Node,
    queue: list[RefJob],
    ends: dict[str, float],
    now: float,
    discipline: str,
    gpus: int,
    reconfigure_s: float,
) -> list[tuple[str, float]]:
    started: list[tuple[str, float]] = []
    done: set[str] = set()
    ops = 0
    head: RefJob | None = None
    head_t = math.inf
    head_gpus: set[int] = set()
    est = dict(ends)  # end estimates: running jobs and those started in this pass

    def waiting_after(job: RefJob) -> list[RefJob]:
        return [w for w in queue if w.name != job.name and w.name not in done]

    def fits_at(t: float, job: RefJob, view: _Node, extra: dict[str, float]) -> set[int] | None:
        """Where ``job`` would go at ``t`` on ``view`` once every job ending by then has ended."""
        future = view.copy()
        for name, end in {**est, **extra}.items():
            if end <= t:
                future.release(name)
        got = rule.place(future, job, range(gpus), waiting_after(job))
        return None if got is None else got[1]

    for job in queue:
        if head is None:
            trial = node.copy()
            got = rule.place(trial, job, range(gpus), waiting_after(job))
            if got is not None:
                _take(node, trial)
                ops += got[0]
                started.append((job.name, ops * reconfigure_s))
                done.add(job.name)
                est[job.name] = now + job.runtime_s  # estimates made in a pass leave the pass's delays out
                continue
            if discipline == "greedy":
                continue
            head = job
            for t in sorted(set(est.values())):
                where = fits_at(t, job, node, {})
                if where is not None:
                    head_t, head_gpus = max(t, now), where
                    break
            continue
        end = now + job.runtime_s
        for avoid in (set(), head_gpus):
            if avoid is head_gpus and not head_gpus:
                break
            trial = node.copy()
            got = rule.place(trial, job, [g for g in range(gpus) if g not in avoid], waiting_after(job))
            if got is None:
                break
            if head_t != math.inf and end > head_t and fits_at(head_t, head, trial, {job.name: end}) is None:
                continue  # the head would no longer fit at its start
            _take(node, trial)
            ops += got[0]
            started.append((job.name, ops * reconfigure_s))
            done.add(job.name)
            est[job.name] = end
            break
    return started


def _take(node: _Node, trial: _Node) -> None:
    node.layouts, node.owner, node.held = trial.layouts, trial.owner, trial.held
