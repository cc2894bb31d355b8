"""What a round of a host managed as one Slurm node per MIG instance decides (``[slurm] node_per_instance``).

Pure: the caller (:class:`flexmig.slurm.carver.InstanceCarver`) reads Slurm and NVML, passes the time in,
and carries the decision out. :func:`stale_retirements` is which instance nodes leave Slurm because their instance
is gone; :func:`carving_host` and :func:`choose_carving` are the host as the carving sees it and the carving of it
for Slurm's waiting jobs (:func:`flexmig.plan.carving.carve`); :func:`after_carving` is the host after a carving.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flexmig.act.nodeview import NodeView
from flexmig.act.placement import node_model
from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel
from flexmig.nvml.types import Inventory
from flexmig.plan.carving import Carving, Hold, Waiting, Where
from flexmig.plan.types import Plan
from flexmig.slurm.agent_read import SlurmView
from flexmig.slurm.change import encode_change
from flexmig.slurm.change_admin import admin_hold
from flexmig.slurm.cluster_claims import FREE_AFTER_MIN_S, FREE_AFTER_ROUNDS, Seen, host_queue, pool_jobs
from flexmig.slurm.demand import SlurmRunning, read_demand
from flexmig.slurm.instances import HostLayouts, busy_of, host_layouts, queue_of
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.pool_carving import carve_pools
from flexmig.slurm.settings import SlurmSettings, instance_node, parse_instance_node
from flexmig.slurm.squeue import SlurmJob

__all__ = [
    "CarvingHost",
    "after_carving",
    "carving_host",
    "choose_carving",
    "profile_at",
    "stale_retirements",
    "waiting_of",
]

NodeName = Callable[[int, int, str], str]
"""The Slurm node of the instance of a profile at a start of a GPU (``(gpu, start, profile)``)."""


def stale_retirements(
    host: str, look: SlurmView, live: set[str], *, hold_reservation: str, static: bool
) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The retirements of host node ``host``'s instance nodes whose instance NVML no longer shows (``live``: the
    nodes of the instances it shows), except those in use or held by an administrator; ``static``: the host's
    instance nodes are slurm.conf's static ones."""
    jobs, nodes, reservations = look
    others = [r for r in reservations if r.name != hold_reservation]
    actions = []
    for n in nodes:
        where = parse_instance_node(host, n.name)
        if where is None or n.name in live or (n.name != instance_node(host, *where)) != static:
            continue  # not an instance node of this host in this mode (dynamic or static), or its instance lives
        if admin_hold(n, others, n.name) is not None or any(j.active and n.name in j.nodes for j in jobs):
            continue
        actions.append(encode_change(n.name, Plan(), (), "its MIG instance is gone", 0.0, retire=True))
    return actions


@dataclass(frozen=True, slots=True)
class CarvingHost:
    """The host as a carving sees it: its GPUs' layouts (``layouts``), the busy instances (carving indices, and
    when each is expected to end), those still registering, Slurm's nodes by name, the host's own nodes, and the
    nodes any reservation names (``reserved``: what the cluster's assignment, :mod:`flexmig.slurm.cluster_claims`,
    gives no job)."""

    model: GpuModel
    layouts: HostLayouts
    busy: dict[Where, float | None]
    registering: frozenset[Where]
    by_name: dict[str, SlurmNode]
    ours: tuple[SlurmNode, ...]
    reserved: frozenset[str] = frozenset()


def carving_host(
    look: SlurmView, inventory: Inventory, running: Sequence[SlurmRunning], *, name: NodeName, hold_reservation: str,
    pooled: frozenset[Where] = frozenset(),
) -> CarvingHost | None:  # fmt: skip
    """The host as a carving sees it, from one look at Slurm and NVML and the jobs the instance agents saw running
    (``running``); None when there is nothing to carve (no MIG model flexmig plans for, no layout left free).
    ``pooled``: instances, ``(gpu, start)``, of a pool node (:mod:`flexmig.slurm.pool_nodes`): never carved."""
    _, nodes, reservations = look
    view = NodeView.of(inventory)
    try:
        model = node_model(view)
    except PlanRejectedError:
        return None
    by_name = {n.name: n for n in nodes}
    others = [r for r in reservations if r.name != hold_reservation]
    held: set[Where] = set()
    registering: set[Where] = set()
    in_use: dict[Where, bool] = {}
    ours: list[SlurmNode] = []
    for i in view.instances:
        if i.uuid is None:
            continue
        if i.key in pooled:
            held.add(i.key)
            continue
        node_name = name(i.gpu, i.start, i.profile)
        n = by_name.get(node_name)
        if n is None or not n.responding:
            registering.add(i.key)
            continue
        ours.append(n)
        if admin_hold(n, others, node_name) is not None:
            held.add(i.key)
        in_use[i.key] = not n.idle
    mig_on = {g.index: bool(g.mig_current) for g in inventory.gpus}
    busy_nvml = busy_of(running, in_use)
    outside = {i.key for i in view.instances if i.pids and i.key not in busy_nvml}  # used, not by a Slurm job
    hl = host_layouts(view, model, mig_on, held | outside)
    if not hl.layouts:
        return None
    busy: dict[Where, float | None] = {}
    for (gpu, start), left in busy_nvml.items():
        k = hl.index(gpu)
        if k is not None and hl.layouts[k].at(start) is not None:
            busy[(k, start)] = left
    registering_c = hl.to_carving(registering) - busy.keys()
    registering_c = frozenset(w for w in registering_c if hl.layouts[w[0]].at(w[1]) is not None)
    reserved = frozenset(n for r in reservations for n in r.nodes)
    return CarvingHost(model, hl, busy, registering_c, by_name, tuple(ours), reserved)


def choose_carving(
    host: str, ch: CarvingHost, jobs: Sequence[SlurmJob], settings: SlurmSettings, *, now_s: float, hold: Hold | None,
    seen: Seen | None = None, served: frozenset[str] = frozenset(),
) -> tuple[Carving, dict[str, str], Seen]:  # fmt: skip
    """The carving of host node ``host`` (seen as ``ch``) for Slurm's waiting jobs at ``now_s`` (``hold``: the
    region held at the last round), the waiting jobs it left out, with why, and what the cluster's assignment
    remembers for the next round (``seen``: the last round's): of a cluster's waiting jobs, the host carves only
    for those assigned to it, those no host was assigned, and those another host left waiting too long
    (:mod:`flexmig.slurm.cluster_claims`); a pool job's parts on one GPU (:mod:`flexmig.slurm.pool_carving`).
    ``served``: waiting jobs (request names) a pool node runs, left out."""
    model, hl = ch.model, ch.layouts
    queue, left_out = waiting_of(host, ch, jobs, settings, now_s=now_s)
    queue = [w for w in queue if w.name.split("#", 1)[0] not in served]
    queue, left, seen = host_queue(
        host, queue, ch.by_name.values(), jobs, model, reserved=ch.reserved, seen=seen or Seen(), now_s=now_s,
        hook_token=settings.hook_token, free_after_s=max(FREE_AFTER_MIN_S, FREE_AFTER_ROUNDS * settings.interval_s),
    )  # fmt: skip
    left_out.update(left)
    c = carve_pools(
        model, hl.layouts, ch.busy, queue, pools=pool_jobs(queue, jobs), now_s=now_s, hold=hold,
        registering=ch.registering, pinned=hl.pinned, hold_after_s=settings.hold_after_s,
        hold_when_idle=settings.hold_when_idle, numbers=hl.gpus,
    )  # fmt: skip
    return c, left_out, seen


def waiting_of(
    host: str, ch: CarvingHost, jobs: Sequence[SlurmJob], settings: SlurmSettings, *, now_s: float
) -> tuple[list[Waiting], dict[str, str]]:
    """Slurm's waiting jobs for host node ``host`` (seen as ``ch``) in priority order, as the carving and the moves
    take them, and those left out, with why."""
    model, hl = ch.model, ch.layouts
    partitions = settings.partitions or tuple(sorted({p for n in ch.ours for p in n.partitions}))
    demand = read_demand(
        jobs, None, instance_node(host, hl.gpus[0], 0), model, index_map={}, now_s=now_s,
        partitions=partitions, hook_token=settings.hook_token,
    )  # fmt: skip
    return queue_of(demand, now_s, most_parts=len(hl.layouts) * model.compute_slices, pools=True, model=model)


def profile_at(hl: HostLayouts, i: int, start: int) -> str:
    """The profile of the instance at ``start`` of the ``i``-th GPU of ``hl`` (one the carving destroys)."""
    inst = hl.layouts[i].at(start)
    assert inst is not None, "carve destroys only instances of the layouts it was given"
    return inst.profile.name


def after_carving(hl: HostLayouts, carving: Carving) -> HostLayouts:
    """``hl`` with ``carving``'s instances destroyed and created."""
    layouts = list(hl.layouts)
    for i, start in carving.destroy:
        layouts[i] = layouts[i].remove(start)
    for i, placed, _ in carving.create:
        layouts[i] = layouts[i].place(placed.profile, placed.start)
    return HostLayouts(hl.model, hl.gpus, tuple(layouts), hl.pinned)
