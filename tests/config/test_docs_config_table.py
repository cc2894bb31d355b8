"""docs/configuration.md's table of keys is the one the code generates (``flexmig config keys --markdown``), so the
reference cannot drift from what the daemon accepts: a key added, renamed or given another default changes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexmig.cli.main import main as cli_main
from flexmig.config import Config, iter_keys, render_keys_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def doc_table() -> str:
    text = DOC.read_text()
    section = text.split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return "\n".join(rows) + "\n"


def test_the_documented_table_is_the_generated_one() -> None:
    assert doc_table() == render_keys_markdown(), "regenerate it: flexmig config keys --markdown"


def test_the_table_has_a_row_for_every_key_of_the_schema() -> None:
    keys = [k for k, _, _ in iter_keys(Config.default())]
    rows = doc_table().splitlines()[2:]
    assert [row.split(" | ")[0].removeprefix("| ").strip("`") for row in rows] == keys


def test_flexmig_config_keys_markdown_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "keys", "--markdown"]) == 0
    assert capsys.readouterr().out == render_keys_markdown()
