"""``flexmig simulate`` end to end, on a small slice of the Alibaba trace (or a synthetic one when it is absent)."""

import json
from pathlib import Path
from typing import Any

import pytest
from pytest import CaptureFixture, TempPathFactory

from flexmig.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
TRACE_DIRS = (ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023", ROOT / "shared" / "traces" / "alibaba-gpu-v2023")
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
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
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: TempPathFactory) -> Path:
    """The first 400 GPU rows of openb_pod_list_gpushare40.csv (a synthetic stand-in if the trace is absent)."""
    out = tmp_path_factory.mktemp("trace") / "slice.csv"
    for d in TRACE_DIRS:
        src = d / "openb_pod_list_gpushare40.csv"
        if src.is_file():
            lines = src.read_text().splitlines()
            rows = [r for r in lines[1:] if r.split(",")[3] != "0"][:400]
            out.write_text("\n".join([lines[0], *rows]) + "\n")
            return out
    rows = []
    for i in range(400):
        milli = (100, 300, 460, 810, 1000)[i % 5]
        gpus = 2 if i % 37 == 0 else 1
        rows.append(f"p{i},1,1,{gpus},{milli},,LS,Running,{i * 300},{i * 300 + 200 + (i * 97) % 5000},{i * 300}")
    out.write_text("\n".join([HEADER, *rows]) + "\n")
    return out


def simulate(capsys: CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["simulate", "--no-progress", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("policy", ["static", "drain", "flex", "fluid", "bound"])
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


def test_plot_writes_a_png(capsys: CaptureFixture[str], trace: Path, tmp_path: Path) -> None:
    png = tmp_path / "timeline.png"
    status, out, _ = simulate(
        capsys, "--trace", str(trace), "--node", "h200x2", "--policy", "drain", "--plot", str(png)
    )
    assert status == 0 and "plot" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_goes_to_stderr(capsys: CaptureFixture[str], trace: Path) -> None:
    status = main(["simulate", "--trace", str(trace), "--node", "h200x1", "--policy", "fluid", "--json"])
    captured = capsys.readouterr()
    assert status == 0 and "fluid h200x1" in captured.err
    json.loads(captured.out)  # stdout stays clean JSON


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
    for policy in ("fluid", "flex", "drain"):
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
    assert (got["checkpoint_s"], got["restart_s"], got["reconfigure_s"]) == (7.0, 6.0, 5.0)
    assert (got["settling_s"], got["gain_margin"]) == (300.0, 0.5)
