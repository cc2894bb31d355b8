"""What changing a node's MIG instances costs when a cluster scheduler must re-register the node, and whether a
plan is worth it.

Slurm cannot change a node's GPU GRES while a job runs on it: the node is drained, every job on it must end (or be
checkpointed and requeued), and only then is it re-registered with its new instances. So any plan that creates or
destroys an instance costs a *whole-node drain*, however small the change. This module charges it, in compute
slice-seconds (capacity times time), so that a big job counts more than a small one:

* **drain time** ``D``: until the last job is off the node, plus the re-registration itself (``fixed_s``): an
  immovable job leaves when it ends (its time limit; unknown: ``settings.unknown_wait_s``), a movable one after its
  checkpoint (``settings.checkpoint_s``);
* **cost**: the capacity the drain wastes: each immovable job's slices stand idle from its end until ``D``; each
  movable job loses its checkpoint and restart (``settings.move_cost``); each pending job that could have started
  on today's free instances waits ``D`` longer;
* **gain**: each pending job the plan starts that today's instances cannot host would otherwise wait for an
  assumed ``settings.unknown_wait_s``; it now waits ``D``.

The plan goes ahead when the gain beats the cost by ``settings.gain_margin`` and the last re-registration is at
least ``min_interval_s`` old. This batches changes: one small job does not drain a busy node, but demand that
accumulates, or a node that is idle anyway (``D`` is then just ``fixed_s``), does. Pure: time is passed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from flexmig.plan.types import CreateInstance, DestroyInstance, Instance, JobRequest, Plan, PlannerSettings, StartJob

__all__ = ["DrainHolder", "RegistrationCost", "Verdict", "changes_instances", "servable_now", "verdict"]


@dataclass(frozen=True, slots=True)
class DrainHolder:
    """A job on the node when it must drain: its compute slices, the time it has left, whether it can checkpoint."""

    name: str
    compute_slices: int
    remaining_s: float | None
    movable: bool


@dataclass(frozen=True, slots=True)
class RegistrationCost:
    """What one re-registration costs beyond the drain, and how often one may happen.

    ``fixed_s``: stopping slurmd, deleting and re-registering the node, waiting for slurmctld (0.3 s on an idle
    single-node Slurm with the simulated driver, 1.7 s with a requeued job, measured by ``bench/slurm.py``; 5 s by
    default for a loaded controller and a real driver's instance changes);
    ``min_interval_s``: the shortest time between two re-registrations of one node.
    """

    fixed_s: float = 5.0
    min_interval_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to re-register for a plan, with the figures behind it (slice-seconds and seconds) and why."""

    go: bool
    drain_s: float
    gain: float
    cost: float
    reason: str
    newly_served: tuple[str, ...] = ()


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
    """Should ``plan`` (planned for the node once drained) be carried out?

    ``pending`` is the drained node's queue: the ``requeued`` requests (the movable holders, back in the queue) and
    the jobs waiting now. ``holders`` are the jobs on the node now, ``free`` today's instances no job holds.
    """
    if not changes_instances(plan):
        return Verdict(False, 0.0, 0.0, 0.0, "the plan changes no instance: Slurm places the jobs itself")
    ends = [0.0]
    for h in holders:
        if h.movable:
            ends.append(settings.checkpoint_s)
        else:
            ends.append(settings.unknown_wait_s if h.remaining_s is None else h.remaining_s)
    drain = max(ends) + cost.fixed_s
    started = {a.job: a.instances for a in plan.actions if isinstance(a, StartJob)}
    ready = servable_now([r for r in pending if r.name not in requeued], free)
    gain = 0.0
    waste = 0.0
    served: list[str] = []
    wait = settings.unknown_wait_s
    for req in pending:
        if req.name in requeued:
            continue
        if req.name in ready:
            waste += _slices(req, started) * drain  # it could have started now; the drain holds it back
        elif req.name in started:
            gain += _slices(req, started) * max(0.0, wait - drain)
            served.append(req.name)
    for h in holders:
        if h.movable:
            waste += h.compute_slices * settings.move_cost()
        else:
            left = settings.unknown_wait_s if h.remaining_s is None else h.remaining_s
            waste += h.compute_slices * max(0.0, drain - cost.fixed_s - left)
    figures = f"drain ~{drain:.0f} s, gain {gain:.0f} vs cost {waste:.0f} slice-seconds"
    if not served:
        return Verdict(False, drain, gain, waste, f"no waiting job needs the change ({figures})")
    if last_change_s is not None and now_s - last_change_s < cost.min_interval_s:
        left_s = cost.min_interval_s - (now_s - last_change_s)
        return Verdict(
            False,
            drain,
            gain,
            waste,
            f"batching: the last re-registration was {now_s - last_change_s:.0f} s "
            f"ago, next one in {left_s:.0f} s ({figures})",
            tuple(served),
        )
    if gain <= 0 or gain < settings.gain_margin * waste:
        return Verdict(False, drain, gain, waste, f"not worth a whole-node drain ({figures})", tuple(served))
    return Verdict(True, drain, gain, waste, f"serves {len(served)} waiting job(s): {figures}", tuple(served))
