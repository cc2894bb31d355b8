"""The service layer is what docs/architecture.md says it is, and the actuator component stays a lifecycle adapter:
it reaches into none of the actuator's parts (its journal, executor, supervisor, jobs API), and every part of the
service layer is given what it needs through its constructor."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import flexmig
from flexmig.service.actuator_runtime import ActuatorRuntime
from flexmig.wiring.actuator import ActuatorComponent

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(flexmig.__file__).resolve().parent
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
PARTS = frozenset({"journal", "executor", "supervisor", "jobs"})


def reaches(source: str) -> list[str]:
    """``act.<part>.x`` and ``self.act.<part>.x`` in ``source``: an actuator's part used from outside it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr in PARTS:
            owner = node.value.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name == "act":
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_actuator_component_reaches_into_none_of_the_actuators_parts() -> None:
    assert reaches((PACKAGE / "wiring" / "actuator.py").read_text(encoding="utf-8")) == []


def test_the_check_finds_a_reach() -> None:
    assert reaches("self.act.executor.stopping = True\nact.jobs.max_pending = 3\n") == [
        "line 1: self.act.executor.stopping",
        "line 2: act.jobs.max_pending",
    ]


def test_the_docs_table_of_the_service_layer_names_what_is_there() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `([\w/]+)\.py` \|", DOC, re.M)
    assert {name for name, _ in rows} >= {"RuntimeMode", "PlanningLoop", "DaemonControl", "ActionSink"}
    for name, path in rows:
        module = importlib.import_module("flexmig." + path.replace("/", "."))
        assert inspect.isclass(getattr(module, name, None)), f"{path}.py has no class {name}"


def test_no_service_part_takes_a_callback_after_it_is_built() -> None:
    """Each part gets what it needs through its constructor: no on_built or attach hook to wire it later."""
    for path in sorted((PACKAGE / "service").glob("*.py")):
        names = {
            n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.FunctionDef)
        }
        assert not {n for n in names if n.startswith(("on_built", "attach"))}, path.name


def test_the_actuator_component_is_given_its_runtime_and_is_not_one() -> None:
    """Composition, not inheritance: the component keeps the runtime it is given and forwards nothing by name."""
    assert not issubclass(ActuatorComponent, ActuatorRuntime)
    assert "__getattr__" not in vars(ActuatorComponent)
    assert [n for n, v in vars(ActuatorComponent).items() if isinstance(v, property)] == []
    assert inspect.signature(ActuatorComponent).parameters["runtime"].annotation in {ActuatorRuntime, "ActuatorRuntime"}
