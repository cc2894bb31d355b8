"""Where keys sit in TOML text, and how keys are written: tomllib gives values, never positions.

A refused file must name the line of each bad key, so :func:`find_key_line` finds where a dotted key is set:
under a table header, as a dotted or quoted key, inside an inline table, never inside a multi-line string.
The same key grammar quotes names for messages and the example file (:func:`join_key`, :func:`toml_string`).
"""

from __future__ import annotations

import re

__all__ = ["find_key_line", "join_key", "no_index", "parse_key", "split_dotted", "toml_string"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def parse_key(s: str, pos: int) -> tuple[list[str], int] | None:
    """Parse a (dotted) TOML key at ``s[pos:]``; returns its parts and the position after it, or None."""
    parts: list[str] = []
    n = len(s)
    while True:
        while pos < n and s[pos] in " \t":
            pos += 1
        if pos >= n:
            return None
        ch = s[pos]
        if ch == '"':
            end = pos + 1
            buf: list[str] = []
            while end < n and s[end] != '"':
                if s[end] == "\\" and end + 1 < n:
                    esc = s[end + 1]
                    width = {"u": 4, "U": 8}.get(esc, 0)
                    if width:
                        digits = s[end + 2 : end + 2 + width]
                        try:
                            buf.append(chr(int(digits, 16)))
                        except ValueError:
                            return None
                        end += 2 + width
                        continue
                    buf.append(_ESCAPES.get(esc, esc))
                    end += 2
                    continue
                buf.append(s[end])
                end += 1
            if end >= n:
                return None
            parts.append("".join(buf))
            pos = end + 1
        elif ch == "'":
            end = s.find("'", pos + 1)
            if end < 0:
                return None
            parts.append(s[pos + 1 : end])
            pos = end + 1
        else:
            m = _BARE_KEY.match(s, pos)
            if not m:
                return None
            parts.append(m.group())
            pos = m.end()
        while pos < n and s[pos] in " \t":
            pos += 1
        if pos < n and s[pos] == ".":
            pos += 1
            continue
        return parts, pos


def find_key_line(text: str, dotted: str, *, exact: bool = False) -> int | None:
    """The 1-based line where the dotted key (``mqtt.broker``) is set in TOML ``text``.

    Understands table headers (``[mqtt]``, ``[detect.demand_mix]``), dotted and quoted keys, and skips the
    inside of multi-line strings. When the key itself is not in the text (a missing or inline-table value), it
    returns the line of the nearest enclosing table: its header, or the first key set inside it (a sibling, an
    inline table); None when nothing matches, or with ``exact`` when the key itself is not there.
    """
    want = split_dotted(dotted)
    current: tuple[str, ...] = ()
    headers: dict[tuple[str, ...], int] = {}
    prefix_hits: dict[tuple[str, ...], int] = {}
    in_string: str | None = None
    # Split on "\n" only, as TOML (and tomllib's line numbers) do; str.splitlines() also splits on \x0c, \u2028...
    for lineno, raw in enumerate(text.split("\n"), 1):
        if in_string is not None:
            if raw.count(in_string) % 2 == 1:
                in_string = None
            continue
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            inner = 2 if line.startswith("[[") else 1
            parsed = parse_key(line, inner)
            if parsed is None:
                continue
            current = tuple(parsed[0])
            for i in range(1, len(current) + 1):
                headers.setdefault(current[:i], lineno)
            if current == want:
                return lineno
            continue
        parsed = parse_key(line, 0)
        if parsed is None:
            continue
        keys, pos = parsed
        if pos >= len(line) or line[pos] != "=":
            continue
        full = current + tuple(keys)
        if full == want:
            return lineno
        for i in range(1, len(full) + 1):
            prefix_hits.setdefault(full[:i], lineno)
        rest = line[pos + 1 :].lstrip()
        for delim in ('"""', "'''"):
            if rest.startswith(delim) and rest.count(delim) % 2 == 1:
                in_string = delim
                break
    if exact:
        return None
    for i in range(len(want), 0, -1):
        for table in (headers, prefix_hits):
            if want[:i] in table:
                return table[want[:i]]
    return None


def no_index(key: str) -> str:
    """``jobs.allowed_dirs[1]`` -> ``jobs.allowed_dirs``."""
    return re.sub(r"(\[\d+\])+$", "", key)


def split_dotted(dotted: str) -> tuple[str, ...]:
    """The parts of a dotted key as TOML reads it (``'a."b.c"'`` -> ``("a", "b.c")``)."""
    parsed = parse_key(dotted, 0)
    return tuple(parsed[0]) if parsed is not None else tuple(dotted.split("."))


def join_key(prefix: str, name: str) -> str:
    """``prefix.name`` with ``name`` quoted when it is not a bare key (``detect.demand_mix."1 g"``)."""
    part = name if _BARE_KEY.fullmatch(name) else toml_string(name)
    return f"{prefix}.{part}" if prefix else part


def toml_string(text: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters as \\uXXXX."""
    escaped = "".join(
        {'"': '\\"', "\\": "\\\\"}.get(ch, ch) if 0x20 <= ord(ch) != 0x7F else f"\\u{ord(ch):04x}" for ch in text
    )
    return f'"{escaped}"'
