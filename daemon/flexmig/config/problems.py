"""What a refused configuration file reports: one :class:`ConfigProblem` per fault, all of them in one error.

Operators read these lines in a journal, far from the code, so each names the file, the dotted key and the
line, and shows the offending value short and printable (:func:`show`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from flexmig.errors import ConfigError

__all__ = ["ConfigFileError", "ConfigProblem", "in_file_order", "show", "type_name"]


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong in a configuration file: where (file, dotted key, line) and what."""

    file: str
    key: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ConfigFileError(ConfigError):
    """A configuration file was refused; ``problems`` lists every problem found, one line each in the message."""

    def __init__(self, problems: Collection[ConfigProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def in_file_order(problems: Iterable[ConfigProblem]) -> list[ConfigProblem]:
    """Problems sorted by line, those without a line last (the order an operator fixes them in)."""
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0))


def show(value: object, limit: int = 40) -> str:
    """A short, printable rendering of a user value for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_name(value: object) -> str:
    """What a parsed TOML value is, for "expected X, got Y" messages (``a float``, ``a table``)."""
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)
