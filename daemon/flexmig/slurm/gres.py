"""Slurm's GRES strings as typed values: ``gres:gpu:1g.18gb:2``, ``gpu:3g.71gb:1(S:0)``, ``gpu:1g.18gb:2(IDX:1)``.

Slurm 22.05 prints GRES in a few shapes, all read by :func:`parse_gres` (23.02 and later print a job's requests in
the TRES form, ``gres/gpu:1g.18gb:2`` and, per task, ``gres/gpu:1g.18gb=1``: read too):

* a job's request (``tres_per_node``, ``tres_per_job``, ``tres_per_task`` in ``squeue --json``):
  ``gres:gpu:1g.18gb:2,gres:gpu:2g.35gb:1``; an untyped request is ``gres:gpu:2``;
* a node's configuration (``gres`` in ``sinfo --json``): ``gpu:3g.71gb:1,gpu:1g.18gb:2``, possibly with a socket
  binding ``(S:0-1)``;
* what is allocated (``gres_used`` of a node, ``gres_detail`` of a job): ``gpu:1g.18gb:2(IDX:1-2)``, with
  ``(IDX:N/A)`` when none is.

The last colon-separated field is the count when it is a number (``K``/``M``/``G`` suffixes allowed, for
count-only GRES); otherwise the count is 1. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flexmig.errors import SlurmError

__all__ = ["GresCount", "parse_gres", "parse_index_list", "split_top_level"]

_COUNT = re.compile(r"^(\d+)([KMGTP]?)$")
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_NAME = re.compile(r"^[A-Za-z0-9_.+\-]+$")
_EMPTY = ("", "(null)", "N/A", "none")


@dataclass(frozen=True, slots=True, order=True)
class GresCount:
    """``count`` generic resources called ``name`` of type ``type`` (None: any type), at GRES ``indices`` if known."""

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...] = ()

    def spec(self) -> str:
        """``gpu:1g.18gb:2``: the form ``--gres`` and ``slurmd --conf Gres=`` take."""
        return f"{self.name}:{self.type}:{self.count}" if self.type else f"{self.name}:{self.count}"


def split_top_level(text: str) -> list[str]:
    """Split ``text`` at the commas that are not inside parentheses (``gpu:a:2(IDX:1,3),gpu:b:1``)."""
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def parse_index_list(text: str, *, where: str = "GRES index list") -> tuple[int, ...]:
    """``0-2,5`` -> ``(0, 1, 2, 5)``; ``N/A`` or empty -> ``()``. SlurmError names ``where`` for anything else."""
    text = text.strip()
    if text in _EMPTY:
        return ()
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmError(f"{where}: {text!r} is not an index list like 0-2,5")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last - first > 4096:
            raise SlurmError(f"{where}: bad index range {part.strip()!r} in {text!r}")
        out.extend(range(first, last + 1))
    return tuple(out)


def _item(raw: str, where: str) -> GresCount:
    body, _, tail = raw.partition("(")
    indices: tuple[int, ...] = ()
    if tail:
        if not tail.endswith(")"):
            raise SlurmError(f"{where}: unbalanced parenthesis in {raw!r}")
        for attr in tail[:-1].split(")("):
            key, _, value = attr.partition(":")
            if key == "IDX":
                indices = parse_index_list(value, where=where)
            # S: (socket binding) and other attributes say nothing flexmig needs
    parts = body.strip().split(":")
    if parts[0] == "gres":  # a job's request: gres:gpu:...
        parts = parts[1:]
    elif parts[0].startswith("gres/"):  # the TRES form: gres/gpu:...
        parts[0] = parts[0].removeprefix("gres/")
    if "=" in parts[-1]:  # the TRES count form of Slurm 23.02 and later: gres/gpu:1g.18gb=1, gres/gpu=2
        head, _, number = parts[-1].rpartition("=")
        parts = [*parts[:-1], *([head] if head else []), number]
    if not parts or not parts[0]:
        raise SlurmError(f"{where}: empty GRES name in {raw!r}")
    count = 1
    m = _COUNT.match(parts[-1]) if len(parts) > 1 else None
    if m:
        count = int(m.group(1)) * _SUFFIX[m.group(2)]
        parts = parts[:-1]
    if len(parts) > 2:
        raise SlurmError(f"{where}: {raw!r} is not NAME[:TYPE][:COUNT]")
    name = parts[0]
    gtype = parts[1] if len(parts) == 2 else None
    for token in (name, gtype):
        if token is not None and not _NAME.match(token):
            raise SlurmError(f"{where}: {token!r} in {raw!r} is not a GRES name or type")
    return GresCount(name, gtype, count, indices)


def parse_gres(text: str | None, *, where: str = "GRES") -> tuple[GresCount, ...]:
    """Every item of a GRES string; ``()`` for an empty one. SlurmError (naming ``where``) for a malformed one."""
    if text is None:
        return ()
    if not isinstance(text, str):
        raise SlurmError(f"{where}: expected a GRES string, got {type(text).__name__}")
    text = text.strip()
    if text in _EMPTY:
        return ()
    return tuple(_item(raw, where) for raw in split_top_level(text))
