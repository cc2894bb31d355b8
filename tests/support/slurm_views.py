"""Slurm's view of a cluster's instance nodes, built by hand for the pure tests of the cluster assignment
(flexmig.slurm.cluster_claims): nodes in each state the assignment tells apart, and layouts to lay them out in."""

from __future__ import annotations

from flexmig.slurm.cluster_claims import BUSY, CLOSED, IDLE, RETIRING
from flexmig.slurm.gres import GresCount
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.settings import instance_node, slot_node

LAYOUTS = (
    (("7g.141gb", 0),),
    (("3g.71gb", 0), ("3g.71gb", 4)),
    (("4g.71gb", 0), ("3g.71gb", 4)),
    tuple(("1g.18gb", s) for s in range(7)),
    (("2g.35gb", 0), ("2g.35gb", 2), ("3g.71gb", 4)),
    (("3g.71gb", 4),),
    (("1g.18gb", 0), ("2g.35gb", 2)),
)
"""H200 layouts, (profile, start) each, from a whole GPU to a scattered one, for hypothesis to draw from."""

STATES = {IDLE: ("idle", frozenset(), ""), BUSY: ("allocated", frozenset(), ""),
          CLOSED: ("idle", frozenset({"DRAIN"}), "maintenance"),
          RETIRING: ("idle", frozenset({"DRAIN"}), "flexmig: carving new MIG instances")}  # fmt: skip
"""What Slurm lists (state, flags, reason) for an instance node the assignment reads as each of its states."""


def node(host: str, gpu: int, start: int, profile: str, what: str = IDLE, *, static: bool = True) -> SlurmNode:
    """The instance node of ``profile`` at ``start`` of GPU ``gpu`` of ``host`` as Slurm lists it."""
    state, flags, reason = STATES[what]
    name = slot_node(host, gpu, start, profile) if static else instance_node(host, gpu, start)
    return SlurmNode(name, state, flags, reason, (GresCount("gpu", profile, 1),), (), ("mig",), 8)


def host_nodes(host: str, layout: tuple[tuple[str, int], ...], what: str = IDLE, gpu: int = 0) -> list[SlurmNode]:
    """Every instance node of ``layout`` on GPU ``gpu`` of ``host``, all in state ``what``."""
    return [node(host, gpu, s, p, what) for p, s in layout]
