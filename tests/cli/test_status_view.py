"""``flexmig status`` for people at a terminal's size: its height too (what ``--watch`` shows), the slice map's
legend, and each finding's pointer into docs/detection.md."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from flexmig.cli.status_cmd import SLICE_MAP_LEGEND, fetch, render_text
from flexmig.detect.findings import FINDING_DOCS, finding_docs

ROOT = Path(__file__).resolve().parents[2]
WIDE = "h200x8:" + "+".join(f"1g.18gb@{s}" for s in range(7))


def status(spec: str) -> dict[str, Any]:
    return fetch(argparse.Namespace(sim=spec, socket=None, timeout=1.0))


@pytest.fixture(scope="module")
def wide() -> dict[str, Any]:
    """Eight GPUs of seven instances each, a dozen jobs and actions: far more than 24 lines."""
    doc = status(WIDE)
    doc["jobs"] = [
        {"name": f"train-{n}", "state": "running", "ranks": 1, "generation": 1, "last_ack": None,
         "instances": [{"gpu": n // 7, "profile": "1g.18gb", "start": n % 7}]}
        for n in range(12)
    ]  # fmt: skip
    doc["recent_actions"] = [{"action_id": 20 - n, "action": "start", "job": f"train-{n}", "state": "done"}
                             for n in range(12)]  # fmt: skip
    return doc


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (80, 12)])
def test_a_view_taller_than_the_terminal_is_summarised_to_fit_keeping_the_node_first(
    wide: dict[str, Any], width: int, height: int
) -> None:
    full = render_text(wide, width).plain.splitlines()
    lines = render_text(wide, width, height).plain.splitlines()
    assert len(full) > height >= len(lines) and all(len(line) <= width for line in lines)
    assert lines[0] == full[0] and lines[0].startswith(wide["node"])
    if height >= 24:  # room for every GPU's line
        assert [line[:6] for line in lines if line.startswith("GPU ")] == [f"GPU {i}:" for i in range(8)]


def test_a_view_that_fits_is_shown_whole(wide: dict[str, Any]) -> None:
    full = render_text(wide, 80)
    assert render_text(wide, 80, len(full.plain.splitlines())).plain == full.plain


def test_where_slice_maps_are_shown_a_legend_says_how_to_read_them() -> None:
    text = render_text(status("h200:3g.71gb@0+2g.35gb@4"), 80).plain
    assert "[333322..]" in text and SLICE_MAP_LEGEND in text and len(SLICE_MAP_LEGEND) <= 80


def test_each_finding_line_names_the_section_of_docs_detection_md_that_explains_it() -> None:
    doc = status("h200:3g.71gb@0+2g.35gb@4+1g.18gb@6")  # one sweep judges its findings at once: idle instances
    text = render_text(doc, None).plain
    kinds = {f["kind"] for f in doc["findings"]}
    assert kinds and all(f"({finding_docs(k)})" in text for k in kinds)
    headings = (ROOT / "docs" / "detection.md").read_text()
    slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", headings, re.M)}
    for _, where in FINDING_DOCS:
        assert where.split("#", 1)[1] in slugs, where


def test_in_mode_act_a_node_whose_jobs_get_no_cgroup_says_so_and_why() -> None:
    doc = status("h200:3g.71gb@0")
    doc["mode"] = "act"
    doc["job_cgroups"] = {"base": None, "off": "/sys/fs/cgroup/flexmig-jobs: Read-only file system"}
    text = render_text(doc, 120).plain
    assert "! no job cgroups (/sys/fs/cgroup/flexmig-jobs: Read-only file system)" in text
    doc["job_cgroups"] = {"base": "/sys/fs/cgroup/system.slice/flexmigd.service/flexmig-jobs", "off": ""}
    assert "no job cgroups" not in render_text(doc, 120).plain
    doc["mode"], doc["job_cgroups"] = "observe", {"base": None, "off": "read-only"}
    assert "no job cgroups" not in render_text(doc, 120).plain, "only mode act launches jobs"
