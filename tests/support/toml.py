"""Render Python values as TOML text, for the fuzz tests that write hostile configuration and job-spec files.

Strings go through JSON escaping (a TOML basic string accepts it), except DEL, which TOML wants escaped;
NaN and infinities are written as TOML spells them, so the loaders' own refusals are what the tests exercise.
"""

from __future__ import annotations

import json
import math
from typing import Any


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (also a quoted key)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """A bool, number, string, list or table as an inline TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
