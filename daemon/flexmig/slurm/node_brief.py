"""One node as ``sinfo -N -h -n NAME -O ...`` prints it: what a change's polls ask while they wait for a node to
register, to empty or to leave Slurm (:mod:`flexmig.slurm.change`).

Why not ``scontrol show node NAME`` or ``--json``: in Slurm's source (22.05.8 and 24.11.5 alike,
``src/scontrol/info_node.c``), ``scontrol show node NAME`` loads *every* node (``slurm_load_node``) and picks NAME
out in the command; ``sinfo --json`` on 22.05 dumps every node whatever ``-n`` says. Plain ``sinfo -n NAME`` with one
name asks slurmctld for that node alone (``slurm_load_node_single``, ``REQUEST_NODE_INFO_SINGLE``: one node packed
under the node read lock, ``src/sinfo/opts.c`` sets ``node_name_single`` when the host list has one name), plus the
partitions (a few records). On a cluster of 1,000 hosts a poll so costs one node record instead of some 20,000.

What it cannot say: a node in no partition is not listed (sinfo lists nodes by partition), nor a FUTURE one, and it
has no slurmd start time, features, weight, comment or extra. So a poll reads the brief form while the node is not
yet what the poll waits for, and the full record (:meth:`flexmig.slurm.client.SlurmClient.node`) once it is, and
every :data:`FULL_EVERY` polls whatever it says. Pure.
"""

from __future__ import annotations

from flexmig.errors import SlurmError
from flexmig.slurm.gres import GresCount, parse_gres
from flexmig.slurm.nodes import SlurmNode

__all__ = ["BRIEF_FIELDS", "FULL_EVERY", "SEP", "brief_format", "parse_brief"]

SEP = "\x1f"
"""What ends each field (ASCII's unit separator: no node name, state or GRES holds it); the reason comes last, so
that whatever it holds stays its own."""

BRIEF_FIELDS = ("nodelist", "statecomplete", "gres", "gresused", "partition", "cpus", "reason")
"""``sinfo -O`` fields (present in 22.05.8 and 24.11.5), in the order :func:`parse_brief` reads them."""

FULL_EVERY = 10
"""A poll reads the full record every this many polls even while the brief form says "not yet" (a node in no
partition never shows in it)."""

_MAX_LINES = 64


def brief_format() -> str:
    """``sinfo -O``'s argument: every field of :data:`BRIEF_FIELDS` whole (width 0), each ended by :data:`SEP`."""
    return ",".join(f"{f}:0{SEP}" for f in BRIEF_FIELDS)


def parse_brief(text: str | bytes, name: str) -> SlurmNode | None:
    """Node ``name`` from ``sinfo -N -h -n NAME -O brief_format()``'s answer (one line a partition it is in), or
    None when it lists no such node. SlurmError naming the line for an answer of another form."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > _MAX_LINES:
        raise SlurmError(f"sinfo -n {name}: {len(lines)} lines for one node; refused")
    found: list[list[str]] = []
    for line in lines:
        cells = [c.strip() for c in line.split(SEP, len(BRIEF_FIELDS) - 1)]
        if len(cells) != len(BRIEF_FIELDS):
            raise SlurmError(f"sinfo -n {name}: expected {len(BRIEF_FIELDS)} fields, got {line[:200]!r}")
        if cells[0] == name:
            found.append(cells)
    if not found:
        return None
    _, state, gres, used, _, cpus, reason = found[0]
    base, *flags = state.split("+")
    try:
        count = int(cpus)
    except ValueError:
        raise SlurmError(f"sinfo -n {name}: CPUs {cpus!r} is no number") from None
    return SlurmNode(
        name=name,
        state=base.rstrip("*~#!%$@^-").lower(),
        flags=frozenset(f.upper() for f in flags if f),
        reason="" if reason == "none" else reason,
        gres=_gres(gres, name, "gres"),
        gres_used=_gres(used, name, "gres_used"),
        partitions=tuple(dict.fromkeys(c[4].rstrip("*") for c in found)),
        cpus=count,
    )


def _gres(text: str, name: str, key: str) -> tuple[GresCount, ...]:
    return () if text in ("", "(null)") else parse_gres(text, where=f"node {name} {key}")
