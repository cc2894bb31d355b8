"""Where a job spec's check stands: its file and text (to name lines), and every problem found so far.

Checking goes on after a problem, so one :class:`~flexmig.errors.JobSpecError` names every problem of a spec.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TypeVar

from flexmig.config.keys import find_key_line
from flexmig.errors import JobSpecError

__all__ = ["SpecContext", "unknown_key"]

_T = TypeVar("_T")


class SpecContext:
    """Where we are while validating: the file (for messages), its text (to find lines), and the problems found so
    far: checking goes on after a problem, so one round names every problem of the spec."""

    def __init__(self, source: Path | None, text: str | None, label: str | None = None) -> None:
        self.source = source
        self.text = text
        self.problems: list[tuple[int | None, str]] = []
        self.meant: set[str] = set()
        """Keys that misspelt keys were probably meant to be: their absence is not reported again."""
        self.label = label

    def fail(self, key: str, why: str, *, at: str | None = None) -> JobSpecError:
        """The error for ``key``, with the line where ``at`` (default: ``key``; a dotted TOML key) is set."""
        where = self.label or (str(self.source) if self.source else "<job spec>")
        line = find_key_line(self.text, at or key) if self.text else None
        shown = f":{line}" if line else ""
        return _Problem(f"{where}{shown}: {key}: {why}", line)

    def missing(self, key: str) -> JobSpecError:
        """The error for a required ``key`` that is absent: told once, so not again where a misspelt key stood
        for it (:attr:`meant`)."""
        return _Told(key, "is required") if key in self.meant else self.fail(key, "is required")

    def told(self, key: str, why: str) -> JobSpecError:
        """An error for ``key`` that has already been reported in other words: it stops the key's check and is
        not reported again."""
        return _Told(key, why)

    def note(self, error: JobSpecError) -> None:
        """Record a problem and go on."""
        if not isinstance(error, _Told):
            self.problems.append((error.line if isinstance(error, _Problem) else None, str(error)))

    def attempt(self, check: Callable[[], _T], default: _T) -> _T:
        """``check()``, or ``default`` when it found a problem (recorded); the checks that build on a value that
        failed are skipped by their callers, so a fault is reported once, not again as the faults it causes."""
        try:
            return check()
        except JobSpecError as exc:
            self.note(exc)
            return default

    def raise_problems(self) -> None:
        """One JobSpecError listing every problem recorded, one line each, in the order of the file."""
        if self.problems:
            ordered = sorted(self.problems, key=lambda p: (p[0] is None, p[0] or 0))
            raise JobSpecError("\n".join(text for _, text in ordered))


class _Problem(JobSpecError):
    """One problem of a spec, with the line it is on (None where the key cannot be found)."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


class _Told(JobSpecError):
    """A problem already reported in other words (a required key that a misspelt key stood for)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")


def unknown_key(known: Collection[str], name: str, where: str) -> str:
    """``unknown key (did you mean 'argv'?)``, or the known keys when nothing is close."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key ({where}: {', '.join(sorted(known))})"
