"""Moves of running hook jobs on a host of one Slurm node per MIG instance: the carver's inputs turned into
:func:`flexmig.slurm.moves.plan_moves`'s, and a chosen move turned into the journal's actions.

A move is the whole-node mode's checkpoint path on the moved job's instance node (:mod:`flexmig.slurm.change`:
close, signal, acknowledgement, ``scontrol requeuehold``, the node left empty and retired with its instance
destroyed, the credential gap, release): the job waits again in its place of Slurm's queue and Slurm starts it on a
free instance of its profile (the next carving makes one where the plan found room), where it resumes right after
its acknowledged step. The region it left is held for the waiting job (the carver's hold and its reservation), so
nothing else takes it, and the next carving creates the waiting job's instance there.

Pure: the caller reads Slurm and NVML and passes the time in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flexmig.plan.carving import Hold, Waiting
from flexmig.plan.types import DestroyInstance, Plan
from flexmig.slurm.carving_choice import CarvingHost
from flexmig.slurm.change import encode_change
from flexmig.slurm.demand import SlurmRunning
from flexmig.slurm.moves import Blocked, MovePlan, Region, Running, plan_moves

__all__ = ["MOVE_COST_S", "choose_moves", "move_actions", "move_hold"]

MOVE_COST_S = 12.5
"""What a move costs a job, in seconds, as the policy weighs it: its acknowledgement (about 0.3 s for a save at a
step boundary, ``bench/slurm.py``), the requeue and the credential gap before its release (about 2 s), and a cold
start (imports, model, checkpoint load: about 10 s for a small torch job)."""


def choose_moves(
    host: str, ch: CarvingHost, running: Sequence[SlurmRunning], queue: Sequence[Waiting], *, hold: Hold | None,
    max_moves_per_job: int,
) -> MovePlan:  # fmt: skip
    """The moves for host node ``host`` (seen as ``ch``: carving indices), its jobs ``running`` (those the instance
    agents saw; a job counts as moved as often as Slurm restarted it) and Slurm's waiting ``queue``; ``hold``: the
    region the carving holds."""
    hl = ch.layouts
    jobs: list[Running] = []
    for r in running:
        if len(r.instances) != 1:
            continue  # a job of several devices is not moved
        inst = r.instances[0]
        k = hl.index(inst.gpu)
        if k is None or (k, inst.start) not in ch.busy or hl.layouts[k].at(inst.start) is None:
            continue
        jobs.append(
            Running(
                str(r.job.job_id), (host, k, inst.start), inst.profile.name, hook=r.movable,
                moves=r.job.restart_count, remaining_s=ch.busy[(k, inst.start)], cost_s=MOVE_COST_S,
            )
        )  # fmt: skip
    closed = frozenset((host, k, s) for k, s in ch.registering | hl.pinned)
    held = [] if hold is None else [(hold.job, Region(host, hold.gpu, hold.start, hold.profile))]
    asks = [Blocked(w.name, w.profile, w.waited_s) for w in queue if w.alone]
    return plan_moves(ch.model, {host: hl.layouts}, jobs, asks, max_moves_per_job=max_moves_per_job, closed=closed,
                      held=held)  # fmt: skip


def move_hold(plan: MovePlan, now_s: float) -> Hold | None:
    """The hold that keeps ``plan``'s region for its waiting job (carving indices), due when the jobs that stay
    there are expected to have ended (at once when none stays)."""
    if plan.region is None or plan.waiting is None:
        return None
    r = plan.region
    return Hold(plan.waiting, r.gpu, r.start, r.profile, now_s + plan.free_in_s)


def move_actions(
    plan: MovePlan, ch: CarvingHost, running: Sequence[SlurmRunning], name: Callable[[int, int, str], str]
) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The journal's actions of ``plan``: each moved job's instance node checkpointed, its job requeued, the node
    retired with its instance destroyed, the job released (``slurm_reregister`` with ``retire``)."""
    by_id = {str(r.job.job_id): r for r in running}
    out = []
    for m in plan.moves:
        _, k, start = m.source
        gpu = ch.layouts.gpus[k]
        profile = ch.model.profile(m.profile)
        why = f"moved for {plan.waiting}: {plan.reason}"
        destroy = Plan(actions=(DestroyInstance(gpu, start, profile, why, 0.0),))
        out.append(encode_change(name(gpu, start, m.profile), destroy, (by_id[m.job],), why, 0.0, retire=True))
    return out
