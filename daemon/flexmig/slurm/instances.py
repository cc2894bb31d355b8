"""One Slurm node per MIG instance (``[slurm] node_per_instance``, Slurm 23.11 and later): what a round of the host
hands to :func:`flexmig.plan.carving.carve`, and the journalled actions that carry its decision out.

Every MIG instance with a MIG device is its own dynamic node, ``<node>-gpu<K>-<S>``
(:func:`flexmig.slurm.settings.instance_node`), kept registered by its own agent. No node's GRES ever changes:

* an instance the carving creates is one ``slurm_reregister`` action on a node Slurm does not know yet: the
  instance is created, its gres.conf block and map written, its slurmd started, and the action ends once slurmctld
  lists the node with it;
* an idle instance the carving destroys is one ``slurm_reregister`` action with ``retire``: the node is closed
  (drained together with the carving's other retiring nodes, then flexmig's reservation), found still idle (a job
  Slurm started on it meanwhile cancels the action, and the node reopens as it was), its slurmd stopped, the node
  deleted, the instance destroyed, its block and map removed. A busy instance, one still registering, and one whose
  node an administrator drained, downed or reserved are never destroyed.

A job that has waited ``hold_after_s`` and fits nowhere holds a region (:class:`flexmig.plan.carving.Hold`): its
instance nodes get flexmig's reservation ``flexmig-<node>-hold``, starting when the region's busy instances are
expected to end (by their limits; the jobs running there run on), so Slurm starts there only jobs that end before;
nothing is carved inside for other jobs, and once the region is idle it is carved for the held job.

Jobs asking for MIG devices of several instances (``--gres=gpu:P:2``) cannot run on one instance node: they wait as
the parts of a pool node (:mod:`flexmig.slurm.pool_nodes`), or, without pool nodes, are left out of the carving with
that reason (ask for ``--nodes=N --gres=gpu:P:1``, a job the carving counts as N waiting parts, one instance node
each). A job asking for devices of several profiles on one node (``--gres=gpu:1g.18gb:1,gpu:2g.35gb:1``) is left
out at once (:data:`MIXED`): no node of this layout has two profiles, so carving for it would only idle instances;
so is a job asking for more devices of a profile smaller than a GPU on one node than one GPU holds
(``--gres=gpu:1g.18gb:8`` on an H200, :data:`TOO_MANY`): a pool node's instances share one GPU.
Pure: the caller reads Slurm and NVML and runs the actions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flexmig.act.nodeview import NodeView
from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Carving, Waiting, Where
from flexmig.plan.types import CreateInstance, DestroyInstance, Plan
from flexmig.slurm.change import encode_change
from flexmig.slurm.demand import SlurmDemand, SlurmRunning, job_id_of

__all__ = [
    "MIXED",
    "TOO_MANY",
    "CarvingReport",
    "HostLayouts",
    "busy_of",
    "carving_actions",
    "carving_report",
    "describe",
    "hold_name",
    "host_layouts",
    "queue_of",
]


MIXED = "asks for MIG devices of several profiles on one node"
"""The start of the reason a job of several GPU types on one node is left out with (:func:`queue_of`)."""

TOO_MANY = "asks for more MIG devices of one profile on one node than one GPU holds"
"""The start of the reason a job is left out with (:func:`queue_of`) when it asks for more devices of a profile
smaller than a GPU on one node than one GPU of the model holds: its pool node's instances share one GPU
(:mod:`flexmig.slurm.pool`), so no pool node can ever serve it."""


def hold_name(node: str) -> str:
    """The name of flexmig's reservation on a held region of host node ``node``."""
    return f"flexmig-{node}-hold"


@dataclass(frozen=True, slots=True)
class HostLayouts:
    """The GPUs the carving may change: ``gpus[i]`` is the NVML index of the i-th layout; ``pinned`` the instances
    it must leave alone (processes outside Slurm, no MIG device, or an administrator's node), in carving indices."""

    model: GpuModel
    gpus: tuple[int, ...]
    layouts: tuple[Layout, ...]
    pinned: frozenset[Where]

    def index(self, gpu: int) -> int | None:
        """The carving index of NVML GPU ``gpu``, or None when the carving leaves it out."""
        return self.gpus.index(gpu) if gpu in self.gpus else None

    def to_carving(self, where: Iterable[Where]) -> frozenset[Where]:
        """NVML places as carving places (those of GPUs left out dropped)."""
        out = set()
        for g, s in where:
            i = self.index(g)
            if i is not None:
                out.add((i, s))
        return frozenset(out)


def host_layouts(view: NodeView, model: GpuModel, mig_on: Mapping[int, bool], held: Iterable[Where]) -> HostLayouts:
    """The layouts of the host's usable MIG GPUs of ``model`` from NVML's ``view``; ``held``: NVML places of
    instances whose nodes an administrator holds (never destroyed, never given)."""
    gpus: list[int] = []
    layouts: list[Layout] = []
    for gpu in sorted(view.gpus()):
        lay = view.layout(gpu)
        if lay is None or gpu in view.lost or view.model(gpu) != model or not mig_on.get(gpu):
            continue
        gpus.append(gpu)
        layouts.append(lay)
    hl = HostLayouts(model, tuple(gpus), tuple(layouts), frozenset())
    outside = {i.key for i in view.instances if i.uuid is None or i.pids is None}
    return HostLayouts(model, hl.gpus, hl.layouts, hl.to_carving({*outside, *held}))


def busy_of(running: Iterable[SlurmRunning], on_nodes: Mapping[Where, bool]) -> dict[Where, float | None]:
    """NVML place -> seconds until its job's time limit (None: none, or a job whose devices flexmig cannot map),
    for every instance a job runs on: those ``running`` holds, and those whose node ``on_nodes`` says is in use."""
    busy: dict[Where, float | None] = {}
    for r in running:
        for inst in r.instances:
            left = r.remaining_s
            prev = busy.get((inst.gpu, inst.start), 0.0)
            busy[(inst.gpu, inst.start)] = None if left is None or prev is None else max(prev, left)
    for where, used in on_nodes.items():
        if used and where not in busy:
            busy[where] = None
    return busy


def _too_many(model: GpuModel | None, profile: str, count: int) -> str | None:
    """Why a job of ``count`` devices of ``profile`` on one node (a pool node's) can never run, when a GPU of
    ``model`` holds fewer instances of that profile (smaller than a GPU; a whole-GPU profile's pool spans GPUs), or
    None (also for a profile ``model`` does not have, or no model)."""
    if model is None:
        return None
    try:
        p = model.profile(profile)
    except KeyError:
        return None
    if p.compute_slices >= model.compute_slices or count <= p.max_instances:
        return None
    return (
        f"{TOO_MANY} ({count} x {profile}; a GPU of {model.key} holds {p.max_instances}); a pool node's devices share "
        f"one GPU, so Slurm would never start it: ask for at most {p.max_instances} a node, or one a node "
        f"(--nodes={count} --gres=gpu:{profile}:1)"
    )


def queue_of(
    demand: SlurmDemand, now_s: float, *, most_parts: int = 56, pools: bool = False, model: GpuModel | None = None
) -> tuple[list[Waiting], dict[str, str]]:
    """The waiting jobs for the carving, in Slurm's priority order, and the ones left out (name -> why).

    A job of N nodes (``--nodes=N --gres=gpu:P:1``, what a job of several devices is told to ask for) needs N
    instance nodes: it waits as N parts, ``slurm-42#1`` ... ``slurm-42#N``, each carved for like a job of its own
    (at most ``most_parts``, as many instance nodes as the host can hold; a bigger job spans hosts). With ``pools``
    (the host registers pool nodes: :mod:`flexmig.slurm.pool_nodes`), a job of N devices on one node waits as N parts
    the same way: the instances its pool node will be made of, unless ``model``'s GPU holds fewer than N of its
    profile (left out at once, :data:`TOO_MANY`)."""
    nodes = {j.job_id: max(1, j.node_count) for j in demand.pending_jobs}
    mixed = {j.job_id: j for j in demand.pending_jobs if len([g for g in j.gpus_per_node if g.count > 0]) > 1}
    queue: list[Waiting] = []
    left: dict[str, str] = {}
    for req in demand.pending:
        profile = req.need.profile
        job = job_id_of(req.name)
        if job is not None and job in mixed:
            asked = ",".join(f"gpu:{g.type or ''}:{g.count}".replace("::", ":") for g in mixed[job].gpus_per_node)
            left[req.name] = (
                f"{MIXED} ({asked}); one node per MIG instance gives a node devices of one profile, so Slurm "
                "would never start it: ask for one profile (the bigger one for every device) or submit one job a "
                "profile"
            )
            continue
        if profile is None:
            left[req.name] = "asks for no MIG profile"
            continue
        parts = min(nodes.get(job, 1) if job is not None else 1, max(1, most_parts))
        if req.ranks > 1 and (parts > 1 or not pools):
            left[req.name] = (
                f"asks for {req.ranks} MIG devices; one node per instance runs a job of N devices as N nodes "
                f"(--nodes={req.ranks} --gres=gpu:{profile}:1)"
                + (f", not {parts} nodes of {req.ranks} devices" if pools else "")
            )
            continue
        too_many = _too_many(model, profile, req.ranks) if req.ranks > 1 else None
        if too_many is not None:
            left[req.name] = too_many
            continue
        parts = max(parts, min(req.ranks, max(1, most_parts)))  # several devices: a pool node's, carved as parts
        waited = max(0.0, now_s - req.submitted_s)
        names = [req.name] if parts == 1 else [f"{req.name}#{k}" for k in range(1, parts + 1)]
        queue += [Waiting(name, profile, req.expected_runtime_s, waited, alone=parts == 1) for name in names]
    return queue, left


def carving_actions(
    name: Callable[[int, int, str], str],
    hl: HostLayouts,
    carving: Carving,
    reason: str,
    *,
    drained_at: float | None = None,
) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The journal's actions of ``carving`` (carving indices) on the host whose instance nodes ``name`` gives (NVML
    GPU, start, profile -> node): first every destroyed idle instance's node retired, then every created instance's
    node registered, each one ``slurm_reregister``;
    ``drained_at``: when (wall time) the caller drained the retiring nodes, so that one backfill cycle after it
    serves them all."""
    out: list[tuple[str, str | None, dict[str, Any]]] = []
    for i, start in carving.destroy:
        gpu = hl.gpus[i]
        inst = hl.layouts[i].at(start)
        assert inst is not None, "carve destroys only instances of the layouts it was given"
        plan = Plan(actions=(DestroyInstance(gpu, start, inst.profile, reason, 0.0),))
        action = encode_change(name(gpu, start, inst.profile.name), plan, (), reason, 0.0, retire=True)
        if drained_at is not None:
            action[2]["drained_at"] = drained_at
        out.append(action)
    for i, placed, job in carving.create:
        gpu = hl.gpus[i]
        plan = Plan(actions=(CreateInstance(gpu, placed.start, placed.profile, reason, 0.0),))
        node = name(gpu, placed.start, placed.profile.name)
        out.append(encode_change(node, plan, (), reason, 0.0, serves=(job,)))
    return out


def describe(hl: HostLayouts, carving: Carving) -> Sequence[str]:
    """``destroy 1g.18gb@4 on GPU 0``-style words of a carving, in NVML's GPU numbers."""
    words = []
    for i, start in carving.destroy:
        inst = hl.layouts[i].at(start)
        words.append(f"destroy {inst.profile.name if inst else '?'}@{start} on GPU {hl.gpus[i]}")
    for i, placed, job in carving.create:
        words.append(f"create {placed.profile.name}@{placed.start} on GPU {hl.gpus[i]} for {job}")
    return words


@dataclass(frozen=True, slots=True)
class CarvingReport:
    """A carving as the fleet sees it (the ``slurm_carving`` event), so that an administrator can follow what
    flexmig does to a busy host without reading its log: the instances (``gpu0:2g.35gb@4``, NVML's GPU numbers)
    retired and created with their Slurm nodes, the waiting job each new instance is for, the region held for a
    blocked job (seconds until its reservation starts; None: a busy instance there has no time limit), and the
    carving's reasons in words."""

    destroy: tuple[tuple[str, str], ...]
    create: tuple[tuple[str, str, str], ...]
    hold: tuple[str, str, float | None] | None
    reasons: tuple[str, ...]

    def signature(self) -> str:
        """What makes two rounds' carvings the same decision: the changes and the held region (not the reasons'
        words, nor the hold's countdown)."""
        hold = None if self.hold is None else self.hold[:2]
        return json.dumps([self.destroy, self.create, hold])


def carving_report(
    name: Callable[[int, int, str], str], hl: HostLayouts, carving: Carving, *, now_s: float
) -> CarvingReport:
    """The report of ``carving`` on ``hl`` (``name``: the Slurm node of an instance, by NVML GPU, start and
    profile; ``now_s``: the clock of the carving's hold)."""
    destroy = []
    for i, start in carving.destroy:
        inst = hl.layouts[i].at(start)
        profile = inst.profile.name if inst is not None else "?"
        destroy.append((f"gpu{hl.gpus[i]}:{profile}@{start}", name(hl.gpus[i], start, profile)))
    create = [
        (f"gpu{hl.gpus[i]}:{p.profile.name}@{p.start}", name(hl.gpus[i], p.start, p.profile.name), job)
        for i, p, job in carving.create
    ]
    hold = None
    if carving.hold is not None:
        h = carving.hold
        left = None if math.isinf(h.at_s) else round(max(0.0, h.at_s - now_s), 3)
        hold = (h.job, f"gpu{hl.gpus[h.gpu]}:{h.profile}@{h.start}", left)
    return CarvingReport(tuple(destroy), tuple(create), hold, carving.reasons)
