"""The carving of a host of several GPUs for a job that waits as the parts of a pool node (``--gres=gpu:1g.18gb:2``,
:mod:`flexmig.slurm.pool_nodes`): the parts are placed on one GPU, since a pool node's instances share a GPU.

:func:`flexmig.plan.carving.carve` places each waiting part like a job of its own: on a host of several GPUs one part
may take an idle instance of its profile on one GPU and the next one on another, and the pool, which needs them all
on one GPU, then waits for ever while the carving counts its parts as served. :func:`carve_pools` chooses the GPU
first (:func:`flexmig.slurm.cluster_claims.pool_gpu`: where the parts cost the least carving now), then carves with
the idle instances of the pool's profile on the other GPUs left alone for that round, and keeps none of the parts'
instances that the carving would still make on another GPU (nor what it would destroy only for them); while no GPU
has room for them all, nothing is made for them (a hold the carving gives one of them stays: its region empties).
The first pool job of the queue is placed so each round (a pool node is made one at a time, too). Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout, PlacedInstance
from flexmig.plan.carving import Carving, Hold, Waiting, Where, carve
from flexmig.slurm.cluster_claims import BUSY, CLOSED, IDLE, ClusterHost, pool_gpu

__all__ = ["carve_pools", "first_pool"]


def first_pool(queue: Sequence[Waiting], pools: Collection[str]) -> tuple[str, list[Waiting]] | None:
    """The first job of ``queue`` named in ``pools`` (``slurm-42``) and its parts (``slurm-42#k``), or None."""
    for w in queue:
        base, part, _ = w.name.partition("#")
        if part and base in pools:
            return base, [x for x in queue if x.name.partition("#")[0] == base]
    return None


def _host(
    layouts: Sequence[Layout], busy: Mapping[Where, float | None], registering: Collection[Where],
    pinned: Collection[Where],
) -> ClusterHost:  # fmt: skip
    """The host's GPUs (carving indices) as the cluster's assignment sees a host: what each instance is to it (one
    registering counts as busy: it is neither destroyed nor known to serve yet)."""
    gpus = {}
    for g, lay in enumerate(layouts):
        on_gpu = {}
        for i in lay:
            w = (g, i.start)
            what = BUSY if w in busy or w in registering else CLOSED if w in pinned else IDLE
            on_gpu[i.start] = (i.profile.name, what)
        gpus[g] = on_gpu
    return ClusterHost("host", frozenset(), gpus)


def carve_pools(
    model: GpuModel, layouts: Sequence[Layout], busy: Mapping[Where, float | None], queue: Sequence[Waiting], *,
    pools: Collection[str], now_s: float, hold: Hold | None, registering: frozenset[Where], pinned: frozenset[Where],
    hold_after_s: float, hold_when_idle: bool, numbers: Sequence[int],
) -> Carving:  # fmt: skip
    """:func:`flexmig.plan.carving.carve` of ``layouts`` for ``queue`` (the same arguments), with the parts of the
    first pool job (``pools``: the jobs that wait as a pool node's parts) on one GPU (see the module docstring)."""

    def run(left_alone: frozenset[Where]) -> Carving:
        return carve(model, layouts, busy, queue, now_s=now_s, hold=hold, registering=registering, pinned=left_alone,
                     hold_after_s=hold_after_s, hold_when_idle=hold_when_idle, numbers=numbers)  # fmt: skip

    first = first_pool(queue, pools)
    if first is None or len(layouts) < 2:
        return run(pinned)
    base, parts = first
    profile = model.profile(parts[0].profile)
    if profile.compute_slices >= model.compute_slices:  # a whole-GPU pool spans GPUs: any place serves
        return run(pinned)
    gpu = pool_gpu(_host(layouts, busy, registering, pinned), model, profile, len(parts))
    if gpu is None:  # no GPU has room for them all now: nothing is made for them (a hold may be kept for one)
        return _kept_on(run(pinned), layouts, base, None)
    elsewhere = frozenset(
        (g, i.start) for g, lay in enumerate(layouts) if g != gpu for i in lay
        if i.profile == profile and (g, i.start) not in busy and (g, i.start) not in registering
    )  # fmt: skip
    return _kept_on(run(pinned | elsewhere), layouts, base, gpu)


def _kept_on(c: Carving, layouts: Sequence[Layout], base: str, gpu: int | None) -> Carving:
    """``c`` less the instances it makes for pool job ``base``'s parts on GPUs other than ``gpu`` (None: on any),
    and less the idle instances of ``layouts`` it destroys only for those (overlapping one of them and no other
    instance it makes)."""
    dropped = [(g, p) for g, p, job in c.create if g != gpu and job.partition("#")[0] == base]
    if not dropped:
        return c
    create = tuple(x for x in c.create if (x[0], x[1]) not in dropped)

    def overlaps(g: int, start: int, made: Sequence[tuple[int, PlacedInstance]]) -> bool:
        inst = layouts[g].at(start)
        return inst is not None and any(mg == g and mp.start < inst.end and inst.start < mp.end for mg, mp in made)

    kept = [(g, p) for g, p, _ in create]
    destroy = tuple(w for w in c.destroy if not (overlaps(*w, dropped) and not overlaps(*w, kept)))
    mine = c.hold is not None and c.hold.job.partition("#")[0] == base
    hold = None if mine and gpu is not None and c.hold is not None and c.hold.gpu != gpu else c.hold
    where = "no GPU has room for all of them now" if gpu is None else f"they go on GPU index {gpu} only"
    why = f"{base}: nothing carved for its parts elsewhere: {where} (a pool node's instances share a GPU)"
    return replace(c, destroy=destroy, create=create, hold=hold, reasons=(*c.reasons, why))
