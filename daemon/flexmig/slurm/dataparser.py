"""Slurm 23.02 and later print ``--json`` through their data_parser plugin (``data_parser/v0.0.39`` and on), whose
records differ from 22.05's (OpenAPI ``v0.0.38``) in form, not in meaning; this module reads the newer form into the
older one, so that one parser per record serves both.

What changed, as printed by real daemons (Slurm 24.11.5 from Debian 13, ``data_parser/v0.0.42``, beside 22.05.8):

* numbers that may be unset or infinite are objects: ``{"set": true, "infinite": false, "number": 5}``; read as the
  number, ``None`` when unset or infinite (a time limit of ``UNLIMITED`` is then no limit, as before);
* a job's ``job_state`` and a node's ``state`` are lists: the base state first, then its flags
  (``["IDLE", "DRAIN", "DYNAMIC_NORM"]``); a node's flags are what 22.05 printed as ``state_flags``;
* a node's ``features``, ``active_features`` and ``partitions`` are lists of strings (comma-joined here);
* a job's GRES requests carry the TRES prefix (``gres/gpu:3g.71gb:1``), which :mod:`flexmig.slurm.gres` reads;
* ``sinfo --json`` groups nodes by partition and state and no longer lists them one by one: nodes come from
  ``scontrol --json show nodes`` (which 22.05 does not have).

Pure: dicts in, dicts out; a value of an unexpected shape is passed on untouched for the parser to refuse by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["is_data_parser", "job_record", "node_record"]

_NODE_LISTS = ("features", "active_features")


def is_data_parser(doc: Mapping[str, Any]) -> bool:
    """True when ``doc`` (a decoded ``--json`` answer) was printed by a data_parser plugin (Slurm 23.02 and on)."""
    meta = doc.get("meta")
    if not isinstance(meta, Mapping):
        return False
    plugin = meta.get("plugin")
    return isinstance(plugin, Mapping) and isinstance(plugin.get("data_parser"), str)


def _number(value: Any) -> Any:
    """The number of a ``{set, infinite, number}`` object (None when unset or infinite); anything else as it is."""
    if isinstance(value, Mapping) and "number" in value and "set" in value:
        if value.get("set") is not True or value.get("infinite") is True:
            return None
        return value.get("number")
    return value


def _numbers(rec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _number(v) for k, v in rec.items()}


def job_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A job of ``squeue --json`` (data_parser form) in the form of 22.05's."""
    out = _numbers(rec)
    state = out.get("job_state")
    if isinstance(state, list) and state and all(isinstance(s, str) for s in state):
        out["job_state"] = state[0]
    return out


def node_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A node of ``scontrol --json show nodes`` (data_parser form) in the form of 22.05's ``sinfo --json``."""
    out = _numbers(rec)
    state = out.get("state")
    if isinstance(state, list) and state and all(isinstance(s, str) for s in state):
        out["state"] = state[0]
        out["state_flags"] = list(state[1:])
    for key in _NODE_LISTS:
        value = out.get(key)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            out[key] = ",".join(value)
    return out
