"""Whether to change a Slurm node's MIG layout now, given that Slurm cannot change a node's GPU GRES while any job
runs on it (the node must empty: every job ends, or is checkpointed and requeued, then the node is re-registered).

A change waits for the node to empty; meanwhile the node stays open to jobs that end in time (the caller closes it
with a reservation that starts when the running jobs' limits say the node will be empty). This module decides
*whether* to commit to a change, in compute slice-seconds (capacity times time), so a big job counts more than a
small one:

* **an idle node** is changed at once for any waiting job the new layout starts (the re-registration itself costs
  seconds and nothing runs), with no batching gate;
* **a busy node**: the change is a rent-or-buy choice. Waiting jobs the new layout would serve (and today's
  instances cannot) *pay rent*: each slice they need times how long they have waited (``gain``, the aging of the
  demand). Closing the node *buys*: the capacity lost while it empties (``cost``): each immovable job's slices
  idle between its expected end and the node's, the free slices closed meanwhile, and each movable job's
  checkpoint and restart. The change is committed once the rent reaches the price times
  ``settings.gain_ratio`` (the classic rent-or-buy rule, never worse than twice the best choice made in
  hindsight), or when a served job has waited ``cost.max_wait_s`` (nothing starves), and no sooner than
  ``cost.min_interval_s`` after the last change that closed the node (changes that close the node are batched);
* **expected remaining times** come from what Slurm knows: a job with a time limit is expected to end halfway
  between now and its limit (and surely by it); one without a limit is expected to run as long again as it has
  run (``elapsed``), at least ``cost.fixed_s``. ``close_by_s`` is the latest the node can be empty by the limits
  (None when a job without a limit and without the hook runs): where the caller starts its reservation.

Pure: time is passed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from flexmig.plan.types import CreateInstance, DestroyInstance, Instance, JobRequest, Plan, PlannerSettings, StartJob

__all__ = ["DrainHolder", "RegistrationCost", "Verdict", "changes_instances", "servable_now", "verdict"]


@dataclass(frozen=True, slots=True)
class DrainHolder:
    """A job on the node: its compute slices, the time to its limit (None: no limit), whether it can checkpoint,
    and how long it has run."""

    name: str
    compute_slices: int
    remaining_s: float | None
    movable: bool
    elapsed_s: float = 0.0

    def expected_left_s(self, floor_s: float) -> float:
        """Expected time until it ends by itself: half of what its limit leaves, or (no limit) its age."""
        if self.remaining_s is not None:
            return max(0.0, self.remaining_s) / 2.0
        return max(self.elapsed_s, floor_s)


@dataclass(frozen=True, slots=True)
class RegistrationCost:
    """What one re-registration costs beyond the jobs' own ends, and the rules that batch and bound changes.

    ``fixed_s``: closing, stopping slurmd, deleting and registering the node again (0.3 s on an idle single-node
    Slurm with the simulated driver, 1.7 s with a requeued job, measured by ``bench/slurm.py``; 5 s by default for a
    loaded controller and a real driver's instance changes); ``min_interval_s``: the shortest time between two
    changes that close a busy node; ``max_wait_s``: a waiting job the change serves never waits longer than this
    for the change to be committed; ``total_slices``: the node's compute slices (free ones are closed too).
    """

    fixed_s: float = 5.0
    min_interval_s: float = 60.0
    max_wait_s: float = 1800.0
    total_slices: int = 7


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to commit to a change for a plan, with the figures behind it (slice-seconds and seconds) and why.

    ``drain_s``: expected seconds until the node is empty and re-registered; ``close_by_s``: the latest the node is
    empty by its jobs' limits (seconds from now; None: a job without a limit runs); ``forced``: committed because a
    served job waited ``max_wait_s``, whatever the figures.
    """

    go: bool
    drain_s: float
    gain: float
    cost: float
    reason: str
    newly_served: tuple[str, ...] = ()
    close_by_s: float | None = 0.0
    forced: bool = False


def changes_instances(plan: Plan) -> bool:
    """True when the plan creates or destroys an instance (so the node must be re-registered)."""
    return any(isinstance(a, CreateInstance | DestroyInstance) for a in plan.actions)


def servable_now(pending: Sequence[JobRequest], free: Sequence[Instance]) -> set[str]:
    """Pending requests today's free instances can host, in queue order, each instance of exactly its profile
    (Slurm matches a GRES type exactly). Untyped requests take any free instance."""
    left = Counter(i.profile.name for i in free)
    out: set[str] = set()
    for req in pending:
        want = req.need.profile
        if want is None:
            if sum(left.values()) >= req.ranks:
                for _ in range(req.ranks):
                    name = next(n for n, c in left.items() if c > 0)
                    left[name] -= 1
                out.add(req.name)
            continue
        if left[want] >= req.ranks:
            left[want] -= req.ranks
            out.add(req.name)
    return out


def _slices(req: JobRequest, started: dict[str, tuple[Instance, ...]]) -> int:
    got = started.get(req.name)
    if got:
        return sum(i.profile.compute_slices for i in got)
    return req.ranks


def verdict(
    plan: Plan,
    pending: Sequence[JobRequest],
    holders: Sequence[DrainHolder],
    *,
    free: Sequence[Instance],
    settings: PlannerSettings,
    cost: RegistrationCost,
    now_s: float,
    last_change_s: float | None = None,
    requeued: frozenset[str] = frozenset(),
) -> Verdict:
    """Should the caller commit to ``plan`` (planned for the node once empty)?

    ``pending`` is the emptied node's queue: the ``requeued`` requests (the movable holders, back in the queue) and
    the jobs waiting now (their ``submitted_s`` ages them). ``holders`` are the jobs on the node now, ``free``
    today's instances no job holds. ``last_change_s``: when the last change that closed a busy node ended.
    """
    if not changes_instances(plan):
        return Verdict(False, 0.0, 0.0, 0.0, "the plan changes no instance: Slurm places the jobs itself")
    floor = cost.fixed_s
    immovable = [h for h in holders if not h.movable]
    movable = [h for h in holders if h.movable]
    lefts = [h.expected_left_s(floor) for h in immovable]
    expected = max([*lefts, *(settings.checkpoint_s for _ in movable), 0.0])
    drain = expected + cost.fixed_s
    close_by: float | None = 0.0
    if any(h.remaining_s is None for h in immovable):
        close_by = None
    elif immovable:
        close_by = max(max(0.0, h.remaining_s or 0.0) for h in immovable)
    started = {a.job: a.instances for a in plan.actions if isinstance(a, StartJob)}
    ready = servable_now([r for r in pending if r.name not in requeued], free)
    gain = 0.0
    oldest = 0.0
    served: list[str] = []
    for req in pending:
        if req.name in requeued or req.name in ready or req.name not in started:
            continue
        waited = max(0.0, now_s - req.submitted_s)
        gain += _slices(req, started) * waited
        oldest = max(oldest, waited)
        served.append(req.name)
    held = sum(h.compute_slices for h in holders)
    waste = sum(h.compute_slices * (expected - left) for h, left in zip(immovable, lefts, strict=True))
    waste += sum(h.compute_slices * settings.move_cost() for h in movable)
    waste += max(0, cost.total_slices - held) * expected  # free slices, closed while the node empties
    figures = f"empty in ~{drain:.0f} s, waited {gain:.0f} vs cost {waste:.0f} slice-seconds"
    if not served:
        return Verdict(False, drain, gain, waste, f"no waiting job needs the change ({figures})", close_by_s=close_by)
    verdict_of = _Verdict(drain, gain, waste, tuple(served), close_by)
    if not holders:
        return verdict_of.say(True, f"serves {len(served)} waiting job(s) on an idle node: {figures}")
    forced = oldest >= cost.max_wait_s
    if last_change_s is not None and now_s - last_change_s < cost.min_interval_s and not forced:
        left_s = cost.min_interval_s - (now_s - last_change_s)
        return verdict_of.say(
            False,
            f"batching: the last change that closed the node was {now_s - last_change_s:.0f} s ago, next one in "
            f"{left_s:.0f} s ({figures})",
        )
    if forced:
        return verdict_of.say(
            True, f"serves {len(served)} waiting job(s), one waited {oldest:.0f} s (bound {cost.max_wait_s:g} s): "
            f"{figures}", forced=True
        )  # fmt: skip
    if gain <= 0 or gain < settings.gain_ratio * waste:
        return verdict_of.say(False, f"not worth closing the node yet ({figures})")
    return verdict_of.say(True, f"serves {len(served)} waiting job(s): {figures}")


@dataclass(frozen=True, slots=True)
class _Verdict:
    drain: float
    gain: float
    waste: float
    served: tuple[str, ...]
    close_by: float | None

    def say(self, go: bool, reason: str, *, forced: bool = False) -> Verdict:
        return Verdict(go, self.drain, self.gain, self.waste, reason, self.served, self.close_by, forced)
