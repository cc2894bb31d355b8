#!/usr/bin/env python3
"""Regenerate every checked-in artefact under dashboards/ from its Python definition, deterministically.

    python dashboards/build.py            # write dashboards/*.json and dashboards/rules/flexmig.rules.yml
    python dashboards/build.py --check    # exit 1, naming each file, if a checked-in file differs

Each ``<name>.dashboard.py`` defines ``dashboard`` (grafanalib's convention), and its JSON is written to
``<name>.json`` beside it with grafanalib's own encoder and layout (``sort_keys``, indent 2, final newline), so
``generate-dashboard`` gives the same bytes. The alert rules come from :mod:`flexmig_dashboards.alerts`.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the dashboards import flexmig_dashboards, which lives beside this script
    sys.path.insert(0, str(HERE))

from flexmig_dashboards.alerts import render_rules  # noqa: E402
from grafanalib._gen import DashboardEncoder  # noqa: E402  (grafanalib's own encoder: both tools agree byte for byte)

SUFFIX = ".dashboard.py"
RULES = HERE / "rules" / "flexmig.rules.yml"


def definitions(directory: Path = HERE) -> list[Path]:
    """The dashboard definitions in ``directory``, sorted by name."""
    return sorted(directory.glob(f"*{SUFFIX}"))


def json_path(definition: Path) -> Path:
    """Where the JSON of ``definition`` goes (``flexmig-node.dashboard.py`` -> ``flexmig-node.json``)."""
    return definition.with_name(definition.name[: -len(SUFFIX)] + ".json")


def load(definition: Path) -> Any:
    """The ``dashboard`` object ``definition`` defines (a fresh module each time)."""
    spec = importlib.util.spec_from_file_location(f"_flexmig_dashboard_{definition.stem.replace('-', '_')}", definition)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{definition}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    board = getattr(module, "dashboard", None)
    if board is None:
        raise RuntimeError(f"{definition}: defines no variable 'dashboard'")
    return board


def render_dashboard(definition: Path) -> str:
    """The JSON text of ``definition``, exactly as ``generate-dashboard`` writes it."""
    out = io.StringIO()
    json.dump(load(definition).to_json_data(), out, sort_keys=True, indent=2, cls=DashboardEncoder)
    out.write("\n")
    return out.getvalue()


def outputs(directory: Path = HERE) -> dict[Path, str]:
    """Every generated file and its text."""
    files = {json_path(d): render_dashboard(d) for d in definitions(directory)}
    files[RULES] = render_rules()
    return files


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) every generated file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the checked-in files, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(HERE.parent)}")
    for path in stale:
        print(f"{path.relative_to(HERE.parent)} is stale: run python dashboards/build.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
