"""docs/results.md and the README's results table are what ``make bench`` (bench/results.py) writes, so every figure
in them comes from a benchmark's own output: no hand-written figure outside a benchmark's section."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import results  # type: ignore[import-not-found]  # noqa: E402


def test_the_results_file_is_exactly_what_the_generator_composes_from_its_sections() -> None:
    text = results.RESULTS.read_text()
    sections = results.sections_of(text)
    assert sections, "docs/results.md has no generated section: run make bench"
    assert results.compose(sections, quick=False) == text, (
        "docs/results.md was edited outside its generated sections: figures must come from make bench"
    )


def test_every_section_of_the_results_file_names_the_command_that_wrote_it() -> None:
    for name, text in results.sections_of(results.RESULTS.read_text()).items():
        (section,) = [s for s in results.SECTIONS if s.name == name]
        assert f"bench/{section.script}" in text, f"section {name} does not name bench/{section.script}"


def test_the_readme_s_results_table_is_the_results_file_s() -> None:
    rows, _ = results.glance(results.sections_of(results.RESULTS.read_text()))
    readme = results.README.read_text()
    table = readme.split(results.README_BEGIN, 1)[1].split(results.README_END, 1)[0]
    assert table.strip().splitlines()[2:] == rows, "README's table is stale: run make bench (it rewrites both)"


def test_a_section_s_glance_rows_survive_a_rerun_of_the_others() -> None:
    section = "## systemd hardening\n\nfigures\n\n<!-- glance -->\n| a | b | c |\n<!-- /glance -->"
    first = results.compose({"hardening": section}, quick=False)
    again = results.compose(results.sections_of(first), quick=False)
    assert again == first and "| a | b | c |" in again.split("## systemd hardening")[0]
