"""Small modules, short functions: in the rooms already brought to size (the actuator's ``act``, the service layer, the
actuator component), no module is over 600 lines and no function over 60. The other rooms join the list as they are
split (issue 43); declarative tables that are long by nature go on the commented allow-list below."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import flexmig

PACKAGE = Path(flexmig.__file__).resolve().parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
ROOMS = ("act", "service", "wiring/actuator.py", "wiring/actuator_host.py", "wiring/plan_now.py")
ALLOWED: dict[str, str] = {
    # module or module:function -> why it may be longer
}


def modules() -> Iterator[Path]:
    for room in ROOMS:
        path = PACKAGE / room
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def too_long(path: Path, name: str) -> list[str]:
    """What in ``path`` (``name`` in the package) is over the limits: ``name (N lines)``, ``name:function (N
    lines)``."""
    text = path.read_text(encoding="utf-8")
    found = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES and name not in ALLOWED:
        found.append(f"{name} ({lines} lines)")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES and f"{name}:{node.name}" not in ALLOWED:
                found.append(f"{name}:{node.name} ({length} lines)")
    return found


def test_no_module_or_function_of_the_rooms_brought_to_size_is_too_long() -> None:
    assert [x for p in modules() for x in too_long(p, p.relative_to(PACKAGE).as_posix())] == []


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long = tmp_path / "long.py"
    long.write_text(f"def f() -> None:\n{body}\n")
    assert too_long(long, "act/long.py") == [f"act/long.py:f ({MAX_FUNCTION_LINES + 1} lines)"]
