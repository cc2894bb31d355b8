"""docs/architecture.md says what the code does: its layer table is the one tests/repo/test_layers.py enforces, its
component list is the order wire() builds, its table of operations is the operation table's own."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import flexmig
from flexmig.act.operation_table import markdown
from flexmig.config import Config
from flexmig.daemon import Daemon
from flexmig.wiring import SWITCHES
from support.configs import every_part_on

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text of the ``## title`` section."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert m, f"docs/architecture.md has no section {title!r}"
    return m.group(1)


def test_the_layer_table_is_the_one_the_layer_test_enforces() -> None:
    """test_layers.py reads the package docstring's indented block after '::'; the doc shows the same lines."""
    block = re.search(r"::\n\n((?:    \S.*\n)+)", flexmig.__doc__ or "")
    assert block, "flexmig/__init__.py has no layer table"
    enforced = [line.split() for line in block.group(1).splitlines()]
    shown = re.search(r"```text\n(.*?)```", section("Layers"), re.S)
    assert shown, "no ```text block in the Layers section"
    assert [line.split() for line in shown.group(1).splitlines()] == enforced


def test_the_optional_components_are_those_with_a_switch() -> None:
    """A row not present "always" is an optional part: it has a switch in wiring.SWITCHES (an Off when it is off)."""
    rows = re.findall(
        r"^\| \d+ \| `([^`]+)` \| [^|]+ \| [^|]+ \| ([^|]+) \|", section("The components of flexmigd, in order"), re.M
    )
    optional = {name for name, present in rows if not present.strip().startswith("always")}
    assert optional == set(SWITCHES)


def test_the_component_list_is_the_order_wire_builds(tmp_path: Path) -> None:
    """A daemon with every optional component on (built, not started): the doc's rows, in the doc's order."""
    config = every_part_on(tmp_path)
    daemon = Daemon(config, sim_spec="h200")
    plain = Daemon(Config(), sim_spec="h200")
    try:
        rows = re.findall(r"^\| \d+ \| `([^`]+)` \|", section("The components of flexmigd, in order"), re.M)
        assert rows == list(daemon.components.names)
        assert [r for r in rows if r in plain.components.names] == list(plain.components.names), "the same order"
    finally:
        for d in (daemon, plain):
            asyncio.run(close(d))


async def close(daemon: Daemon) -> None:
    for component in reversed(daemon.order):
        await component.close()
    daemon.worker.shutdown()


def test_the_operations_table_is_the_operation_tables_own() -> None:
    assert markdown() in section("Where a control operation is declared"), (
        "regenerate it: python -m flexmig.act.operation_table --markdown"
    )
