"""The import rules that ``flexmig/__init__.py`` states hold for every module of the package.

The layer table is read from the package docstring itself, so the docstring cannot drift from what the code
does. Every ``import`` and ``from ... import`` counts, wherever it stands: at module level, in a function, under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import flexmig

PACKAGE = Path(flexmig.__file__).resolve().parent

FACES = frozenset({"cli", "daemon", "actuatord", "simenv"})
SIM_IMPORTERS = FACES | {"wiring", "sim"}
PYNVML_IMPORTERS = frozenset({"nvml", "sim"})
# The hook is a distribution of its own (flexmig_hook); the daemon takes it through flexmig.hook, which names once
# what the daemon uses of it.
HOOK_IMPORTERS = frozenset({"hook"})
# Modules allowed to import flexmig_hook directly while a branch moves them (none now: keep it empty at a merge).
PENDING_HOOK_IMPORTS: frozenset[str] = frozenset()
PURE = frozenset({"mig", "detect", "plan"})
PURE_MAY_IMPORT = PURE | {"errors"}
# Standard-library modules without I/O or a clock: all a pure layer may import beside flexmig.
PURE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "dataclasses",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "math",
        "numbers",
        "operator",
        "re",
        "statistics",
        "types",
        "typing",
    }
)


def layer_table(doc: str) -> tuple[frozenset[str], ...]:
    """The layers of the package docstring's ``::`` block, top line first."""
    block = re.search(r"::\n\n((?:    \S.*\n)+)", doc)
    assert block, "flexmig/__init__.py has no indented layer table after '::'"
    return tuple(frozenset(line.split()) for line in block.group(1).splitlines())


LAYERS = layer_table(ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))) or "")
RANK = {name: len(LAYERS) - i for i, row in enumerate(LAYERS) for name in row}


def layer_of(module: str) -> str:
    """The layer of the flexmig module ``module`` (``flexmig.act.devices`` -> ``act``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "flexmig"


def module_name(path: Path) -> str:
    """``…/flexmig/act/devices.py`` -> ``flexmig.act.devices`` (a package's ``__init__`` is the package)."""
    parts = ("flexmig", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package_module(module: str) -> bool:
    """True when ``module`` (``flexmig.x.y``) is a file or package of flexmig (and not a name defined in one)."""
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def is_init(module: str) -> bool:
    """True when ``module`` is a package (its source is an ``__init__.py``)."""
    return (PACKAGE / Path(*module.split(".")[1:]) / "__init__.py").is_file()


@dataclass(frozen=True)
class Import:
    """One imported module, where it is imported."""

    target: str
    line: int


def imports(module: str, source: str) -> Iterator[Import]:
    """Every module ``source`` (the text of ``module``) imports, at any depth.

    ``from a import b`` imports ``a.b`` when that is a module of flexmig, else ``a``; relative imports are
    resolved against ``module``'s package.
    """
    package = module.split(".") if is_init(module) else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                flexmig_module = origin.partition(".")[0] == "flexmig" and is_package_module(sub)
                yield Import(sub if flexmig_module else origin, node.lineno)


def violations(module: str, source: str) -> list[str]:
    """The import rules ``module`` (with text ``source``) breaks, one line each."""
    own = layer_of(module)
    found: list[str] = []
    for imp in imports(module, source):
        top = imp.target.split(".")[0]
        where = f"{module}:{imp.line} imports {imp.target}"
        if top == "pynvml" and own not in PYNVML_IMPORTERS:
            found.append(f"{where}: only {sorted(PYNVML_IMPORTERS)} import pynvml")
        if top == "flexmig_hook" and own not in HOOK_IMPORTERS and module not in PENDING_HOOK_IMPORTS:
            found.append(f"{where}: the daemon takes the hook through flexmig.hook")
        if top != "flexmig":
            if own in PURE and top not in PURE_STDLIB:
                found.append(f"{where}: {own} is pure, it imports only {sorted(PURE_STDLIB)} outside flexmig")
            continue
        target = layer_of(imp.target)
        if target == "flexmig" or target == own:
            continue  # the package root (its __version__), or the module's own layer
        if target not in RANK:
            found.append(f"{where}: layer {target!r} is not in the table of flexmig/__init__.py")
        elif target == "sim" and own not in SIM_IMPORTERS:
            found.append(f"{where}: only the wiring and the faces import the simulator")
        elif own in PURE and target not in PURE_MAY_IMPORT:
            found.append(f"{where}: {own} is pure, it imports only {sorted(PURE_MAY_IMPORT - {own})} of flexmig")
        elif RANK[target] > RANK[own]:
            found.append(f"{where}: {target} is above {own}")
        elif RANK[target] == RANK[own]:
            found.append(f"{where}: {target} and {own} are siblings on one line")
    return found


def package_modules() -> Iterator[tuple[str, Path]]:
    """Every module of the installed package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        yield module_name(path), path


def test_every_module_of_the_package_keeps_the_import_rules_its_docstring_states() -> None:
    found = [v for module, path in package_modules() for v in violations(module, path.read_text(encoding="utf-8"))]
    assert found == []


def test_every_module_belongs_to_a_layer_of_the_table_and_every_layer_has_modules() -> None:
    layers = {layer_of(module) for module, _ in package_modules()} - {"flexmig"}
    assert layers - RANK.keys() == set(), "layers missing from the table in flexmig/__init__.py"
    assert RANK.keys() - layers == set(), "layers in the table that no module has"


def test_a_function_local_import_of_the_simulator_in_telemetry_is_caught() -> None:
    source = "def open_node():\n    from flexmig import sim\n    return sim.install('h200')\n"
    assert violations("flexmig.telemetry.backend", source) == [
        "flexmig.telemetry.backend:2 imports flexmig.sim: only the wiring and the faces import the simulator"
    ]


def test_an_upward_import_a_sibling_import_and_an_impure_import_are_caught() -> None:
    assert violations("flexmig.nvml.client", "from flexmig.telemetry.snapshot import Snapshot\n") == [
        "flexmig.nvml.client:1 imports flexmig.telemetry.snapshot: telemetry is above nvml"
    ]
    assert violations("flexmig.jobspec.spec", "if True:\n    import flexmig.replay.run\n") == [
        "flexmig.jobspec.spec:2 imports flexmig.replay.run: replay and jobspec are siblings on one line"
    ]
    assert violations("flexmig.plan.planner", "import time\nfrom flexmig.nvml import Inventory\n") == [
        f"flexmig.plan.planner:1 imports time: plan is pure, it imports only {sorted(PURE_STDLIB)} outside flexmig",
        "flexmig.plan.planner:2 imports flexmig.nvml: plan is pure, it imports only ['detect', 'errors', 'mig'] "
        "of flexmig",
    ]
    assert violations("flexmig.telemetry.worker", "import pynvml\n") == [
        "flexmig.telemetry.worker:1 imports pynvml: only ['nvml', 'sim'] import pynvml"
    ]


def test_an_import_of_the_hook_distribution_outside_flexmig_hook_is_caught() -> None:
    assert violations("flexmig.mqtt.events", "from flexmig_hook.boundedjson import loads\n") == [
        "flexmig.mqtt.events:1 imports flexmig_hook.boundedjson: the daemon takes the hook through flexmig.hook"
    ]
    assert violations("flexmig.cli.demo_job", "def main():\n    import flexmig_hook\n") == [
        "flexmig.cli.demo_job:2 imports flexmig_hook: the daemon takes the hook through flexmig.hook"
    ]
    assert violations("flexmig.hook", "from flexmig_hook.protocol import FirstStep\n") == []
    assert violations("flexmig.mqtt.events", "from flexmig.hook import bounded_loads\n") == []


def test_the_pending_list_names_only_modules_that_still_need_it() -> None:
    """PENDING_HOOK_IMPORTS shrinks as rooms land: a module on it that no longer imports flexmig_hook directly (or
    is gone) must leave it."""
    sources = dict(package_modules())
    stale = sorted(
        m
        for m in PENDING_HOOK_IMPORTS
        if m not in sources
        or not any(i.target.split(".")[0] == "flexmig_hook" for i in imports(m, sources[m].read_text(encoding="utf-8")))
    )
    assert stale == []


def test_faces_and_the_wiring_may_choose_the_simulator() -> None:
    for module in ("flexmig.wiring.backend", "flexmig.cli.inventory_cmd", "flexmig.daemon", "flexmig.actuatord"):
        assert violations(module, "from flexmig import sim\n") == [], module


def test_relative_imports_are_resolved_against_the_package() -> None:
    assert [i.target for i in imports("flexmig.telemetry.sampler", "from ..sim import SimNode\n")] == ["flexmig.sim"]
    assert violations("flexmig.telemetry.sampler", "from .. import sim\n") == [
        "flexmig.telemetry.sampler:1 imports flexmig.sim: only the wiring and the faces import the simulator"
    ]
