"""Which host of a cluster carves for which waiting job (``[slurm] node_per_instance`` on several hosts).

Every host's flexmigd sees the whole cluster's instance nodes in one look at Slurm (``sinfo``/``scontrol``), so each
computes the same assignment from it, with no lock and no message (as the site-wide ``max_closed_nodes`` does with
Slurm's reservations):

* :func:`cluster_hosts` reads each host's GPUs from the instance nodes of every host (``<host>-gpu<K>-<S>``, a static
  one ``<host>-gpu<K>-<S>-<profile>``): the instances that exist (busy, idle, being retired by their host's carving,
  or closed by an administrator) and so the places that are free; a FUTURE node that Slurm lists adds its GPU, a
  registered pool node its instances (:mod:`flexmig.slurm.pool`: busy, or closed and serving its job alone);
* :func:`assign` takes the waiting jobs in Slurm's priority order and gives each to the host where it needs the least
  carving: an idle instance of its profile (Slurm starts it there: no carving anywhere), else free slices, else the
  fewest idle compute slices destroyed; ties go by a rotation on the job's ID (so that equal hosts share the work),
  then by host name. A job no host can serve now stays unassigned. A job of several devices on one node
  (``--gres=gpu:1g.18gb:2``, a pool node's: :mod:`flexmig.slurm.pool`) counts as its parts, all given to one host
  and, for a profile smaller than a GPU, to one GPU of it (where they cost the least carving), so that exactly one
  host carves and makes a pool node for it;
* :func:`aged` and :func:`queue_for` give a host its queue: the jobs assigned to it, the unassigned ones, and those
  assigned to another host that still wait ``free_after_s`` after the assignment was first seen (that host cannot
  see or do what the others think: its flexmigd is down, older, or its view differs), which become anyone's again,
  as every job was before;
* :func:`move_owner` names the one host that may move running hook jobs for a waiting job that no host can serve
  (:mod:`flexmig.slurm.moving`): unassigned, such a job is in every host's queue, and without an owner each host
  would checkpoint and requeue its own jobs for it, so that two GPUs drain for one job. The owner is the host whose
  best region for the job's profile is free soonest once its hook jobs leave (the latest time limit of the jobs
  there that may not move, read from Slurm's jobs), then the one that moves the fewest. A host with room for the
  job's instance now (no busy instance in the way) comes first, as no move is needed at all; then a host that holds
  a region already (its reservation ``flexmig-<host>-hold``), so that a host that moved jobs keeps the job it moved
  them for when another host's jobs end early. A job whose owner's flexmigd is down gets no move (it waits as it
  would without moves: a move is the one step that must never happen twice for one job).

Pure: the caller reads Slurm, passes the time in and keeps :class:`Seen` from round to round.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from flexmig.errors import LayoutError
from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Waiting
from flexmig.slurm.demand import job_id_of, read_demand
from flexmig.slurm.instances import hold_name, queue_of
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import SlurmReservation
from flexmig.slurm.settings import slot_tag
from flexmig.slurm.squeue import SlurmJob

__all__ = [
    "BUSY",
    "CLOSED",
    "FREE_AFTER_MIN_S",
    "FREE_AFTER_ROUNDS",
    "IDLE",
    "RETIRING",
    "ClusterHost",
    "Seen",
    "aged",
    "assign",
    "cluster_hosts",
    "cluster_queue",
    "host_queue",
    "move_owner",
    "pool_gpu",
    "pool_jobs",
    "queue_for",
    "running_places",
]

FREE_AFTER_ROUNDS = 3
FREE_AFTER_MIN_S = 60.0
"""A job assigned to another host becomes anyone's once it has waited so assigned for ``FREE_AFTER_ROUNDS``
rounds (``interval_s``), and at least ``FREE_AFTER_MIN_S``: as long as a claim of the per-GPU mode holds
(:class:`flexmig.slurm.claims.Claims`), long enough for its host to carve (a few seconds) and for Slurm to start
the job on the new instance (its scheduler may take up to a ``sched_interval``, 60 s by default)."""

_NAME = re.compile(r"(.+)-gpu([0-9]{1,3})-([0-9])(?:-([0-9a-z]{1,32}))?")

IDLE, BUSY, RETIRING, CLOSED = "idle", "busy", "retiring", "closed"
"""What an instance is to the assignment: it serves a job of its profile and may be destroyed (idle); it runs a
job (busy); its host's carving is destroying it (retiring: its place is as good as free); an administrator or a
reservation holds it, or its slurmd does not answer (closed: neither serves nor is destroyed)."""


@dataclass(frozen=True, slots=True)
class ClusterHost:
    """One host as the cluster's view shows it: its partitions and, per GPU number, its instances ``start ->
    (profile, what)`` (``what``: :data:`IDLE`, :data:`BUSY`, :data:`RETIRING` or :data:`CLOSED`); ``pools``: its
    open pool nodes (registered, idle, not held), each as ``(profile, count)``, which serve a waiting job of exactly
    that many devices of that profile at once."""

    name: str
    partitions: frozenset[str]
    gpus: Mapping[int, Mapping[int, tuple[str, str]]]
    pools: tuple[tuple[str, int], ...] = ()


def _instance(n: SlurmNode, model: GpuModel) -> tuple[str, int, int, str | None] | None:
    """``(host, gpu, start, profile)`` of an instance node of ``model`` (profile None: a FUTURE node, which has no
    instance), or None when ``n`` is no instance node."""
    m = _NAME.fullmatch(n.name)
    if m is None:
        return None
    counts = [(g.type, g.count) for g in n.gres if g.name == "gpu"]
    if len(counts) != 1 or counts[0][1] != 1 or counts[0][0] is None:
        return None
    try:
        profile = model.profile(counts[0][0])
    except KeyError:
        return None
    if int(m.group(3)) not in profile.starts or (m.group(4) is not None and m.group(4) != slot_tag(profile.name)):
        return None
    return m.group(1), int(m.group(2)), int(m.group(3)), None if n.state == "future" else profile.name


def _what(n: SlurmNode, reserved: Collection[str]) -> str:
    if n.drained and n.reason.startswith("flexmig") and n.idle:  # flexmig drains an idle instance node to retire it
        return RETIRING
    if n.drained or not n.responding or n.name in reserved:
        return CLOSED
    return IDLE if n.idle else BUSY


def cluster_hosts(nodes: Iterable[SlurmNode], model: GpuModel, *, reserved: Collection[str]) -> dict[str, ClusterHost]:
    """Every host with instance nodes (or pool nodes) of ``model`` in Slurm's ``nodes``, by name. ``reserved``: the
    nodes any reservation names. A host whose instances overlap, or whose pool does not fit beside them (a view
    caught between two looks), is left out: it is assigned nothing, its jobs stay anyone's.

    A registered pool node (:mod:`flexmig.slurm.pool`) holds instances whose own nodes left Slurm, which would
    otherwise look free to every host (assigned, a move's target) until the pool is given back. Its name gives its
    host, GPU, count and profile, not its instances' starts: :func:`_pool_places` puts them on the first starts where
    they fit beside the GPU's instance nodes (a whole-GPU pool: the host's first ``n`` GPUs with no instance node),
    the exact places when the pool took its GPU's lowest free instances of the profile (as
    :func:`flexmig.slurm.pool.choose_pool` does on a GPU carved from its lowest slice), else as many free slices at
    other starts. They are :data:`BUSY` while a job holds the pool node, else :data:`CLOSED` (kept for its job:
    neither serving a one-device job, nor destroyed, nor a move's target)."""
    gpus: dict[str, dict[int, dict[int, tuple[str, str]]]] = {}
    parts: dict[str, set[str]] = {}
    bad: set[str] = set()
    pools: list[_PoolSeen] = []
    for n in nodes:
        pool = _pool(n, model, reserved)
        if pool is not None:
            pools.append(pool)
            gpus.setdefault(pool[0], {})
            parts.setdefault(pool[0], set()).update(n.partitions)
            continue
        got = _instance(n, model)
        if got is None:
            continue
        host, gpu, start, profile = got
        on_gpu = gpus.setdefault(host, {}).setdefault(gpu, {})
        parts.setdefault(host, set()).update(n.partitions)
        if profile is None:
            continue
        if start in on_gpu:
            bad.add(host)
        on_gpu[start] = (profile, _what(n, reserved))
    for seen in pools:
        if not _pool_places(model, gpus[seen[0]], seen):
            bad.add(seen[0])
    out = {}
    for host, by_gpu in gpus.items():
        try:
            for on_gpu in by_gpu.values():
                Layout.of(model, [(p, s) for s, (p, _) in on_gpu.items()])
        except LayoutError:
            bad.add(host)
        if host not in bad and by_gpu:
            open_pools = tuple(sorted((p.name, c) for h, _, p, c, what, free in pools if h == host and free))
            out[host] = ClusterHost(host, frozenset(parts[host]), by_gpu, open_pools)
    return out


_PoolSeen = tuple[str, int | None, Profile, int, str, bool]
"""A registered pool node as :func:`_pool` reads it: ``(host, gpu or None, profile, count, what, open)``."""

_POOL = re.compile(r"(.+?)(?:-gpu([0-9]{1,3}))?-x([0-9]{1,3})-([0-9a-z]{1,32})")


def _pool(n: SlurmNode, model: GpuModel, reserved: Collection[str]) -> _PoolSeen | None:
    """``(host, gpu or None, profile, count, what, open)`` of a registered pool node of ``model`` (its name
    :func:`flexmig.slurm.pool.pool_node`'s, its ``Gres=`` that many devices of that profile; ``what``: its
    instances', :data:`BUSY` or :data:`CLOSED`; ``open``: idle and not held, its job may start there), or None
    for any other node, and for a pool node in FUTURE (no pool: its instances have their own nodes)."""
    m = _POOL.fullmatch(n.name)
    counts = [(g.type, g.count) for g in n.gres if g.name == "gpu"]
    if m is None or n.state == "future" or len(counts) != 1 or counts[0][0] is None:
        return None
    try:
        profile = model.profile(counts[0][0])
    except KeyError:
        return None
    host, gpu, count = m.group(1), None if m.group(2) is None else int(m.group(2)), int(m.group(3))
    whole = profile.compute_slices >= model.compute_slices
    if counts[0][1] != count or count < 2 or slot_tag(profile.name) != m.group(4) or (gpu is None) != whole:
        return None
    held = n.drained or not n.responding or n.name in reserved
    return host, gpu, profile, count, CLOSED if n.idle or held else BUSY, n.idle and not held


def _pool_places(model: GpuModel, by_gpu: dict[int, dict[int, tuple[str, str]]], pool: _PoolSeen) -> bool:
    """Put a ``pool``'s ``count`` instances of ``profile`` (as ``what``) into its host's GPUs ``by_gpu`` (see
    :func:`cluster_hosts`): on GPU ``gpu`` at the first starts where they fit beside its instances, or (``gpu``
    None: a whole-GPU profile) on the first ``count`` GPUs with none (fewer when fewer are listed: a GPU with no
    node in the view is no room to anyone already). False when they do not fit."""
    _, gpu, profile, count, what, _ = pool
    if gpu is None:
        for k in [k for k in sorted(by_gpu) if not by_gpu[k]][:count]:
            by_gpu[k][profile.starts[0]] = (profile.name, what)
        return True
    on_gpu = by_gpu.setdefault(gpu, {})
    try:
        lay = Layout.of(model, [(p, s) for s, (p, _) in on_gpu.items()])
    except LayoutError:
        return False
    for _ in range(count):
        start = next((s for s in profile.starts if lay.can_place(profile, s)), None)
        if start is None:
            return False
        lay = lay.place(profile, start)
        on_gpu[start] = (profile.name, what)
    return True


@dataclass
class _Host:
    """A host as the assignment fills it: its layouts, what each instance is, and the instances given to jobs."""

    model: GpuModel
    host: ClusterHost
    layouts: dict[int, Layout] = field(default_factory=dict)
    what: dict[tuple[int, int], str] = field(default_factory=dict)
    given: set[tuple[int, int]] = field(default_factory=set)
    costs: dict[str, tuple[tuple[int, int, int, int], tuple[int, int]] | None] = field(default_factory=dict)
    """:meth:`cost` by profile name since the host last changed (a cluster of 100 hosts and 1,000 waiting jobs
    would otherwise search every host for every job)."""

    @classmethod
    def of(cls, model: GpuModel, host: ClusterHost) -> _Host:
        h = cls(model, host)
        for gpu, on_gpu in host.gpus.items():
            h.layouts[gpu] = Layout.of(model, [(p, s) for s, (p, _) in on_gpu.items()])
            h.what.update({(gpu, s): what for s, (_, what) in on_gpu.items()})
        return h

    def copy(self) -> _Host:
        """This host as filled so far, to try a pool job's parts on without changing it."""
        return _Host(self.model, self.host, dict(self.layouts), dict(self.what), set(self.given))

    def cost(
        self, profile: Profile, gpu_only: int | None = None
    ) -> tuple[tuple[int, int, int, int], tuple[int, int]] | None:
        """The least carving that serves a job of ``profile`` here (``gpu_only``: on that GPU alone), as
        ``((destroyed compute slices, instances created, -start, gpu), (gpu, start))``: an idle instance of the
        profile costs nothing, and a retiring one is not counted as destroyed (its host destroys it anyway); None
        when none fits."""
        if gpu_only is None and profile.name in self.costs:
            return self.costs[profile.name]
        best: tuple[tuple[int, int, int, int], tuple[int, int]] | None = None
        for gpu in sorted(self.layouts) if gpu_only is None else [g for g in self.layouts if g == gpu_only]:
            lay = self.layouts[gpu]
            for inst in lay:
                w = (gpu, inst.start)
                if inst.profile == profile and self.what[w] == IDLE and w not in self.given:
                    key = (0, 0, -inst.start, gpu)
                    best = min(best, (key, w)) if best is not None else (key, w)
            for start in profile.starts:
                over = [i for i in lay if i.start < start + profile.memory_slices and start < i.end]
                if any(self.what[(gpu, i.start)] not in (IDLE, RETIRING) or (gpu, i.start) in self.given for i in over):
                    continue
                rest = lay
                for i in over:
                    rest = rest.remove(i.start)
                if rest.can_place(profile, start):
                    lost = sum(i.profile.compute_slices for i in over if self.what[(gpu, i.start)] == IDLE)
                    key = (lost, 1, -start, gpu)
                    best = min(best, (key, (gpu, start))) if best is not None else (key, (gpu, start))
        if gpu_only is None:
            self.costs[profile.name] = best
        return best

    def take(self, profile: Profile, where: tuple[int, int], carved: bool) -> None:
        """Give ``where`` to a job of ``profile``: the idle instance there, or (``carved``) a new one."""
        gpu, start = where
        self.costs.clear()
        if carved:
            lay = self.layouts[gpu]
            for i in [i for i in lay if i.start < start + profile.memory_slices and start < i.end]:
                lay = lay.remove(i.start)
                self.what.pop((gpu, i.start), None)
            self.layouts[gpu] = lay.place(profile, start)
            self.what[where] = IDLE
        self.given.add(where)


def pool_gpu(host: ClusterHost, model: GpuModel, profile: Profile, count: int) -> int | None:
    """The GPU of ``host`` where ``count`` instances of ``profile`` (smaller than a GPU) for one pool node cost the
    least carving now (its idle instances of the profile first), the lowest on a tie; None when no GPU has room for
    them all now."""
    best: tuple[tuple[int, int], int] | None = None
    h = _Host.of(model, host)
    for gpu in sorted(host.gpus):
        got = _pool_fill(_Host(model, host, {gpu: h.layouts[gpu]}, dict(h.what)), profile, count)
        if got is not None and (best is None or got[0] < best[0]):
            best = (got[0], gpu)
    return None if best is None else best[1]


def _pool_fill(h: _Host, profile: Profile, count: int) -> tuple[tuple[int, int], _Host] | None:
    """A pool job's ``count`` parts of ``profile`` on host ``h``: all on one GPU (a profile smaller than a GPU: a
    pool node's instances share a GPU), the GPU where they cost the least carving (then the lowest), or on whole
    GPUs across the host; ``((destroyed compute slices, instances created), the host with them taken)``, or None
    when they do not all fit now."""
    gpus: list[int | None] = [None] if profile.compute_slices >= h.model.compute_slices else [*sorted(h.layouts)]
    best: tuple[tuple[int, int], _Host] | None = None
    for gpu in gpus:
        trial, lost, created = h.copy(), 0, 0
        for _ in range(count):
            got = trial.cost(profile, gpu)
            if got is None:
                break
            (k_lost, k_created, _, _), where = got
            trial.take(profile, where, carved=k_created > 0)
            lost, created = lost + k_lost, created + k_created
        else:
            if best is None or (lost, created) < best[0]:
                best = ((lost, created), trial)
    return best


def _groups(queue: Sequence[Waiting], pools: Collection[str]) -> list[list[Waiting]]:
    """``queue`` in order as the assignment takes it: a pool job's parts (``slurm-42#1`` ... of a job named in
    ``pools``) together, at its first part's place; every other job (or part of a job of several nodes) alone."""
    out: list[list[Waiting]] = []
    at: dict[str, list[Waiting]] = {}
    for job in queue:
        base = job.name.split("#", 1)[0]
        if "#" not in job.name or base not in pools:
            out.append([job])
        elif base in at:
            at[base].append(job)
        else:
            at[base] = [job]
            out.append(at[base])
    return out


def assign(
    queue: Sequence[Waiting], hosts: Mapping[str, ClusterHost], model: GpuModel, *,
    partitions: Mapping[str, Collection[str]], pools: Collection[str] = (),
) -> dict[str, str]:  # fmt: skip
    """Waiting job (the carving's name, :class:`flexmig.plan.carving.Waiting`) -> the host that carves for it, for
    the jobs of ``queue`` (Slurm's priority order) some host can serve now; ``partitions``: each job's partitions
    by name (a job with none listed may go to any host). ``pools``: the jobs (``slurm-<id>``) of several devices on
    one node, whose parts (``slurm-<id>#k``) are one pool node's: all go to one host, where they fit on one GPU
    (:func:`flexmig.slurm.pool.choose_pool`), or to none; a host with an open pool node of exactly that profile and
    count (:attr:`ClusterHost.pools`) comes first, as that host serves the job with it (Slurm starts it there), the
    first such job in priority order a pool node. Every host that computes it from the same view gets the
    same answer (nothing here depends on which host asks)."""
    names = sorted(hosts)
    filled = {h: _Host.of(model, hosts[h]) for h in names}
    open_pools = {h: list(hosts[h].pools) for h in names}
    out: dict[str, str] = {}
    for group in _groups(queue, pools):
        job = group[0]
        try:
            profile = model.profile(job.profile)
        except KeyError:
            continue
        wanted = frozenset(partitions.get(job.name, ()))
        served = _open_pool(group, open_pools, hosts, wanted)
        if served is not None:
            out.update({part.name: served for part in group})
            continue
        job_id = job_id_of(job.name) or 0
        best: tuple[tuple[int, int, int, str], _Host | tuple[int, int]] | None = None
        for k, h in enumerate(names):
            if wanted and not wanted & hosts[h].partitions:
                continue
            got = _fill(filled[h], profile, len(group))
            if got is None:
                continue
            (lost, created), taken = got
            key = (lost, created, (k - job_id) % len(names), h)  # the least carving, then the rotation, the name
            if best is None or key < best[0]:
                best = (key, taken)
        if best is None:
            continue
        (_, created, _, host), taken = best
        if isinstance(taken, _Host):
            filled[host] = taken
        else:
            filled[host].take(profile, taken, carved=created > 0)
        out.update({part.name: host for part in group})
    return out


def _open_pool(
    group: Sequence[Waiting], open_pools: Mapping[str, list[tuple[str, int]]], hosts: Mapping[str, ClusterHost],
    wanted: Collection[str],
) -> str | None:  # fmt: skip
    """The first host by name (of the partitions ``wanted``; none: any) whose open pool node serves the pool job of
    parts ``group`` (its profile and count), the pool then taken from ``open_pools``; else None."""
    key = (group[0].profile, len(group))
    fits = [h for h in sorted(open_pools) if key in open_pools[h] and (not wanted or set(wanted) & hosts[h].partitions)]
    if len(group) < 2 or not fits:
        return None
    open_pools[fits[0]].remove(key)
    return fits[0]


def _fill(h: _Host, profile: Profile, count: int) -> tuple[tuple[int, int], _Host | tuple[int, int]] | None:
    """One job's ``count`` instances of ``profile`` on host ``h``: their cost ``(destroyed compute slices,
    instances created)`` and where the one instance goes (``(gpu, start)``), or a pool job's (``count`` > 1,
    :func:`_pool_fill`) host with them taken; None when they do not fit now."""
    if count > 1:
        return _pool_fill(h, profile, count)
    got = h.cost(profile)
    if got is None:
        return None
    (lost, created, _, _), where = got
    return (lost, created), where


@dataclass(frozen=True, slots=True)
class Seen:
    """What a host remembers between rounds: since when (its clock) each waiting job has been assigned to the host
    it is assigned to now."""

    since: Mapping[str, tuple[str, float]] = field(default_factory=dict)


def aged(seen: Seen, assignment: Mapping[str, str], now_s: float) -> Seen:
    """``seen`` after a round that found ``assignment`` at ``now_s``: a job keeps its time while its host stays
    the same, starts again when another host gets it, and is forgotten once it no longer waits or is unassigned."""
    since = {}
    for job, host in assignment.items():
        prev = seen.since.get(job)
        since[job] = prev if prev is not None and prev[0] == host else (host, now_s)
    return Seen(since)


def queue_for(
    host: str, queue: Sequence[Waiting], assignment: Mapping[str, str], seen: Seen, *, now_s: float,
    free_after_s: float,
) -> tuple[list[Waiting], dict[str, str]]:  # fmt: skip
    """Host ``host``'s queue for its carving: the jobs of ``queue`` assigned to it, those no host was assigned, and
    those another host was assigned ``free_after_s`` or longer ago (by ``seen``) that still wait; and the jobs left
    to other hosts, with why."""
    mine: list[Waiting] = []
    left: dict[str, str] = {}
    for job in queue:
        other = assignment.get(job.name)
        since = seen.since.get(job.name)
        stuck = since is not None and since[0] == other and now_s - since[1] >= free_after_s
        if other is None or other == host or stuck:
            mine.append(job)
        else:
            left[job.name] = f"host {other} carves for it (the cluster's assignment)"
    return mine, left


def cluster_queue(
    jobs: Sequence[SlurmJob], model: GpuModel, *, now_s: float, hook_token: str, most_parts: int
) -> tuple[list[Waiting], dict[str, frozenset[str]]]:
    """The whole cluster's waiting jobs for :func:`assign` (Slurm's priority order, whatever their partitions; a
    job of several devices on one node as the parts of its pool node, :func:`pool_jobs`), and each one's
    partitions. A job that names nodes to run on or to avoid is left out (it stays anyone's: the
    hosts cannot tell from names alone where Slurm may start it)."""
    demand = read_demand(jobs, None, "", model, index_map={}, now_s=now_s, hook_token=hook_token)
    queue, _ = queue_of(demand, now_s, most_parts=most_parts, pools=True, model=model)
    by_id = {j.job_id: j for j in demand.pending_jobs}
    out: list[Waiting] = []
    partitions: dict[str, frozenset[str]] = {}
    for w in queue:
        job = by_id.get(job_id_of(w.name) or -1)
        if job is None or job.required_nodes or job.excluded_nodes:
            continue
        out.append(w)
        partitions[w.name] = frozenset(job.partitions)
    return out, partitions


def pool_jobs(queue: Iterable[Waiting], jobs: Sequence[SlurmJob]) -> frozenset[str]:
    """The jobs of ``queue`` (their names without the part, ``slurm-42``) that wait as the parts of one pool node:
    several devices on one node of Slurm's ``jobs`` (a job of several nodes waits as parts too, one a node)."""
    nodes = {j.job_id: j.node_count for j in jobs}
    out = set()
    for w in queue:
        base, part, _ = w.name.partition("#")
        if part and nodes.get(job_id_of(base) or -1, 2) <= 1:
            out.add(base)
    return frozenset(out)


def host_queue(
    host: str, queue: Sequence[Waiting], nodes: Iterable[SlurmNode], jobs: Sequence[SlurmJob], model: GpuModel, *,
    reserved: Collection[str], seen: Seen, now_s: float, hook_token: str, free_after_s: float,
) -> tuple[list[Waiting], dict[str, str], Seen]:  # fmt: skip
    """Host ``host``'s ``queue`` (its own waiting jobs, :func:`flexmig.slurm.instances.queue_of`) less the jobs the
    cluster's assignment gives other hosts (:func:`assign` on Slurm's ``nodes`` and ``jobs``), the jobs left to
    them with why, and what to remember for the next round. With no other host in the view the queue is as it is."""
    hosts = cluster_hosts(nodes, model, reserved=reserved)
    if not any(h != host for h in hosts):
        return list(queue), {}, Seen()
    most = sum(len(h.gpus) for h in hosts.values()) * model.compute_slices
    everyone, partitions = cluster_queue(jobs, model, now_s=now_s, hook_token=hook_token, most_parts=most)
    assignment = assign(everyone, hosts, model, partitions=partitions, pools=pool_jobs(everyone, jobs))
    seen = aged(seen, assignment, now_s)
    mine, left = queue_for(host, queue, assignment, seen, now_s=now_s, free_after_s=free_after_s)
    return mine, left, seen


Spot = tuple[str, int, int]
"""An instance in the cluster's view: ``(host, GPU number, start)``."""


def running_places(
    jobs: Sequence[SlurmJob], model: GpuModel, *, hook_token: str, max_moves: int
) -> dict[Spot, tuple[bool, float]]:
    """The instances Slurm's running ``jobs`` hold, each with whether its job may be moved as Slurm shows it (it
    opted into the hook and ``--requeue``, runs on one instance node alone, and was restarted fewer than
    ``max_moves`` times) and when its time limit ends it (epoch seconds; inf: no limit)."""
    out: dict[Spot, tuple[bool, float]] = {}
    for j in jobs:
        if not j.active or j.pending:
            continue
        opted = hook_token in re.split(r"[\s,;]+", j.comment)
        movable = j.requeue and opted and j.node_count == 1 and len(j.nodes) == 1 and j.restart_count < max_moves
        end = math.inf if j.start_s is None or j.time_limit_s is None else j.start_s + j.time_limit_s
        for node in j.nodes:
            m = _NAME.fullmatch(node)
            if m is not None:
                out[(m.group(1), int(m.group(2)), int(m.group(3)))] = (movable, end)
    return out


def _region_key(
    host: ClusterHost, model: GpuModel, profile: Profile, places: Mapping[Spot, tuple[bool, float]]
) -> tuple[float, int] | None:
    """The best region of ``profile`` on ``host`` for moves: ``(when the jobs that may not move there end, how many
    may move)``, the soonest then the fewest; None when every placement holds a closed instance."""
    best: tuple[float, int] | None = None
    for gpu, on_gpu in sorted(host.gpus.items()):
        for start in profile.starts:
            if not Layout.empty(model).can_place(profile, start):
                continue
            stay, moving = 0.0, 0
            for s, (name, what) in on_gpu.items():
                if not (s < start + profile.memory_slices and start < s + model.profile(name).memory_slices):
                    continue
                if what == CLOSED:
                    break
                if what == BUSY:
                    movable, end = places.get((host.name, gpu, s), (False, math.inf))
                    if movable:
                        moving += 1
                    else:
                        stay = max(stay, end)
            else:
                key = (stay, moving)
                best = key if best is None or key < best else best
    return best


def move_owner(
    job: Waiting, nodes: Iterable[SlurmNode], jobs: Sequence[SlurmJob], reservations: Sequence[SlurmReservation],
    model: GpuModel, *, hook_token: str, max_moves: int, partitions: Collection[str] = (),
) -> str | None:  # fmt: skip
    """The one host that may move running jobs for the waiting ``job`` (see the module docstring), from Slurm's
    ``nodes``, ``jobs`` and ``reservations``; ``partitions``: the job's (none: any host). Every host that computes
    it from the same view gets the same answer. None when no host has a region of its profile."""
    try:
        profile = model.profile(job.profile)
    except KeyError:
        return None
    others = {n for r in reservations if not r.flexmig for n in r.nodes}  # flexmig's own holds are no closure here
    hosts = cluster_hosts(nodes, model, reserved=others)
    holding = {r.name for r in reservations if r.flexmig}
    places = running_places(jobs, model, hook_token=hook_token, max_moves=max_moves)
    names = sorted(hosts)
    job_id = job_id_of(job.name) or 0
    wanted = frozenset(partitions)
    best: tuple[tuple[bool, bool, float, int, int, str], str] | None = None
    for k, h in enumerate(names):
        if wanted and not wanted & hosts[h].partitions:
            continue
        region = _region_key(hosts[h], model, profile, places)
        if region is None:
            continue
        free_now = region == (0.0, 0)  # the job's instance can be carved there without a move: no host moves
        key = (not free_now, hold_name(h) not in holding, *region, (k - job_id) % len(names), h)
        if best is None or key < best[0]:
            best = (key, h)
    return None if best is None else best[1]
