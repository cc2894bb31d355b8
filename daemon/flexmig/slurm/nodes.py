"""Slurm's nodes as typed values, read from ``sinfo --json`` (Slurm 22.05, OpenAPI v0.0.38).

Verified on 22.05.8: ``scontrol`` has no ``--json`` option before 23.02 (``scontrol --json show node`` is
"unrecognized option"), so the node's state comes from ``sinfo --json``, which, like ``squeue --json``, ignores its
``-n`` filter and lists every node. A node's ``state`` is its base state (``idle``, ``mixed``, ``allocated``,
``down``...) and ``state_flags`` the rest (``DRAIN``, ``DYNAMIC_NORM``, ``NOT_RESPONDING``, ``COMPLETING``...);
``gres`` is its configured GRES (``gpu:3g.71gb:1,gpu:1g.18gb:2``), ``gres_used`` what jobs hold with indices.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flexmig.errors import SlurmError
from flexmig.slurm.envelope import decode, field, records
from flexmig.slurm.gres import GresCount, parse_gres

__all__ = ["SlurmNode", "parse_sinfo"]

COMMAND = "sinfo --json"


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as slurmctld sees it."""

    name: str
    state: str
    flags: frozenset[str]
    reason: str
    gres: tuple[GresCount, ...]
    gres_used: tuple[GresCount, ...]
    partitions: tuple[str, ...]
    cpus: int
    address: str = ""

    @property
    def drained(self) -> bool:
        """Marked DRAIN (whether or not jobs still run on it)."""
        return "DRAIN" in self.flags

    @property
    def idle(self) -> bool:
        """No job holds or is releasing anything on it."""
        return self.state == "idle" and "COMPLETING" not in self.flags

    @property
    def responding(self) -> bool:
        """slurmctld hears from its slurmd."""
        return "NOT_RESPONDING" not in self.flags and self.state not in ("down", "future", "unknown")

    @property
    def dynamic(self) -> bool:
        """Registered as a dynamic node (``slurmd -Z``)."""
        return any(f.startswith("DYNAMIC") for f in self.flags)

    def gpu_counts(self) -> dict[str, int]:
        """Configured GPU GRES per type (untyped ones under ``""``)."""
        out: dict[str, int] = {}
        for g in self.gres:
            if g.name == "gpu":
                out[g.type or ""] = out.get(g.type or "", 0) + g.count
        return out


def _node(rec: dict[str, Any], i: int) -> SlurmNode:
    name = field(rec, "name", str, f"nodes[{i}]")
    where = f"node {name}"
    flags = field(rec, "state_flags", list, where, default=[])
    if not all(isinstance(f, str) for f in flags):
        raise SlurmError(f"{where}: 'state_flags' holds a non-string")
    parts = field(rec, "partitions", list, where, default=[])
    if not all(isinstance(p, str) for p in parts):
        raise SlurmError(f"{where}: 'partitions' holds a non-string")
    return SlurmNode(
        name=name,
        state=field(rec, "state", str, where).lower(),
        flags=frozenset(f.upper() for f in flags),
        reason=field(rec, "reason", str, where, default=""),
        gres=parse_gres(field(rec, "gres", str, where, default=""), where=f"{where} gres"),
        gres_used=parse_gres(field(rec, "gres_used", str, where, default=""), where=f"{where} gres_used"),
        partitions=tuple(parts),
        cpus=field(rec, "cpus", int, where, default=0),
        address=field(rec, "address", str, where, default=""),
    )


def parse_sinfo(text: str | bytes) -> tuple[SlurmNode, ...]:
    """Every node in ``sinfo --json``'s answer. SlurmError names the first problem."""
    doc = decode(text, COMMAND)
    return tuple(_node(rec, i) for i, rec in enumerate(records(doc, "nodes", COMMAND)))
