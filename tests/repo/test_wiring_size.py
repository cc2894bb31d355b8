"""``wiring/`` only wires (issue 43): under 1,500 lines in all, and no class in it over 200, so that what the daemon
does lives in the service layer and the packages that own it, and each component stays a lifecycle adapter. The
lines are counted as ``wc -l daemon/flexmig/wiring/*.py`` counts them."""

from __future__ import annotations

import ast
from pathlib import Path

WIRING = Path(__file__).resolve().parents[2] / "daemon" / "flexmig" / "wiring"
MAX_WIRING_LINES = 1500
MAX_CLASS_LINES = 200


def class_lines(text: str) -> dict[str, int]:
    """Each class of ``text`` and its lines, from ``class`` to its last line (nested ones on their own)."""
    return {
        n.name: (n.end_lineno or n.lineno) - n.lineno + 1
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.ClassDef)
    }


def test_wiring_is_under_1500_lines_with_no_class_over_200() -> None:
    texts = {p.name: p.read_text(encoding="utf-8") for p in sorted(WIRING.glob("*.py"))}
    total = sum(len(t.splitlines()) for t in texts.values())
    assert total < MAX_WIRING_LINES, f"wiring/ is {total} lines: move what is not a lifecycle to service/"
    big = {f"{name}:{cls}": n for name, t in texts.items() for cls, n in class_lines(t).items() if n > MAX_CLASS_LINES}
    assert big == {}, f"classes of wiring/ over {MAX_CLASS_LINES} lines: {big}"


def test_the_count_sees_a_long_class() -> None:
    text = "class Big:\n" + "    x = 1\n" * 250 + "\nclass Small:\n    pass\n"
    assert class_lines(text) == {"Big": 251, "Small": 2}
