"""A component's settings object, built from the schema: no key is mirrored by hand in a mapper.

A component that runs on settings of its own (the planner's :class:`~flexmig.plan.types.PlannerSettings`, detection's
:class:`~flexmig.detect.DetectSettings`: frozen dataclasses of the pure layers, which cannot import the
configuration) gets them from its table with :func:`build_settings`. Each key of the table sets the settings field
of its own name, or the field(s) its schema entry names with ``to`` (dotted into nested settings, e.g.
``underuse.activity_enter``; ``to=()``: a key of the table that is no setting of this object); a nested table
gives its ``setting()``. A key that names no field is a bug of the schema, and raises TypeError at the first build
(``make check`` builds each from the defaults), so a new key cannot be forgotten on its way to its component.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar, cast

__all__ = ["build_settings", "setting_targets"]

_S = TypeVar("_S")


def setting_targets(table: object) -> dict[str, tuple[str, ...]]:
    """Each key of ``table`` (a configuration table, a frozen dataclass) -> the settings fields it sets."""
    out: dict[str, tuple[str, ...]] = {}
    for f in fields(cast(Any, table)):
        to = f.metadata.get("to")
        out[f.name] = (f.name,) if to is None else (to,) if isinstance(to, str) else tuple(to)
    return out


def build_settings(kind: type[_S], table: object) -> _S:
    """The ``kind`` settings (a frozen dataclass, nested ones allowed) that ``table``'s values give; fields no key
    sets keep ``kind``'s defaults. TypeError names a key whose target ``kind`` lacks."""
    values: dict[str, Any] = {}
    for key, targets in setting_targets(table).items():
        value = getattr(table, key)
        if is_dataclass(value) and hasattr(value, "setting"):
            value = value.setting()
        for target in targets:
            values[target] = value
    return cast(_S, _build(kind, values, type(table).__name__))


def _build(kind: type[Any], values: dict[str, Any], where: str) -> Any:
    """``kind()`` with ``values`` (dotted names) in place."""
    names = {f.name: f for f in fields(kind)}
    flat = {k: v for k, v in values.items() if "." not in k}
    nested: dict[str, dict[str, Any]] = {}
    for k, v in values.items():
        if "." in k:
            head, _, rest = k.partition(".")
            nested.setdefault(head, {})[rest] = v
    unknown = sorted((flat.keys() | nested.keys()) - names.keys())
    if unknown:
        raise TypeError(f"{where}: {', '.join(unknown)} is no field of {kind.__name__} (set to= in the schema)")
    made = kind()
    inner = {head: _build(type(getattr(made, head)), sub, where) for head, sub in nested.items()}
    return replace(made, **flat, **inner)
