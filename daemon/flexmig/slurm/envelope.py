"""The envelope every Slurm 22.05 ``--json`` answer shares: ``meta``, ``errors`` and the records, checked once.

Verified on 22.05.8: ``squeue --json`` exits 0 with an empty ``jobs`` list and one entry in ``errors``
("slurm_load_jobs: Unspecified error") when slurmctld cannot be reached, so an answer is only trusted when
``errors`` is empty; an empty list is not proof that nothing is queued. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flexmig.errors import SlurmError

__all__ = ["decode", "field", "records"]

_MAX_BYTES = 64 * 1024 * 1024


def decode(text: str | bytes, command: str) -> dict[str, Any]:
    """The JSON object ``command`` printed; SlurmError if it is not one, or if Slurm reported errors in it."""
    if len(text) > _MAX_BYTES:
        raise SlurmError(f"{command}: answer larger than {_MAX_BYTES // (1024 * 1024)} MiB; refused")
    try:
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        head = text[:60].decode("utf-8", "replace") if isinstance(text, bytes) else text[:60]
        why = f"{exc.msg} at offset {exc.pos}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise SlurmError(f"{command}: answer is not JSON ({why}): {head!r}") from None
    if not isinstance(doc, dict):
        raise SlurmError(f"{command}: answer is a JSON {type(doc).__name__}, not an object")
    errors = doc.get("errors", [])
    if not isinstance(errors, list):
        raise SlurmError(f"{command}: 'errors' is not a list")
    if errors:
        first = errors[0]
        what = first
        if isinstance(first, Mapping):
            parts = [str(first.get(k)) for k in ("source", "description", "error") if first.get(k)]
            what = ": ".join(parts) or first
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SlurmError(f"{command}: Slurm reported an error: {what}{more}")
    return doc


def records(doc: Mapping[str, Any], key: str, command: str) -> list[dict[str, Any]]:
    """The list of objects under ``key``; SlurmError when it is missing or holds something else."""
    items = doc.get(key)
    if not isinstance(items, list):
        raise SlurmError(f"{command}: answer has no '{key}' list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise SlurmError(f"{command}: {key}[{i}] is a JSON {type(item).__name__}, not an object")
    return items


def field(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, *, default: Any = ...) -> Any:
    """``record[key]`` if it has type ``kind`` (None allowed when ``default`` is given and is None);
    SlurmError naming ``where`` and the key otherwise. A missing key is an error unless ``default`` is given."""
    if key not in record:
        if default is ...:
            raise SlurmError(f"{where}: no '{key}'")
        return default
    value = record[key]
    if value is None and default is not ...:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SlurmError(f"{where}: '{key}' is a boolean, expected a number")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SlurmError(f"{where}: '{key}' is {value!r}, expected {names}")
    return value
