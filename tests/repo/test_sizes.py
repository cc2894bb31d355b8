"""The size rule: no module of the daemon or the hook over 600 lines, no function over 60 (``make check`` runs it).

A long module holds more than one idea and a long function more than one step; both are where changes collide.
Lines are counted as they stand in the file (docstrings and comments included): a module's reader reads those too.
The one exception is a declarative table (data laid out as code, read as a whole), named in :data:`TABLES` with why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "daemon" / "flexmig", ROOT / "hook" / "src" / "flexmig_hook")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

# Declarative tables: data laid out as code, which a split would only scatter. Module or "module:function" -> why.
TABLES: dict[str, str] = {}

# Modules and functions allowed over the limits while a branch splits them (none now: keep it empty at a merge).
PENDING: frozenset[str] = frozenset()


def oversized(sources: tuple[Path, ...] = SOURCES) -> Iterator[tuple[str, int, int]]:
    """(name, lines, limit) of every module and function over its limit (functions as ``module:function``)."""
    for base in sources:
        for path in sorted(base.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            name = str(path.relative_to(base.parent))  # flexmig/act/executor.py, flexmig_hook/...
            lines = len(text.splitlines())
            if lines > MAX_MODULE_LINES:
                yield name, lines, MAX_MODULE_LINES
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        yield f"{name}:{node.name}", length, MAX_FUNCTION_LINES


def test_no_module_over_600_lines_and_no_function_over_60() -> None:
    over = [
        f"{name}: {lines} lines (at most {limit})"
        for name, lines, limit in oversized()
        if name not in TABLES and name not in PENDING
    ]
    assert over == [], "split these (or name a declarative table in TABLES, with why):\n" + "\n".join(over)


def test_every_exception_still_needs_to_be_one() -> None:
    """An entry of TABLES or PENDING that is within the limits now (or gone) leaves its list."""
    still = {name for name, _, _ in oversized()}
    stale = sorted((TABLES.keys() | PENDING) - still)
    assert stale == [], "within the limits now: take them off the list"


def test_a_long_function_and_a_long_module_are_found(tmp_path: Path) -> None:
    base = tmp_path / "flexmig"
    base.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # with its def line: one too many
    (base / "long.py").write_text("def step():\n" + body + "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES))
    (base / "short.py").write_text("def step():\n" + body[: -len(f"    x{MAX_FUNCTION_LINES - 1} = 59\n")])
    assert sorted(oversized((base,))) == [("flexmig/long.py", 601, 600), ("flexmig/long.py:step", 61, 60)]
