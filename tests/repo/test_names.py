"""One name, one thing: each public class or type alias is defined once in the package, and its errors stand in
``flexmig/errors.py`` unless that module's docstring names them (with the reason they live elsewhere).

Read from the source (no module is imported), like the layer rules of tests/repo/test_layers.py.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import flexmig

PACKAGE = Path(flexmig.__file__).resolve().parent
HOOK = PACKAGE.parent.parent / "hook" / "src" / "flexmig_hook"
ROOT = PACKAGE.parent.parent
TYPE_NAME = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")  # CamelCase, not a CONSTANT


def sources(*roots: Path) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def type_names(tree: ast.Module) -> Iterator[tuple[str, int, str]]:
    """(name, line, what) of every public class (at any depth) and module-level type alias of ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield node.name, node.lineno, "class"
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        for name in names:
            if TYPE_NAME.fullmatch(name):
                yield name, node.lineno, "alias"


def test_each_public_class_or_type_name_is_defined_once_in_the_package() -> None:
    places: dict[str, list[str]] = defaultdict(list)
    for path, tree in sources(PACKAGE):
        for name, line, what in type_names(tree):
            places[name].append(f"{path.relative_to(ROOT)}:{line} ({what})")
    twice = {name: where for name, where in sorted(places.items()) if len(where) > 1}
    assert twice == {}, "one public name, one thing: rename all but one of\n" + "\n".join(
        f"{name}: {', '.join(where)}" for name, where in twice.items()
    )


def _base_names(node: ast.ClassDef) -> Iterator[str]:
    for base in node.bases:
        if isinstance(base, ast.Name):
            yield base.id
        elif isinstance(base, ast.Attribute):
            yield base.attr


def exception_classes() -> list[tuple[str, str]]:
    """(name, where) of every exception class the package and the hook define, found by their bases (to a fixed
    point: a subclass of one of ours is one too)."""
    known = {name for name in dir(builtins) if isinstance(getattr(builtins, name), type)}
    known = {name for name in known if issubclass(getattr(builtins, name), BaseException)}
    classes = [
        (node, f"{path.relative_to(ROOT)}:{node.lineno}")
        for path, tree in sources(PACKAGE, HOOK)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]
    found: dict[str, str] = {}  # where -> name
    grew = True
    while grew:
        grew = False
        for node, where in classes:
            if where not in found and any(b in known for b in _base_names(node)):
                found[where] = node.name
                known.add(node.name)
                grew = True
    return sorted((name, where) for where, name in found.items())


def test_errors_are_defined_in_errors_py_or_named_in_its_docstring() -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))) or ""
    named = {m.split(".")[-1] for m in re.findall(r"``([A-Za-z_][\w.]*)``", doc)}
    errors_py = str((PACKAGE / "errors.py").relative_to(ROOT))
    found = exception_classes()
    assert len([w for _, w in found if w.startswith(errors_py)]) > 20, "the search finds errors.py's hierarchy"
    stray = [
        f"{where}: {name}"
        for name, where in found
        if not where.startswith(errors_py) and not name.startswith("_") and name not in named
    ]
    assert stray == [], (
        "errors outside flexmig/errors.py: move them there, or name them in its docstring with the reason:\n"
        + "\n".join(stray)
    )
