"""Slurm hostlist expressions (``tb[1-3,5]``, ``rack[1-2]-n[01-02]``) expanded to node names, as ``scontrol show
hostnames`` does. Pure."""

from __future__ import annotations

import itertools
import re

from flexmig.errors import SlurmError

__all__ = ["expand_hostlist"]

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_MAX_NODES = 65536


def _split(text: str) -> list[str]:
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if depth < 0:
            raise SlurmError(f"hostlist {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmError(f"hostlist {text!r}: unbalanced '['")
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def _range(body: str, text: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmError(f"hostlist {text!r}: bad range {part!r}")
        width = len(lo)
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last - first >= _MAX_NODES:
            raise SlurmError(f"hostlist {text!r}: bad range {part!r}")
        out.extend(str(n).zfill(width) for n in range(first, last + 1))
    return out


def expand_hostlist(text: str) -> tuple[str, ...]:
    """The node names of ``text`` in order; ``()`` for an empty one. SlurmError for a malformed expression."""
    names: list[str] = []
    for piece in _split(text.strip()):
        fixed = _GROUP.split(piece)  # alternating: literal, group body, literal, ...
        literals, groups = fixed[0::2], [_range(body, text) for body in fixed[1::2]]
        if any("[" in lit or "]" in lit for lit in literals):
            raise SlurmError(f"hostlist {text!r}: nested or stray brackets in {piece!r}")
        for combo in itertools.product(*groups):
            parts = [literals[0]]
            for value, lit in zip(combo, literals[1:], strict=True):
                parts += [value, lit]
            names.append("".join(parts))
            if len(names) > _MAX_NODES:
                raise SlurmError(f"hostlist {text!r}: more than {_MAX_NODES} names")
    return tuple(names)
