"""README.md is a front page: under 12 KB, and it starts with the two commands (``make demo``, ``make test``) before
anything else; the rest of what it used to hold lives under docs/ (tests/repo/test_docs_links.py checks the links).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LIMIT_BYTES = 12 * 1024


def test_the_readme_is_under_12_kb() -> None:
    size = len(README.read_bytes())
    assert size < LIMIT_BYTES, f"README.md is {size} bytes, over {LIMIT_BYTES}: move detail to docs/"


def test_the_readme_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), "the title comes first"
    body = [line for line in lines[1:] if line.strip()]
    assert body[0] == "```sh", "the first thing under the title is the shell block of the two commands"
    block = body[1 : body.index("```", 1)]
    assert [line.split("#", 1)[0].strip() for line in block] == ["make demo", "make test"]
    assert all("#" in line for line in block), "each command says what it does"
