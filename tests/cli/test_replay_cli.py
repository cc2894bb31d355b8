"""``flexmig simulate`` end to end, on a small slice of the Alibaba trace vendored under bench/traces/."""

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pytest import CaptureFixture, MonkeyPatch, TempPathFactory

from flexmig.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "bench" / "traces" / "alibaba-gpu-v2023"
KEYS = {
    "policy",
    "makespan_s",
    "mean_jct_s",
    "p95_jct_s",
    "mean_wait_s",
    "utilization",
    "fragmentation_mean",
    "migrations",
    "resplits",
    "jobs_completed",
    "jobs_unplaceable",
    "max_jct_s",
    "max_wait_s",
    "p95_bounded_slowdown",
    "slowdown_bound_s",
    "by_size",
    "discipline",
    "malleable",
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: TempPathFactory) -> Path:
    """400 GPU rows of openb_pod_list_gpushare40.csv: every 17th, so that the slice spans the whole trace (whole-GPU
    and multi-GPU jobs lie in its later part)."""
    out = tmp_path_factory.mktemp("trace") / "slice.csv"
    lines = (TRACES / "openb_pod_list_gpushare40.csv").read_text().splitlines()
    rows = [r for r in lines[1:] if r.split(",")[3] != "0"][16::17][:400]
    out.write_text("\n".join([lines[0], *rows]) + "\n")
    return out


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def simulate(capsys: CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["simulate", "--no-progress", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("policy", ["static", "drain", "drain-first-fit", "flex", "fluid", "repack", "bound"])
def test_every_policy_prints_the_documented_json_keys(capsys: CaptureFixture[str], trace: Path, policy: str) -> None:
    status, out, _ = simulate(capsys, "--trace", str(trace), "--node", "h200x2", "--policy", policy, "--json")
    assert status == 0
    figures = json.loads(out)
    assert set(figures) >= KEYS and figures["policy"] == policy
    assert figures["jobs_completed"] + figures["jobs_unplaceable"] == figures["jobs"]
    if policy == "static":
        assert figures["static_layout"]


def test_same_trace_load_and_seed_give_the_same_figures(capsys: CaptureFixture[str], trace: Path) -> None:
    args = ("--trace", str(trace), "--node", "h200x2", "--policy", "flex", "--load", "0.5", "--seed", "7", "--json")
    first = simulate(capsys, *args)[1]
    again = simulate(capsys, *args)[1]
    assert first == again
    other = simulate(capsys, *args[:-3], "--seed", "8", "--json")[1]
    assert other != first  # another seed thins the trace differently


def test_no_resplit_means_no_spread_and_no_resplit(capsys: CaptureFixture[str], trace: Path) -> None:
    args = ("--trace", str(trace), "--node", "h200x2", "--policy", "flex", "--load", "0.8", "--json")
    figures = json.loads(simulate(capsys, *args, "--no-resplit")[1])
    assert figures["resplits"] == 0 and figures["spread_starts"] == 0


# matplotlib builds its font list on first use in a process whose MPLCONFIGDIR holds none (a fresh home, as CI's),
# and it runs fc-list to do it: a test that draws starts a process, whatever the machine's caches hold.
draws = pytest.mark.integration


@draws
def test_plot_writes_a_png(capsys: CaptureFixture[str], trace: Path, tmp_path: Path) -> None:
    png = tmp_path / "timeline.png"
    status, out, _ = simulate(
        capsys, "--trace", str(trace), "--node", "h200x2", "--policy", "drain", "--plot", str(png)
    )
    assert status == 0 and "plot" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@draws
def test_plot_format_follows_the_suffix_svg_is_svg(capsys: CaptureFixture[str], trace: Path, tmp_path: Path) -> None:
    svg = tmp_path / "timeline.svg"
    status, _, _ = simulate(capsys, "--trace", str(trace), "--node", "h200x2", "--policy", "fluid", "--plot", str(svg))
    assert status == 0
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_an_unknown_plot_suffix_is_refused_before_the_replay(
    capsys: CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "timeline.jpeg"
    status, stdout, err = simulate(capsys, "--trace", str(trace), "--policy", "flex", "--plot", str(out))
    assert status == 2 and "unknown format '.jpeg'" in err and ".png, .svg, .pdf" in err
    assert stdout == "" and not out.exists()


def test_plot_without_matplotlib_names_the_plot_extra_before_the_replay(
    capsys: CaptureFixture[str], trace: Path, tmp_path: Path, monkeypatch: MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    out = tmp_path / "timeline.png"
    status, stdout, err = simulate(capsys, "--trace", str(trace), "--policy", "flex", "--plot", str(out))
    assert status == 2 and "matplotlib is not installed" in err and "flexmig[plot]" in err
    assert stdout == "" and not out.exists()


def test_progress_bar_is_drawn_on_a_terminal_stderr(
    capsys: CaptureFixture[str], trace: Path, monkeypatch: MonkeyPatch
) -> None:
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    status = main(["simulate", "--trace", str(trace), "--node", "h200x1", "--policy", "fluid", "--json"])
    assert status == 0 and "fluid easy h200x1" in tty.getvalue()
    json.loads(capsys.readouterr().out)  # stdout stays clean JSON


def test_no_progress_frames_go_into_a_redirected_stderr(capsys: CaptureFixture[str], trace: Path) -> None:
    status = main(["simulate", "--trace", str(trace), "--node", "h200x1", "--policy", "fluid", "--json"])
    captured = capsys.readouterr()
    assert status == 0 and captured.err == ""  # capsys' stderr is not a terminal: no bar, no \r frames
    json.loads(captured.out)


def test_the_discipline_and_malleable_jobs_are_a_choice_and_show_in_the_figures(
    capsys: CaptureFixture[str], trace: Path
) -> None:
    base = ("--trace", str(trace), "--node", "h200x2", "--policy", "flex", "--load", "0.8", "--json")
    easy = json.loads(simulate(capsys, *base)[1])
    greedy = json.loads(simulate(capsys, *base, "--discipline", "greedy")[1])
    narrow = json.loads(simulate(capsys, *base, "--malleable")[1])
    assert (easy["discipline"], greedy["discipline"], easy["malleable"], narrow["malleable"]) == (
        "easy",
        "greedy",
        False,
        True,
    )
    assert easy["narrow_starts"] == 0 < narrow["narrow_starts"]
    assert easy != greedy
    for figures in (easy, greedy, narrow):
        sizes = figures["by_size"]
        assert (
            set(sizes) <= {"share", "whole", "multi"}
            and sum(v["jobs"] for v in sizes.values()) == figures["jobs_completed"]
        )
        assert figures["max_wait_s"] == max(v["max_wait_s"] for v in sizes.values())
        assert figures["max_jct_s"] >= figures["p95_jct_s"] >= 0 and figures["p95_bounded_slowdown"] >= 1.0


def test_the_table_shows_the_worst_cases_and_the_size_classes(capsys: CaptureFixture[str], trace: Path) -> None:
    status, out, _ = simulate(capsys, "--trace", str(trace), "--node", "h200x2", "--policy", "drain")
    assert status == 0
    for key in ("max_jct_s", "max_wait_s", "p95_bounded_slowdown", "share jobs", "slowdown bound (s)"):
        assert key in out


def test_missing_trace_is_a_clear_error(capsys: CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = simulate(capsys, "--trace", str(tmp_path / "nope.csv"), "--policy", "flex")
    assert status == 2 and "cannot read trace" in err and "nope.csv" in err


def test_bad_node_spec_is_a_clear_error(capsys: CaptureFixture[str], trace: Path) -> None:
    status, _, err = simulate(capsys, "--trace", str(trace), "--node", "h300x2", "--policy", "flex")
    assert status == 2 and "unknown GPU model 'h300'" in err


def test_node_without_mig_is_refused(capsys: CaptureFixture[str], trace: Path) -> None:
    status, _, err = simulate(capsys, "--trace", str(trace), "--node", "h200x2:-", "--policy", "flex")
    assert status == 2 and "MIG disabled" in err


def test_load_above_the_traces_own_is_refused(capsys: CaptureFixture[str], trace: Path) -> None:
    status, _, err = simulate(capsys, "--trace", str(trace), "--node", "h200x1", "--policy", "flex", "--load", "500")
    assert status == 2 and "thinning can only lower it" in err


def test_bound_has_nothing_to_plot(capsys: CaptureFixture[str], trace: Path, tmp_path: Path) -> None:
    png = tmp_path / "b.png"
    status, _, err = simulate(capsys, "--trace", str(trace), "--policy", "bound", "--plot", str(png))
    assert status == 2 and "nothing to plot" in err and not png.exists()


def test_no_policy_beats_the_bound_on_the_slice(capsys: CaptureFixture[str], trace: Path) -> None:
    def figures(policy: str) -> dict[str, Any]:
        out = simulate(capsys, "--trace", str(trace), "--node", "h200x2", "--policy", policy, "--json")[1]
        doc: dict[str, Any] = json.loads(out)
        return doc

    bound = figures("bound")
    for policy in ("fluid", "repack", "flex", "drain", "drain-first-fit"):
        got = figures(policy)
        assert got["makespan_s"] >= bound["makespan_s"] - 1e-6
        assert got["mean_jct_s"] >= bound["mean_jct_s"] - 1e-6


def test_replay_charges_its_own_large_model_costs_unless_told_otherwise(
    capsys: CaptureFixture[str], trace: Path
) -> None:
    base = ["--trace", str(trace), "--node", "h200x2", "--policy", "flex", "--json"]
    status, out, _ = simulate(capsys, *base)
    assert status == 0
    got = json.loads(out)["planner_settings"]
    assert (got["checkpoint_s"], got["restart_s"], got["reconfigure_s"]) == (20.0, 30.0, 2.0)
    assert (got["settling_s"], got["gain_margin"]) == (600.0, 1.0)
    status, out, _ = simulate(capsys, *base, "--costs", "daemon", "--checkpoint-s", "7", "--gain-margin", "0.5")
    assert status == 0
    got = json.loads(out)["planner_settings"]
    assert (got["checkpoint_s"], got["restart_s"], got["reconfigure_s"]) == (7.0, 5.0, 5.0)
    assert (got["settling_s"], got["gain_margin"]) == (300.0, 0.5)
