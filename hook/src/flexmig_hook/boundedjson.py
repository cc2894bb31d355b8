"""JSON that someone else wrote, decoded within explicit bounds: size, nesting depth, integer size, finite numbers.

Python's :func:`json.loads` has none of these. An integer of more than 4,300 digits raises ``ValueError``
(CPython's limit on converting a string to an int, CVE-2020-10735), an array nested a thousand deep raises
``RecursionError``, ``NaN`` and ``Infinity`` are accepted, ``1e999`` becomes ``inf``, and a document of any size is
read. A reader that catches only ``JSONDecodeError`` therefore dies on input a local user can write, and a daemon
that dies on a file it reads again at every start never comes back. Every reader of such input (the daemon reading
a job's acknowledgement, a control request, an MQTT command, a row of its journal) goes through :func:`loads`,
which raises :class:`JsonBoundsError` alone, one line naming the bound that was passed.

Standard library only: the checkpoint hook (a training script's import) reads acknowledgements with it too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "JsonBoundsError", "depth", "loads"]

#: Objects and arrays nest at most this deep by default (the outermost one is level 1).
MAX_DEPTH = 32
#: Digits an integer may have by default: 2**64 has 20; nothing flexmig reads needs more.
MAX_INT_DIGITS = 20


class JsonBoundsError(ValueError):
    """The document is not JSON, or passes one of the bounds; the message says which (and never holds the input
    beyond a short excerpt)."""


def _reject_constant(name: str) -> Any:
    raise JsonBoundsError(f"{name} is not a number JSON allows")


def loads(
    data: bytes | str,
    *,
    max_bytes: int,
    max_depth: int = MAX_DEPTH,
    max_int_digits: int = MAX_INT_DIGITS,
    no_duplicates: bool = False,
) -> Any:
    """Decode ``data`` (UTF-8 bytes or text) if it is at most ``max_bytes`` long, nests objects and arrays at most
    ``max_depth`` deep, and holds no integer of more than ``max_int_digits`` digits, no float that is not finite,
    and (with ``no_duplicates``) no object with a key twice. Anything else raises :class:`JsonBoundsError`."""
    text = _text(data, max_bytes)
    try:
        doc = json.loads(
            text,
            parse_int=_int_parser(max_int_digits),
            parse_float=_finite,
            parse_constant=_reject_constant,
            object_pairs_hook=_unique if no_duplicates else None,
        )
    except JsonBoundsError:
        raise
    except json.JSONDecodeError as exc:
        raise JsonBoundsError(f"not JSON: {exc}") from None
    except RecursionError:  # deeper than the interpreter's own limit: far past any bound given here
        raise JsonBoundsError(f"nests deeper than {max_depth} levels") from None
    except (ValueError, OverflowError) as exc:  # the decoder's own limits, whatever they are in this Python
        raise JsonBoundsError(f"not JSON: {exc}") from None
    if depth(doc) > max_depth:
        raise JsonBoundsError(f"nests deeper than {max_depth} levels")
    return doc


def _text(data: bytes | str, max_bytes: int) -> str:
    if len(data) > max_bytes:
        raise JsonBoundsError(f"longer than {max_bytes} bytes")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonBoundsError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _int_parser(max_digits: int) -> Callable[[str], int]:
    def parse_int(digits: str) -> int:
        if len(digits.lstrip("-")) > max_digits:
            raise JsonBoundsError(f"an integer has more than {max_digits} digits")
        return int(digits)

    return parse_int


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JsonBoundsError(f"number {literal[:32]!r} is out of range")
    return value


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonBoundsError(f"key {key[:64]!r} appears twice in one object")
        out[key] = value
    return out


def depth(doc: Any) -> int:
    """How deep objects and arrays nest in decoded JSON (a scalar is 0); iterative, so any depth is safe to measure."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest
