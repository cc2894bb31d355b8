"""What Slurm must be told about the node's MIG instances: gres.conf lines, the ``Gres=`` string, and the map the
TaskProlog reads.

One :class:`GresRecord` per MIG device (a GPU instance with its compute instance): GRES ``Type`` is the profile name
as NVML gives it (``3g.71gb``), ``MultipleFiles`` the parent GPU's device and the two capability devices.

Order matters, and was verified on Slurm 22.05.8: slurmd numbers a node's GPU GRES (the index a job sees in
``SLURM_JOB_GPUS`` and ``CUDA_VISIBLE_DEVICES``) by grouping gres.conf records by type in the order the types
appear in the ``Gres=`` string it registers with, then in gres.conf order within a type. So :func:`gres_records`
orders records by type (in order of first appearance across GPUs and starts) and then by (GPU, start), and
:func:`gres_string` lists the types in that same order: record ``i`` is GRES index ``i``.

flexmig owns one marked block of gres.conf for its node (:func:`merge_block`) and leaves every other line alone, so
a site's shared gres.conf keeps its own records for other nodes and other GRES. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from flexmig.errors import SlurmError
from flexmig.mig.catalogue import model_by_name
from flexmig.nvml.types import Inventory
from flexmig.slurm.hostlist import expand_hostlist
from flexmig.slurm.minors import MigMinors

__all__ = [
    "MAP_VERSION",
    "GresRecord",
    "block_markers",
    "check_node_name",
    "configures_gpus_of",
    "drop_block",
    "gres_map",
    "gres_records",
    "gres_string",
    "merge_block",
    "parse_gres_map",
    "render_lines",
]

MAP_VERSION = 1
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")


@dataclass(frozen=True, slots=True, order=True)
class GresRecord:
    """One MIG device as Slurm's gres.conf names it."""

    type: str
    gpu: int
    start: int
    uuid: str
    files: tuple[str, ...]

    def line(self, node: str) -> str:
        """``NodeName=n1 Name=gpu Type=3g.71gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,...``."""
        return f"NodeName={node} Name=gpu Type={self.type} MultipleFiles={','.join(self.files)}"


def check_node_name(node: str) -> str:
    """``node`` if it is a name Slurm and a gres.conf line accept; SlurmError otherwise."""
    if not _NODE.match(node):
        raise SlurmError(f"node name {node!r} is not a Slurm node name (letters, digits, '_', '-', '.')")
    return node


def gres_records(inv: Inventory, minors: MigMinors, dev_dir: str = "/dev") -> tuple[GresRecord, ...]:
    """The node's MIG devices as gres records, in GRES index order (see the module docstring).

    GPU instances without a compute instance (no MIG device) are left out: nothing can run on them. The parent
    device is ``DEV_DIR/nvidiaG`` with ``G`` the GPU's index, which equals its device minor on the usual node.
    """
    dev = PurePosixPath(dev_dir)
    found: list[tuple[int, int, str, str, tuple[str, ...]]] = []
    for g in inv.gpus:
        model = model_by_name(g.name) if g.name else None
        for gi in g.gpu_instances:
            mig = next((d for d in g.mig_devices if d.gpu_instance_id == gi.id), None)
            if mig is None:
                continue
            name = gi.profile_name
            if name is None and model is not None:
                name = model.profile_name(gi.profile_id)
            if name is None:
                raise SlurmError(f"GPU {g.index} GPU instance {gi.id}: NVML gives no profile name to register")
            gi_minor, ci_minor = minors.of(g.index, gi.id, mig.compute_instance_id)
            files = (
                str(dev / f"nvidia{g.index}"),
                str(dev / "nvidia-caps" / f"nvidia-cap{gi_minor}"),
                str(dev / "nvidia-caps" / f"nvidia-cap{ci_minor}"),
            )
            found.append((g.index, gi.start, name, mig.uuid, files))
    found.sort()
    order: dict[str, int] = {}
    for _, _, name, _, _ in found:
        order.setdefault(name, len(order))
    ranked = sorted(found, key=lambda f: (order[f[2]], f[0], f[1]))
    return tuple(GresRecord(name, gpu, start, uuid, files) for gpu, start, name, uuid, files in ranked)


def gres_string(records: Sequence[GresRecord]) -> str:
    """``gpu:3g.71gb:1,gpu:1g.18gb:2``: the counts per type, in record order (what ``slurmd --conf Gres=`` takes).

    No instance at all registers ``gpu:0``: the node then advertises no GPU, and its jobs pend for the FUTURE node.
    """
    counts: dict[str, int] = {}
    for r in records:
        counts[r.type] = counts.get(r.type, 0) + 1
    return ",".join(f"gpu:{t}:{n}" for t, n in counts.items()) or "gpu:0"


def block_markers(node: str) -> tuple[str, str]:
    """The first and last line of flexmig's block for ``node`` in gres.conf."""
    return (
        f"# BEGIN flexmig node={node}: written by flexmigd from the node's MIG instances; edits here are replaced",
        f"# END flexmig node={node}",
    )


def render_lines(node: str, records: Iterable[GresRecord]) -> list[str]:
    """flexmig's block for ``node``: the markers around one line per record."""
    begin, end = block_markers(check_node_name(node))
    return [begin, *(r.line(node) for r in records), end]


def merge_block(existing: str, node: str, records: Iterable[GresRecord], source: str = "gres.conf") -> str:
    """``existing`` gres.conf text with flexmig's block for ``node`` replaced (or appended), nothing else changed.

    SlurmError (naming ``source`` and the line) when a line outside the block already configures GPUs for ``node``:
    Slurm would add them to flexmig's and the indices would no longer match the instances.
    """
    begin, end = block_markers(check_node_name(node))
    lines = existing.splitlines()
    out: list[str] = []
    inside = False
    placed = False
    block = render_lines(node, records)
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped == begin:
            if placed:
                raise SlurmError(f"{source}:{number}: a second flexmig block for node {node}")
            inside, placed = True, True
            out.extend(block)
            continue
        if inside:
            if stripped == end:
                inside = False
            continue
        if configures_gpus_of(stripped, node):
            raise SlurmError(
                f"{source}:{number}: {stripped[:80]!r} configures GPUs of node {node} outside flexmig's block; "
                "remove it (flexmig writes this node's GPU lines)"
            )
        out.append(line)
    if inside:
        raise SlurmError(f"{source}: flexmig's block for node {node} has no end line {end!r}")
    if not placed:
        if out and out[-1].strip():
            out.append("")
        out.extend(block)
    return "\n".join(out) + "\n"


def drop_block(existing: str, node: str, source: str = "gres.conf") -> str:
    """``existing`` gres.conf text without flexmig's block for ``node`` (a node flexmig deleted for good), nothing
    else changed; the same SlurmError as :func:`merge_block`."""
    begin, end = block_markers(check_node_name(node))
    lines = merge_block(existing, node, (), source).splitlines()
    out = [line for line in lines if line.strip() not in (begin, end)]
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n" if out else ""


def configures_gpus_of(line: str, node: str) -> bool:
    """True when gres.conf ``line`` configures GPUs (or AutoDetect) for ``node``."""
    if not line or line.startswith("#"):
        return False
    words = {k.lower(): v for k, v in (w.split("=", 1) for w in line.split() if "=" in w)}
    autodetect = words.get("autodetect", "off").lower() not in ("off", "")
    if words.get("name", "").lower() != "gpu" and not autodetect:
        return False
    names = words.get("nodename")
    if names is None:
        return True  # a line without NodeName applies to every node reading the file
    try:
        return node in expand_hostlist(names)
    except SlurmError:
        return False


def gres_map(node: str, records: Sequence[GresRecord], hook: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document the TaskProlog reads: each GRES index's MIG UUID, plus the hook settings."""
    return {
        "version": MAP_VERSION,
        "node": node,
        "devices": [
            {"index": i, "type": r.type, "gpu": r.gpu, "start": r.start, "uuid": r.uuid, "files": list(r.files)}
            for i, r in enumerate(records)
        ],
        "hook": dict(hook or {}),
    }


def parse_gres_map(text: str, source: str) -> dict[str, Any]:
    """Read a map written by :func:`gres_map`; SlurmError names ``source`` for anything else."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"{source}: not JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("version") != MAP_VERSION or not isinstance(doc.get("devices"), list):
        raise SlurmError(f"{source}: not a flexmig GRES map of version {MAP_VERSION}")
    return doc
