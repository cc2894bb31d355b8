"""No dead code in the package: vulture finds no unused definition in daemon/flexmig and hook/, and every name a
module exports in ``__all__`` is used somewhere in the package.

What vulture cannot see used (callbacks, the simulated library's C entry points and struct fields, public API only
tests or docs use) is named in tests/vulture_whitelist.py, one group per reason; an entry that names nothing the
package defines any more fails too, so the whitelist cannot keep stale names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import vulture

from flexmig.sim.entrypoints import entry_points

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "daemon" / "flexmig", ROOT / "hook" / "src" / "flexmig_hook")
WHITELIST = Path(__file__).resolve().parents[1] / "vulture_whitelist.py"
MIN_CONFIDENCE = 60  # vulture's lowest: report everything it finds


def package_files() -> Iterator[Path]:
    for root in SOURCES:
        yield from sorted(root.rglob("*.py"))


def whitelisted() -> set[str]:
    """The names the whitelist marks as used (``_.name``)."""
    tree = ast.parse(WHITELIST.read_text(encoding="utf-8"))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_"
    }


def test_vulture_finds_no_unused_definition_in_the_package() -> None:
    finder = vulture.Vulture(ignore_names=sorted(entry_points()))
    finder.scavenge([str(p) for p in SOURCES] + [str(WHITELIST)])
    unused = [
        f"{Path(item.filename).relative_to(ROOT)}:{item.first_lineno}: {item.message}"
        for item in finder.get_unused_code(min_confidence=MIN_CONFIDENCE)
    ]
    assert unused == [], (
        "unused definitions (delete them; or, if something outside Python's view uses them, add them to "
        "tests/vulture_whitelist.py under the group that says why):\n" + "\n".join(unused)
    )


def _reads(tree: ast.AST) -> Iterator[str]:
    """Every name ``tree`` reads: loaded names, attributes, keyword arguments (not imports, not ``__all__``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg


def _exports(tree: ast.Module) -> Iterator[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            assert isinstance(node.value, ast.List | ast.Tuple)
            for elt in node.value.elts:
                assert isinstance(elt, ast.Constant) and isinstance(elt.value, str)
                yield elt.value


def test_every_exported_name_is_used_in_the_package_or_whitelisted() -> None:
    used = set(whitelisted())
    exported: dict[str, str] = {}
    for path in package_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used.update(_reads(tree))
        for name in _exports(tree):
            exported.setdefault(name, str(path.relative_to(ROOT)))
    unused = sorted(f"{where}: {name}" for name, where in exported.items() if name not in used)
    assert unused == [], (
        "exported in __all__ but used nowhere in the package (delete them, or whitelist public API that only tests, "
        "benchmarks or docs use):\n" + "\n".join(unused)
    )


def _defined(tree: ast.AST) -> Iterator[str]:
    """Every name ``tree`` defines: functions, classes, arguments, assigned names and attributes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr


def test_every_whitelisted_name_is_still_defined_in_the_package() -> None:
    defined: set[str] = set()
    for path in package_files():
        defined.update(_defined(ast.parse(path.read_text(encoding="utf-8"))))
    stale = sorted(whitelisted() - defined)
    assert stale == [], f"tests/vulture_whitelist.py names what the package no longer defines: {stale}"
