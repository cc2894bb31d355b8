"""Where keys sit in TOML text, and how keys are written: tomllib gives values, never positions.

A refused file must name the line of each bad key, so :func:`find_key_line` finds where a dotted key is set:
under a table header, as a dotted or quoted key, inside an inline table, never inside a multi-line string.
The same key grammar quotes names for messages and the example file (:func:`join_key`, :func:`toml_string`).
"""

from __future__ import annotations

import bisect
import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

__all__ = [
    "KeyPositions",
    "find_key_line",
    "join_key",
    "key_positions",
    "no_index",
    "parse_key",
    "split_dotted",
    "toml_string",
]

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


Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KeyPositions:
    """Where a TOML text sets its keys: 1-based lines, first occurrence of each.

    ``exact``: every table header and every assigned key (inline tables' keys included), by its full dotted path.
    ``headers``: every prefix of every table header. ``assigned``: every prefix of every assigned key.
    """

    exact: Mapping[Key, int]
    headers: Mapping[Key, int]
    assigned: Mapping[Key, int]

    def line(self, want: Key, *, exact: bool = False) -> int | None:
        """The line of ``want``, else (unless ``exact``) that of its nearest enclosing table; None if none is set.

        The enclosing table's line is its header, or, for a table that has none (dotted keys, an inline table), the
        first key set inside it.
        """
        if want in self.exact:
            return self.exact[want]
        if exact:
            return None
        for i in range(len(want), 0, -1):
            for table in (self.headers, self.assigned):
                if want[:i] in table:
                    return table[want[:i]]
        return None


def find_key_line(text: str, dotted: str, *, exact: bool = False) -> int | None:
    """The 1-based line where the dotted key (``mqtt.broker``) is set in TOML ``text``.

    Understands table headers (``[mqtt]``, ``[detect.demand_mix]``, ``[[x]]``), dotted and quoted keys, inline
    tables, and never looks inside strings (a multi-line string may hold text that reads like a header or a key,
    in an array or an inline table too). When the key itself is not in the text (a missing value), it returns the
    line of the nearest enclosing table: its header, or the first key set inside it; None when nothing matches,
    or with ``exact`` when the key itself is not there.
    """
    return key_positions(text).line(split_dotted(dotted), exact=exact)


def key_positions(text: str) -> KeyPositions:
    """Every key and table header of ``text`` with its line (best effort on text that is not valid TOML)."""
    scan = _Scanner(text)
    with contextlib.suppress(RecursionError):  # arrays nested deeper than tomllib reads: keep what came before
        scan.document()
    return KeyPositions(MappingProxyType(scan.exact), MappingProxyType(scan.headers), MappingProxyType(scan.assigned))


class _Scanner:
    """One pass over TOML text that records key positions and steps over values (strings, arrays, tables).

    Lines are counted on newline characters only, as TOML (and tomllib's messages) count them:
    ``str.splitlines()`` would also split on form feeds and Unicode line separators. Every step advances, so any
    text ends the scan.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.newlines = [i for i, ch in enumerate(text) if ch == "\n"]
        self.exact: dict[Key, int] = {}
        self.headers: dict[Key, int] = {}
        self.assigned: dict[Key, int] = {}

    def line(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def eol(self, pos: int) -> int:
        end = self.text.find("\n", pos)
        return self.n if end < 0 else end

    def skip_blank(self, pos: int) -> int:
        while pos < self.n and self.text[pos] in " \t\r":
            pos += 1
        return pos

    def skip_space(self, pos: int) -> int:
        """Past blanks, newlines and comments (between the items of an array)."""
        while pos < self.n:
            ch = self.text[pos]
            if ch in " \t\r\n":
                pos += 1
            elif ch == "#":
                pos = self.eol(pos)
            else:
                break
        return pos

    def key_at(self, pos: int) -> tuple[Key, int] | None:
        end = self.eol(pos)
        parsed = parse_key(self.text[pos:end], 0)
        return None if parsed is None else (tuple(parsed[0]), pos + parsed[1])

    def assign(self, key: Key, line: int) -> None:
        self.exact.setdefault(key, line)
        for i in range(1, len(key) + 1):
            self.assigned.setdefault(key[:i], line)

    def document(self) -> None:
        pos, table = 0, cast(Key, ())
        text, n = self.text, self.n
        while pos < n:
            pos = self.skip_blank(pos)
            if pos >= n:
                break
            ch = text[pos]
            if ch == "\n":
                pos += 1
                continue
            if ch == "#":
                pos = self.eol(pos)
                continue
            if ch == "[":
                parsed = self.key_at(pos + (2 if text.startswith("[[", pos) else 1))
                if parsed is not None:
                    table = parsed[0]
                    line = self.line(pos)
                    self.exact.setdefault(table, line)
                    for i in range(1, len(table) + 1):
                        self.headers.setdefault(table[:i], line)
                pos = self.eol(pos)
                continue
            parsed = self.key_at(pos)
            if parsed is None or parsed[1] >= n or text[parsed[1]] != "=":
                pos = self.eol(pos)
                continue
            key, after = parsed
            self.assign(table + key, self.line(pos))
            pos = self.eol(self.value(after + 1, table + key))

    def value(self, pos: int, key: Key | None) -> int:
        """The position after the value at ``pos``; an inline table's keys are recorded under ``key``."""
        text, n = self.text, self.n
        pos = self.skip_blank(pos)
        if pos >= n:
            return n
        if text.startswith('"""', pos):
            return self.multi_line(pos, '"', escapes=True)
        if text.startswith("'''", pos):
            return self.multi_line(pos, "'", escapes=False)
        ch = text[pos]
        if ch in "\"'":
            return self.one_line(pos, ch, escapes=ch == '"')
        if ch == "[":
            return self.array(pos)
        if ch == "{":
            return self.inline_table(pos, key)
        while pos < n and text[pos] not in ",]}#\n":  # a number, date, boolean (or garbage)
            pos += 1
        return pos

    def multi_line(self, pos: int, quote: str, *, escapes: bool) -> int:
        text, n = self.text, self.n
        pos += 3
        while pos < n:
            ch = text[pos]
            if escapes and ch == "\\":
                pos += 2
            elif ch == quote and text.startswith(quote * 3, pos):
                end = pos + 3
                while end < n and end - pos < 5 and text[end] == quote:  # up to two quotes end the content
                    end += 1
                return end
            else:
                pos += 1
        return n

    def one_line(self, pos: int, quote: str, *, escapes: bool) -> int:
        text, n = self.text, self.n
        pos += 1
        while pos < n and text[pos] != "\n":
            ch = text[pos]
            if escapes and ch == "\\":
                pos += 2
                continue
            pos += 1
            if ch == quote:
                return pos
        return min(pos, n)

    def array(self, pos: int) -> int:
        pos += 1
        while pos < self.n:
            pos = self.skip_space(pos)
            if pos >= self.n:
                break
            ch = self.text[pos]
            if ch == "]":
                return pos + 1
            if ch == ",":
                pos += 1
                continue
            pos = max(self.value(pos, None), pos + 1)
        return self.n

    def inline_table(self, pos: int, key: Key | None) -> int:
        pos += 1
        while pos < self.n:
            pos = self.skip_space(pos)
            if pos >= self.n:
                break
            ch = self.text[pos]
            if ch == "}":
                return pos + 1
            if ch == ",":
                pos += 1
                continue
            parsed = self.key_at(pos)
            if parsed is None or parsed[1] >= self.n or self.text[parsed[1]] != "=":
                return self.eol(pos)
            inner, after = parsed
            full = None if key is None else key + inner
            if full is not None:
                self.assign(full, self.line(pos))
            pos = max(self.value(after + 1, full), after + 1)
        return self.n


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
