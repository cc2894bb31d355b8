"""What the dashboard and rule tests share: the generator and catalogue under dashboards/, the committed JSON read
back panel by panel, and promtool's parse check of a set of expressions (not a test module).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "rules" / "flexmig.rules.yml"
RULES_TEST = DASHBOARDS / "rules" / "flexmig.rules.test.yml"
if str(DASHBOARDS) not in sys.path:
    sys.path.insert(0, str(DASHBOARDS))

from flexmig_dashboards import alerts, metrics, promql  # noqa: E402


def _load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flexmig_dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()


def _load_render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flexmig_dashboards_render", DASHBOARDS / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render()

__all__ = [
    "DASHBOARDS",
    "NEEDS_SAID",
    "RULES",
    "RULES_TEST",
    "STATIC_VALUES",
    "PanelQuery",
    "alerts",
    "all_panels",
    "annotation_queries",
    "build",
    "committed",
    "declared_needs",
    "metrics",
    "panel_queries",
    "promql",
    "promtool_parse_errors",
    "render",
    "variable_queries",
]

STATIC_VALUES: dict[str, str] = {
    "Hostname": "gpu-node-7",
    "gpu": "0",
    "GPU_I_ID": "1",
    "mig_uuid": "MIG-00000000-0000-0000-0000-000000000000",
    "datasource": "Prometheus",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}
"""Values that make every query concrete for promtool (Grafana fills the ``__`` ones itself)."""

_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\)$")


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel of a committed dashboard."""

    dashboard: str  # file name, e.g. flexmig-node.json
    panel: str
    ref: str
    expr: str
    instant: bool
    row: str = ""  # the title of the row the panel sits in ("" before the first row)
    row_description: str = ""
    board: str = ""  # the dashboard's title
    board_description: str = ""

    @property
    def id(self) -> str:
        """``flexmig-node.json: Slice map ...: A`` (how tests name it)."""
        return f"{self.dashboard}: {self.panel}: {self.ref}"


def committed() -> dict[str, dict[str, Any]]:
    """Every committed dashboard JSON, by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def all_panels(board: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of ``board``, including those nested in collapsed rows."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries() -> list[PanelQuery]:
    """Every target of every panel of every committed dashboard, with the row and dashboard it sits in."""
    out = []
    for name, board in committed().items():
        row: dict[str, Any] = {}
        for top in board.get("panels", []):
            if top.get("type") == "row":
                row = top
            for p in (top, *top.get("panels", [])):
                inside = top if p is not top else row
                context = (
                    str(inside.get("title") or ""),
                    str(inside.get("description") or ""),
                    str(board.get("title") or ""),
                    str(board.get("description") or ""),
                )
                out += [
                    PanelQuery(name, p["title"], t["refId"], t["expr"], bool(t.get("instant")), *context)
                    for t in p.get("targets", [])
                ]
    return out


_NEEDS_TITLE = re.compile(r"\(needs ([^)]*)\)")
NEEDS_SAID = {
    "detail standard": 'detail = "standard"',
    "detail full": 'detail = "full"',
    "MQTT": "[mqtt] enabled",
    "dcgm-exporter": "dcgm-exporter",
    "mode act": 'mode = "act"',
    "Slurm": "[slurm] enabled",
}
"""What a row or dashboard that needs something says in its description (dashboards/flexmig_dashboards/panels.py's
NEEDS), by what its title's ``(needs ...)`` names."""


def declared_needs(title: str, description: str) -> frozenset[str]:
    """What a row or dashboard says, in its title's ``(needs a, b)`` AND in its description, that its panels need;
    a need its title names and its description does not say is not declared."""
    m = _NEEDS_TITLE.search(title)
    if not m:
        return frozenset()
    named = {n.strip() for n in m.group(1).split(",")}
    return frozenset(n for n in named if n in NEEDS_SAID and NEEDS_SAID[n] in description)


def annotation_queries() -> list[PanelQuery]:
    """Every Prometheus annotation query of every committed dashboard (the built-in Grafana one has none)."""
    return [
        PanelQuery(name, f"annotation {a['name']}", "Anno", a["expr"], False)
        for name, board in committed().items()
        for a in board.get("annotations", {}).get("list", [])
        if not a.get("builtIn")
    ]


def variable_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard, variable, selector, label) of every ``label_values(selector, label)`` query variable."""
    out = []
    for name, board in committed().items():
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = _LABEL_VALUES.match(var["query"])
            assert m, f"{name}: variable {var['name']}: not a label_values(selector, label) query: {var['query']}"
            out.append((name, var["name"], m["selector"], m["label"]))
    return out


def promtool_parse_errors(exprs: Mapping[str, str], workdir: Path, promtool: str) -> str:
    """promtool's complaints about ``exprs`` (name -> PromQL), each wrapped as a recording rule in a group named
    after it; empty when every expression parses."""
    lines = ["groups:"]
    for i, (name, expr) in enumerate(exprs.items()):
        lines.append(f"  - name: {json.dumps(name)}")
        lines.append(f"    rules:\n      - record: flexmig_check:expr_{i}\n        expr: {json.dumps(expr)}")
    path = workdir / "queries.rules.yml"
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    if done.returncode == 0:
        return ""
    return done.stdout + done.stderr
