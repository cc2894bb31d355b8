"""The project names only what is in its repository: no file cites the team's notes that live outside it.

The notes (an API reference, a research brief, a survey of prior art, Slurm facts and a design page) are not
shipped, so a comment or a doc that sends a reader to one of them points nowhere: state the fact in place instead.
This test is ``grep -rn`` for their file names over every file of the checkout that git does not ignore.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration  # runs git ls-files
# The names are spelt in pieces so that this file does not match its own pattern. ``.`` matches any character,
# as in the grep this test stands for.
_STEMS = ("apis", "academic", "systems", "slurm", "DESIGN")
PATTERN = re.compile("|".join(stem + "." + "md" for stem in _STEMS))
_SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", "build"}


def project_files() -> list[Path]:
    """The checkout's files that git does not ignore (a walk that skips caches and venvs where git is missing)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        found: list[Path] = []
        for top, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            found.extend(Path(top, f) for f in files)
        return found
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def citations(paths: list[Path]) -> list[str]:
    """``path:line: text`` for every line that names one of the notes."""
    hits: list[str] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files carry no prose
        for number, line in enumerate(text.splitlines(), start=1):
            if PATTERN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def test_no_file_cites_the_notes_outside_the_repository() -> None:
    files = project_files()
    assert any(p.name == "README.md" for p in files), "the file list missed the checkout"
    assert citations(files) == []


def test_the_pattern_catches_each_name_as_grep_would() -> None:
    for stem in _STEMS:
        assert PATTERN.search(f"see reference/{stem}.md §1.5"), stem
    assert PATTERN.search("apis" + "-md") is not None  # grep's "." is any character
    assert PATTERN.search("the APIs of the planner, documented in docs/replay.md") is None
