"""Text tables for people that fit the terminal: nothing dropped, nothing cut, at 80 columns too.

rich's tables shrink columns and cut cells with an ellipsis when the terminal is narrow, and a MIG device UUID is
40 characters. Here every column but one is as wide as its widest cell; the last column takes the room left and
wraps; long identifiers go on a line of their own under their row (:attr:`Row.details`), indented. Where even the
fixed columns do not fit, each row is printed as ``header: value`` lines instead. Without a width (output to a
pipe or a file, no ``$COLUMNS``) nothing wraps, so each row stays one line for ``grep``.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

__all__ = ["Row", "output_width", "render_rows", "wrap"]

_GAP = "  "
_MIN_LAST = 12


@dataclass(frozen=True, slots=True)
class Row:
    """One row: its cells, one per column, and whole lines shown under it (a UUID, findings, an error)."""

    cells: Sequence[str]
    details: Sequence[str] = field(default_factory=tuple)


def output_width(stream: IO[str] | None = None) -> int | None:
    """The width to fit: the terminal's, else ``$COLUMNS``, else None (no wrapping)."""
    out = sys.stdout if stream is None else stream
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if out.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def wrap(text: str, width: int | None, indent: str = "", more: str = "  ") -> list[str]:
    """``text`` as lines of at most ``width`` (``indent`` before the first, ``indent + more`` before the rest)."""
    if width is None:
        return [indent + text]
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent + more,
        break_on_hyphens=False,
    ) or [indent]


def render_rows(headers: Sequence[str], rows: Sequence[Row], width: int | None, indent: str = "  ") -> list[str]:
    """The lines of a table with ``headers`` (the last column wraps) and its ``rows``, at most ``width`` wide."""
    table = _table(headers, rows, width, indent)
    if table is None:
        return _first_above(headers, rows, width or 0, indent)
    head, per_row = table
    return [head, *(line for lines in per_row for line in lines)]


def _table(
    headers: Sequence[str], rows: Sequence[Row], width: int | None, indent: str
) -> tuple[str, list[list[str]]] | None:
    """(header line, each row's lines), or None when the fixed columns leave the last one too little room."""
    n = len(headers)
    widths = [max([len(headers[i]), *(len(r.cells[i]) for r in rows)]) for i in range(n)]
    fixed = sum(widths[:-1]) + len(_GAP) * (n - 1) + len(indent)
    last = widths[-1]
    if width is not None:
        if width - fixed < _MIN_LAST:
            return None
        last = min(last, width - fixed)
    detail_indent = indent + " " * (widths[0] + len(_GAP))
    per_row = []
    for r in rows:
        chunks = textwrap.wrap(r.cells[-1], last, break_on_hyphens=False) if width is not None else [r.cells[-1]]
        chunks = chunks or [""]
        lines = [_join([*r.cells[:-1], chunks[0]], widths, indent).rstrip()]
        lines += [" " * fixed + c for c in chunks[1:]]
        for d in r.details:
            lines += wrap(d, width, detail_indent)
        per_row.append(lines)
    return _join(headers, widths, indent).rstrip(), per_row


def _join(cells: Sequence[str], widths: Sequence[int], indent: str) -> str:
    return indent + _GAP.join(c.ljust(w) for c, w in zip(cells, widths, strict=True))


def _first_above(headers: Sequence[str], rows: Sequence[Row], width: int, indent: str) -> list[str]:
    """The first column (a long name) on a line of its own above the rest of its row, which is a table again;
    each row as ``header: value`` lines where even that is too wide."""
    inner = indent + "  "
    table = _table(headers[1:], [Row(r.cells[1:], r.details) for r in rows], width, inner) if len(headers) > 2 else None
    if table is None:
        return _stacked(headers, rows, width, indent)
    head, per_row = table
    lines = [f"{indent}{headers[0]}", head]
    for r, rest in zip(rows, per_row, strict=True):
        lines += wrap(r.cells[0], width, indent)
        lines += rest
    return lines


def _stacked(headers: Sequence[str], rows: Sequence[Row], width: int, indent: str) -> list[str]:
    """Each row as ``header: value`` lines, for a table whose fixed columns alone are wider than ``width``."""
    lines: list[str] = []
    for r in rows:
        first = True
        for h, c in zip(headers, r.cells, strict=True):
            lines += wrap(f"{h}: {c}", width, indent if first else indent + "  ")
            first = False
        for d in r.details:
            lines += wrap(d, width, indent + "  ")
    return lines
