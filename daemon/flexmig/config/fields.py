"""The schema's field helper: a dataclass field that carries its documentation, range and reload rule.

One helper for every table of :mod:`flexmig.config.schema` and :mod:`flexmig.config.schema_slurm`, so validation
(:mod:`flexmig.config.checks`) and the example file (:mod:`flexmig.config.render`) read one kind of metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field
from typing import Any

__all__ = ["doc_field"]


def doc_field(
    default: Any = MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    gt: float | None = None,
    pattern: str | None = None,
    allowed: str | None = None,
    example: str | None = None,
    toml: str | None = None,
    octal: bool = False,
    restart: bool = False,
    to: str | tuple[str, ...] | None = None,
) -> Any:
    """A dataclass field with the schema metadata that validation and the example file use.

    ``lo``/``hi`` are inclusive bounds, ``gt`` an exclusive lower bound, ``pattern`` a regex a string must match
    in full (``allowed`` says in words what it allows, for error messages), ``example`` the value shown
    (commented out) for optional keys, ``toml`` the key's name in the file when it is not a Python identifier,
    ``octal`` prints the default as ``0o600``, and ``restart`` marks keys that a reload cannot apply (the daemon
    must be restarted; on a table's field of :class:`Config`, every key of that table). The flag is the only rule
    for what a reload changes: each component applies the other keys at once, and a reload names the restart keys
    that changed (``tests/daemon/test_reload_keys.py`` holds every key to its flag). ``to`` names the field (dotted
    into nested settings; several for a key that sets several) of the component's settings object that the key
    sets, when it is not the field of the key's own name; ``()``: the key sets none
    (:func:`flexmig.config.settings.build_settings`).
    """
    meta = {
        "doc": doc,
        "lo": lo,
        "hi": hi,
        "gt": gt,
        "pattern": pattern,
        "allowed": allowed,
        "example": example,
        "toml": toml,
        "octal": octal,
        "restart": restart,
        "to": to,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)
