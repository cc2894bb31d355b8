"""Moves of running hook jobs on a host of one Slurm node per MIG instance: the carver's inputs turned into
:func:`flexmig.slurm.moves.plan_moves`'s, and a chosen move turned into the journal's actions.

A move is the whole-node mode's checkpoint path on the moved job's instance node (:mod:`flexmig.slurm.change`:
close, signal, acknowledgement, ``scontrol requeuehold``, the node left empty and retired with its instance
destroyed, the credential gap, release): the job waits again in its place of Slurm's queue and Slurm starts it on a
free instance of its profile (the next carving makes one where the plan found room), where it resumes right after
its acknowledged step. The region it left is held for the waiting job (the carver's hold and its reservation), so
nothing else takes it, and the next carving creates the waiting job's instance there.

On a cluster, a blocked job no host can serve is in every host's queue; only the host that owns its moves
(:func:`flexmig.slurm.cluster_claims.move_owner`, which every host computes alike from Slurm's view) moves jobs for
it, so that one blocked job never drains two GPUs. The host moves its own jobs out of a region of its own GPUs, and
counts as their targets the room of every host in Slurm's view (:func:`other_hosts`: the other hosts' instance nodes,
idle ones and free slices), as Slurm restarts a requeued job on a free instance of any host: on the modelled cluster
mix (``bench/slurm_moves.py``, 2 hosts x 2 GPUs, seeds 161-200) the 7g jobs' longest wait is 564 s (806 s worst)
counting every host's room, 592 s (871 s) counting the mover's own only.

Pure: the caller reads Slurm and NVML and passes the time in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any

from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Hold, Waiting
from flexmig.plan.types import DestroyInstance, Plan
from flexmig.slurm.carving_choice import CarvingHost
from flexmig.slurm.change import encode_change
from flexmig.slurm.cluster_claims import BUSY, IDLE, RETIRING, cluster_hosts, move_owner
from flexmig.slurm.demand import SlurmRunning, job_id_of
from flexmig.slurm.moves import Blocked, MovePlan, Place, Region, Running, plan_moves
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import SlurmReservation
from flexmig.slurm.squeue import SlurmJob

__all__ = ["MOVE_COST_S", "OWNER_TRIES", "choose_moves", "move_actions", "move_hold", "other_hosts"]

MOVE_COST_S = 12.5
"""What a move costs a job, in seconds, as the policy weighs it: its acknowledgement (about 0.3 s for a save at a
step boundary, ``bench/slurm.py``), the requeue and the credential gap before its release (about 2 s), and a cold
start (imports, model, checkpoint load: about 10 s for a small torch job)."""


_Others = tuple[dict[str, list[Layout]], list[Running], frozenset[Place]]
"""The other hosts as :func:`other_hosts` reads them: their layouts, their busy instances, their closed ones."""

OWNER_TRIES = 4
"""How many blocked jobs one round passes over because another host owns their moves before it gives up (each is a
search of the host's regions)."""


def choose_moves(
    host: str, ch: CarvingHost, running: Sequence[SlurmRunning], queue: Sequence[Waiting], *, hold: Hold | None,
    max_moves_per_job: int, jobs: Sequence[SlurmJob], reservations: Sequence[SlurmReservation], hook_token: str,
) -> MovePlan:  # fmt: skip
    """The moves for host node ``host`` (seen as ``ch``: carving indices), its jobs ``running`` (those the instance
    agents saw; a job counts as moved as often as Slurm restarted it) and Slurm's waiting ``queue``; ``hold``: the
    region the carving holds. Only for a blocked job this host owns the moves of (:func:`move_owner` on Slurm's
    ``jobs``, ``reservations`` and nodes): a blocked job another host owns is passed over (its owner moves for it),
    and one no host owns gets no move."""
    others = other_hosts(host, ch.by_name.values(), ch.model, reserved=ch.reserved)
    plan = _plan(host, ch, running, queue, others, hold=hold, max_moves_per_job=max_moves_per_job)
    by_id = {j.job_id: j for j in jobs}
    passed: list[str] = []
    for _ in range(OWNER_TRIES):
        if not plan.moves or plan.waiting is None:
            break
        slurm_job = by_id.get(job_id_of(plan.waiting) or -1)
        wanted = () if slurm_job is None else slurm_job.partitions
        ask = next(w for w in queue if w.name == plan.waiting)
        owner = move_owner(ask, ch.by_name.values(), jobs, reservations, ch.model, hook_token=hook_token,
                           max_moves=max_moves_per_job, partitions=wanted)  # fmt: skip
        if owner == host:
            return plan
        passed.append(f"{plan.waiting}: " + (f"host {owner} moves for it" if owner else "no host owns its moves"))
        queue = [w for w in queue if w.name != plan.waiting]
        plan = _plan(host, ch, running, queue, others, hold=hold, max_moves_per_job=max_moves_per_job)
    if plan.moves:
        why = f"{plan.waiting}: not moved this round ({OWNER_TRIES} blocked jobs before it are other hosts' to move)"
        plan = MovePlan((), plan.waiting, None, 0.0, 0.0, why)
    return replace(plan, reason="; ".join([*passed, plan.reason])) if passed else plan


def _plan(
    host: str, ch: CarvingHost, running: Sequence[SlurmRunning], queue: Sequence[Waiting], others: _Others, *,
    hold: Hold | None, max_moves_per_job: int,
) -> MovePlan:  # fmt: skip
    """:func:`plan_moves` on this host's GPUs, jobs and ``queue``, whoever owns the blocked job's moves, the moved
    jobs' targets on any host (``others``: :func:`other_hosts`)."""
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
    lays, busy, shut = others
    return plan_moves(ch.model, {**lays, host: hl.layouts}, [*jobs, *busy], asks, max_moves_per_job=max_moves_per_job,
                      closed=closed | shut, held=held, regions_on=host)  # fmt: skip


def other_hosts(
    host: str, nodes: Iterable[SlurmNode], model: GpuModel, *, reserved: Collection[str]
) -> _Others:
    """The hosts other than ``host`` as Slurm's ``nodes`` show them, for the targets of a move: each one's GPUs'
    layouts (its instance nodes, a GPU by the number in their names, in that order; an instance its host is
    retiring left out, its place as good as free), its busy instances as jobs that never move (what runs there is
    not this host's to requeue), and its closed ones (an administrator's, a reservation's, a slurmd that does not
    answer: never a target); a pool node's instances are busy or closed as
    :func:`~flexmig.slurm.cluster_claims.cluster_hosts` places them (never a target either). A host whose view is
    not a layout (caught between two looks) is left out."""
    lays: dict[str, list[Layout]] = {}
    busy: list[Running] = []
    closed: set[Place] = set()
    for name, h in cluster_hosts(nodes, model, reserved=reserved).items():
        if name == host:
            continue
        lays[name] = []
        for k, gpu in enumerate(sorted(h.gpus)):
            on_gpu = {s: pw for s, pw in h.gpus[gpu].items() if pw[1] != RETIRING}
            lays[name].append(Layout.of(model, [(p, s) for s, (p, _) in on_gpu.items()]))
            for s, (p, what) in on_gpu.items():
                if what == BUSY:
                    busy.append(Running(f"{name}-gpu{gpu}-{s}", (name, k, s), p, hook=False, moves=0,
                                        remaining_s=None, cost_s=MOVE_COST_S))  # fmt: skip
                elif what != IDLE:
                    closed.add((name, k, s))
    return lays, busy, frozenset(closed)


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
