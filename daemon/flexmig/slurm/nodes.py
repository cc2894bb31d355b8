"""Slurm's nodes as typed values, read from ``sinfo --json`` (Slurm 22.05, OpenAPI v0.0.38).

Verified on 22.05.8: ``scontrol`` has no ``--json`` option before 23.02 (``scontrol --json show node`` is
"unrecognized option"), so the node's state comes from ``sinfo --json``, which, like ``squeue --json``, ignores its
``-n`` filter and lists every node. A node's ``state`` is its base state (``idle``, ``mixed``, ``allocated``,
``down``...) and ``state_flags`` the rest (``DRAIN``, ``DYNAMIC_NORM``, ``NOT_RESPONDING``, ``COMPLETING``...);
``gres`` is its configured GRES (``gpu:3g.71gb:1,gpu:1g.18gb:2``), ``gres_used`` what jobs hold with indices.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flexmig.errors import SlurmError
from flexmig.slurm.dataparser import is_data_parser, node_record
from flexmig.slurm.envelope import decode, field, records
from flexmig.slurm.gres import GresCount, parse_gres

__all__ = ["SlurmNode", "gpu_hosts", "host_of", "parse_scontrol_nodes", "parse_sinfo"]

COMMAND = "sinfo --json"
SCONTROL_COMMAND = "scontrol --json show nodes"
_MAX_ATTR = 4096


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
    features: str = ""
    active_features: str = ""
    weight: int = 1
    comment: str = ""
    extra: str = ""
    slurmd_start_s: float = 0.0
    """When its slurmd registered last started (epoch seconds; 0: unknown)."""

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

    def attributes(self) -> dict[str, str]:
        """What an administrator may have set on the node with ``scontrol update`` and a re-registration (delete
        and register again) would lose: ``features``, ``active_features``, ``weight``, ``comment``, ``extra``, as
        ``scontrol update`` takes them."""
        return {
            "features": self.features,
            "activefeatures": self.active_features,
            "weight": str(self.weight),
            "comment": self.comment,
            "extra": self.extra,
        }

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
        features=_bounded(field(rec, "features", str, where, default=""), where, "features"),
        active_features=_bounded(field(rec, "active_features", str, where, default=""), where, "active_features"),
        weight=field(rec, "weight", int, where, default=1),
        comment=_bounded(field(rec, "comment", str, where, default=""), where, "comment"),
        extra=_bounded(field(rec, "extra", str, where, default=""), where, "extra"),
        slurmd_start_s=float(field(rec, "slurmd_start_time", int, where, default=0) or 0),
    )


def _bounded(text: str, where: str, key: str) -> str:
    if len(text) > _MAX_ATTR:
        raise SlurmError(f"{where}: '{key}' is longer than {_MAX_ATTR} characters")
    return text


def parse_sinfo(text: str | bytes) -> tuple[SlurmNode, ...] | None:
    """Every node in ``sinfo --json``'s answer (Slurm 22.05), or None when that answer comes from Slurm 23.02 or
    later, whose ``sinfo --json`` no longer lists nodes (ask :func:`parse_scontrol_nodes`'s command then).
    SlurmError names the first problem."""
    doc = decode(text, COMMAND)
    if is_data_parser(doc) and "nodes" not in doc:
        return None
    return tuple(_node(rec, i) for i, rec in enumerate(records(doc, "nodes", COMMAND)))


def parse_scontrol_nodes(text: str | bytes) -> tuple[SlurmNode, ...]:
    """Every node in ``scontrol --json show nodes``'s answer (Slurm 23.02 and later). SlurmError names the first
    problem."""
    doc = decode(text, SCONTROL_COMMAND)
    recs = records(doc, "nodes", SCONTROL_COMMAND)
    return tuple(_node(node_record(rec), i) for i, rec in enumerate(recs))


_FLEXMIG_NODE = re.compile(r"(.+)-gpu[0-9]{1,3}(?:-[0-9](?:-[0-9a-z]{1,32})?)?")
"""The names flexmig gives a host's nodes: ``<host>-gpu<K>`` (one node per GPU), ``<host>-gpu<K>-<S>`` (one per MIG
instance) and ``<host>-gpu<K>-<S>-<profile>`` (a static instance node of slurm.conf)."""


def host_of(node: SlurmNode) -> str:
    """The machine a node runs on: the host its flexmig name begins with (``<host>-gpu<K>...``), else its address,
    else its name. A flexmig node's name comes first because a dynamic node takes the address its slurmd registered
    from, which on machines that share one (the testbed's hosts on 127.0.0.1, or hosts behind one NAT) is not the
    host's own."""
    m = _FLEXMIG_NODE.fullmatch(node.name)
    return m.group(1) if m else node.address or node.name


def gpu_hosts(nodes: Iterable[SlurmNode]) -> int:
    """How many machines the nodes with GPU GRES run on (:func:`host_of`): what the cluster's flexmig daemons are,
    whether each machine is one node or one node per GPU or MIG instance."""
    return len({host_of(n) for n in nodes if any(g.name == "gpu" for g in n.gres)})
