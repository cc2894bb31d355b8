"""Pool nodes: one Slurm node over several MIG instances of one host, for a job that asks for several devices of one
profile on one node (``sbatch --gres=gpu:1g.18gb:2``) under one node per MIG instance (``[slurm] layout = auto``).

Slurm counts a job's GRES per node, so the devices of such a job must all be one node's; each instance node has one.
A pool node is the node such a job runs on: its ``Gres=gpu:<profile>:<n>`` is exactly ``n`` instances set aside
for the job, whose own instance nodes leave Slurm meanwhile (docs/slurm-node.md, "Jobs that want several MIG
devices on one host"). This module holds the pure decisions; the caller reads Slurm and NVML and carries them out:

* :func:`pool_asks`: which waiting jobs want a pool node, and of which profile and count;
* :func:`pool_node`, :func:`parse_pool_node`, :func:`pool_places`, :func:`pool_lines`: the static form's names and
  slurm.conf lines (any Slurm from 22.05): one ``State=FUTURE`` line per GPU, profile and count that fits one GPU,
  ``<host>-gpu<K>-x<n>-<profile>``, and per host ``<host>-x<n>-<profile>`` for a whole-GPU profile on ``n`` GPUs;
  the ``x`` keeps them apart from the instance nodes (:func:`flexmig.slurm.settings.parse_instance_node` never
  reads a pool node as one), and a high ``Weight=`` keeps one-device jobs on instance nodes while both fit;
* :func:`choose_pool`: which free instances a pool takes (all on one GPU, or whole GPUs across the host);
* :func:`split_asks`: which waiting jobs the registered pool nodes serve, and which want pool nodes of their own;
* :func:`pool_retires`: when a pool node leaves Slurm and gives its instances back.

Pure: no I/O, no clock (a pool's idleness is counted in rounds by the caller).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.plan.types import JobRequest
from flexmig.slurm.settings import slot_tag

__all__ = [
    "POOL_WEIGHT",
    "Pool",
    "PoolAsk",
    "PoolDevice",
    "choose_pool",
    "parse_pool_node",
    "pool_asks",
    "pool_lines",
    "pool_node",
    "pool_places",
    "pool_port",
    "pool_retires",
    "split_asks",
]

POOL_WEIGHT = 1000
"""slurm.conf's ``Weight=`` of a pool node: Slurm allocates the lowest weight first, and instance nodes have the
default 1, so a one-device job never lands on a pool node while an instance node fits it."""

_MAX_GPUS = 64
"""The most GPUs a host's pool lines are written for (a bound on the input, far above any real host)."""


@dataclass(frozen=True, slots=True)
class PoolAsk:
    """A waiting job (``job``: its request's name, ``slurm-<id>``) asking for ``count`` > 1 MIG devices of
    ``profile`` on one node."""

    job: str
    profile: str
    count: int

    @property
    def gres(self) -> str:
        """The pool node's ``Gres=`` that serves this ask exactly."""
        return f"gpu:{self.profile}:{self.count}"


@dataclass(frozen=True, slots=True)
class PoolDevice:
    """A MIG instance of the host as a pool sees it: where it is (NVML GPU, first memory slice), its profile, and
    whether it may be set aside now (``free``: its instance node is idle, registered, not held by an administrator
    or a reservation, and no other pool has it)."""

    gpu: int
    start: int
    profile: str
    free: bool


@dataclass(frozen=True, slots=True)
class Pool:
    """The instances set aside for one ask, ``devices`` as ``(gpu, start)`` in the order of the pool node's
    gres.conf lines (GPU, then slice); ``gpu`` is their GPU, or None when they are whole GPUs across the host."""

    profile: str
    devices: tuple[tuple[int, int], ...]
    gpu: int | None

    @property
    def count(self) -> int:
        """How many devices the pool node has."""
        return len(self.devices)

    @property
    def gres(self) -> str:
        """The pool node's ``Gres=``."""
        return f"gpu:{self.profile}:{self.count}"

    def name(self, host: str) -> str:
        """The pool node's name on host node ``host`` (:func:`pool_node`)."""
        return pool_node(host, self.gpu, self.count, self.profile)


def pool_asks(requests: Iterable[JobRequest]) -> list[PoolAsk]:
    """The waiting requests (in the order given: Slurm's priority order) that ask for several MIG devices of one
    profile on one node; requests of no MIG profile or of one device are not pool asks."""
    return [PoolAsk(r.name, r.need.profile, r.ranks) for r in requests if r.need.profile is not None and r.ranks > 1]


def whole_gpu(model: GpuModel, profile: Profile) -> bool:
    """Whether ``profile`` takes a whole GPU of ``model`` (a pool of it spans GPUs: one instance a GPU)."""
    return profile.compute_slices >= model.compute_slices


def pool_node(host: str, gpu: int | None, count: int, profile: str) -> str:
    """The name of the pool node of ``count`` devices of ``profile`` on GPU ``gpu`` of host node ``host``,
    ``<host>-gpu<K>-x<n>-<profile without dots>``, or across the host's GPUs (``gpu`` None),
    ``<host>-x<n>-<profile without dots>``. ValueError for a count below 2 (one device is an instance node)."""
    if count < 2:
        raise ValueError(f"a pool node has 2 devices or more, not {count}")
    where = host if gpu is None else f"{host}-gpu{gpu}"
    return f"{where}-x{count}-{slot_tag(profile)}"


def parse_pool_node(host: str, name: str) -> tuple[int | None, int, str] | None:
    """``(gpu or None, count, profile tag)`` when ``name`` is a pool node of host node ``host``
    (:func:`pool_node`), else None."""
    m = re.fullmatch(re.escape(host) + r"(?:-gpu([0-9]{1,3}))?-x([0-9]{1,3})-([0-9a-z]{1,32})", name)
    if m is None or int(m.group(2)) < 2:
        return None
    return (None if m.group(1) is None else int(m.group(1))), int(m.group(2)), m.group(3)


def pool_places(model: GpuModel, gpus: int) -> Iterator[tuple[int | None, Profile, int]]:
    """``(gpu or None, profile, count)`` of every static pool node of a host of ``gpus`` GPUs of ``model``: per
    GPU, each of the planner's plain profiles that is not a whole GPU, with count 2 up to as many as one GPU holds;
    then, for each whole-GPU profile, count 2 up to ``gpus`` across the host (gpu None)."""
    if not 1 <= gpus <= _MAX_GPUS:
        raise ValueError(f"a host of {gpus} GPUs: expected 1 to {_MAX_GPUS}")
    for gpu in range(gpus):
        for p in model.plain_profiles:
            if not whole_gpu(model, p):
                for n in range(2, p.max_instances + 1):
                    yield gpu, p, n
    for p in model.plain_profiles:
        if whole_gpu(model, p):
            for n in range(2, gpus + 1):
                yield None, p, n


def pool_port(port_base: int, gpus: int, index: int) -> int:
    """The slurmd port of the ``index``-th pool node of a host of ``gpus`` GPUs: above the instance nodes'
    (``port_base + 8 * gpus`` is the first port no instance node uses), one each, since pool nodes of different
    profiles may run together."""
    return port_base + 8 * gpus + index


def pool_lines(
    host: str, model: GpuModel, gpus: int, *, port_base: int, cpus_per_slice: int, hostname: str, addr: str
) -> list[str]:
    """slurm.conf's ``NodeName=`` line of every static pool node of host node ``host`` (:func:`pool_places`, in
    that order; ``hostname`` and ``addr``: slurm.conf's ``NodeHostname=`` and ``NodeAddr=``), ``State=FUTURE``
    like the static instance nodes, with their CPUs (a compute slice's share times the slices of all its
    devices) and :data:`POOL_WEIGHT`."""
    return [
        f"NodeName={pool_node(host, gpu, n, p.name)} NodeHostname={hostname} NodeAddr={addr} "
        f"Port={pool_port(port_base, gpus, k)} CPUs={cpus_per_slice * p.compute_slices * n} "
        f"Gres=gpu:{p.name}:{n} Weight={POOL_WEIGHT} State=FUTURE"
        for k, (gpu, p, n) in enumerate(pool_places(model, gpus))
    ]


def choose_pool(ask: PoolAsk, devices: Sequence[PoolDevice], model: GpuModel) -> Pool | None:
    """The instances set aside for ``ask`` among the host's ``devices``, or None when too few are free.

    A profile smaller than a GPU takes ``ask.count`` free instances of that profile on one GPU: of the GPUs that
    have enough, the one with the fewest (so a GPU with more stays whole for a bigger ask; ties: the lowest
    index), its instances from the lowest slice. A whole-GPU profile takes free instances on the lowest GPUs.
    KeyError for a profile ``model`` does not have."""
    profile = model.profile(ask.profile)
    free = sorted((d.gpu, d.start) for d in devices if d.free and d.profile == profile.name)
    if whole_gpu(model, profile):
        chosen = free[: ask.count]
        return Pool(profile.name, tuple(chosen), None) if len(chosen) == ask.count else None
    by_gpu: dict[int, list[tuple[int, int]]] = {}
    for gpu, start in free:
        by_gpu.setdefault(gpu, []).append((gpu, start))
    fits = [(len(places), gpu) for gpu, places in by_gpu.items() if len(places) >= ask.count]
    if not fits:
        return None
    _, gpu = min(fits)
    return Pool(profile.name, tuple(by_gpu[gpu][: ask.count]), gpu)


def split_asks(asks: Iterable[PoolAsk], pools: Iterable[Pool]) -> tuple[frozenset[str], list[PoolAsk]]:
    """The waiting jobs the registered ``pools`` serve (in ``asks``' order, Slurm's priority order: as many jobs of a
    ``Gres=`` as there are pool nodes of it) and the asks left, which want pool nodes of their own."""
    have: dict[str, int] = {}
    for p in pools:
        have[p.gres] = have.get(p.gres, 0) + 1
    served: set[str] = set()
    left: list[PoolAsk] = []
    for a in asks:
        if have.get(a.gres, 0) > 0:
            have[a.gres] -= 1
            served.add(a.job)
        else:
            left.append(a)
    return frozenset(served), left


def pool_retires(pool: Pool, *, idle_rounds: int, held: bool, asks: Iterable[PoolAsk]) -> bool:
    """Whether a registered pool node leaves Slurm and gives its instances back to their own nodes: once it has
    been idle for a whole round (``idle_rounds`` >= 1: a job Slurm is about to start there has had a round to
    start) and no waiting job asks for exactly its GRES (such a job runs on it at once), never while an
    administrator holds it (``held``: drained, down or reserved by someone else)."""
    if held or idle_rounds < 1:
        return False
    return all(a.gres != pool.gres for a in asks)
