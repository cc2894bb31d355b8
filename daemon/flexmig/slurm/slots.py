"""The slurm.conf lines of a host's static instance nodes (``[slurm] node_per_instance`` with ``instance_nodes =
static``): one ``State=FUTURE`` node for every place each MIG profile can take on each GPU.

A static node's GRES is what slurm.conf says, whatever its slurmd reports (an untyped ``Gres=gpu:1`` stays untyped,
and typed jobs never run there: verified on Slurm 22.05.8), so a node cannot change profile: each profile and place
has a node of its own, ``<node>-gpu<K>-<S>-<profile without dots>`` (:func:`flexmig.slurm.settings.slot_node`).
Nodes of one GPU at the same first memory slice never run together (their instances would overlap), so they share
a port, ``slurmd_port_base + 8K + S``. A node's CPUs are a compute slice's share of the host's times its profile's
compute slices.

Verified with real daemons on 22.05.8 and 24.11.5: a FUTURE node's slurmd (``slurmd -N NAME``, no ``-Z``) registers
it and it is IDLE at once; ``scontrol update nodename=N state=future`` returns an idle (or drained) node to FUTURE,
hidden from ``sinfo`` and ``scontrol show node`` and no longer pinged, and is refused while a job runs there
("Invalid node state transition"); registered again, it comes back IDLE without the drain. Slurm returns every such
node to FUTURE when slurmctld starts again (and, from 23.11, at ``scontrol reconfigure``, which starts a new
slurmctld) while their slurmds run on and their jobs complete; a slurmd started again registers its node with its
jobs, which flexmig does in its next round.
"""

from __future__ import annotations

from collections.abc import Iterator

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.slurm.settings import instance_port, slot_node

__all__ = ["slot_count", "slot_lines", "slot_places"]


def slot_places(model: GpuModel, gpus: int) -> Iterator[tuple[int, Profile, int]]:
    """``(gpu, profile, start)`` of every static node of a host of ``gpus`` GPUs of ``model``: GPU by GPU, profile
    by profile (the planner's plain ones), start by start."""
    for gpu in range(gpus):
        for p in model.plain_profiles:
            for start in p.starts:
                yield gpu, p, start


def slot_count(model: GpuModel, gpus: int) -> int:
    """How many static nodes a host of ``gpus`` GPUs of ``model`` has."""
    return sum(1 for _ in slot_places(model, gpus))


def slot_lines(
    node: str, model: GpuModel, gpus: int, *, port_base: int, cpus_per_slice: int, hostname: str, addr: str
) -> list[str]:
    """slurm.conf's ``NodeName=`` line of every static instance node of host node ``node`` (``hostname`` and
    ``addr``: slurm.conf's ``NodeHostname=`` and ``NodeAddr=``), GPU by GPU, profile by profile."""
    return [
        f"NodeName={slot_node(node, gpu, start, p.name)} NodeHostname={hostname} NodeAddr={addr} "
        f"Port={instance_port(port_base, gpu, start)} CPUs={cpus_per_slice * p.compute_slices} "
        f"Gres=gpu:{p.name}:1 State=FUTURE"
        for gpu, p, start in slot_places(model, gpus)
    ]
