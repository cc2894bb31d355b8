"""CI runs the suite as on a fresh machine: in a home directory made for the run, empty when the run begins, with
every per-user cache and configuration directory inside it (``.ci/fresh-home``), so that no test passes only
because an earlier run or a user warmed a cache (matplotlib's font list, hypothesis' database, pip's cache)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from support import freshhome

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "fresh-home"


def _recipes(makefile: str) -> dict[str, list[str]]:
    """Each target's recipe lines."""
    recipes: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in makefile.splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line.strip())
        elif m := re.match(r"^([A-Za-z$()/._-]+):", line):
            current = recipes.setdefault(m.group(1), [])
        elif line.strip() and not line.startswith("#"):
            current = None
    return recipes


def test_every_make_target_that_runs_pytest_runs_it_in_a_fresh_home() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^FRESH_HOME := \.ci/fresh-home$", makefile, re.M)
    recipes = _recipes(makefile)
    runs = {target: line for target, lines in recipes.items() for line in lines if "pytest" in line}
    assert {"test", "check", "fault"} <= set(runs)
    for target, line in runs.items():
        command = re.sub(r"^([A-Z_]+=\S+ )*", "", line)  # after the variables set for it
        assert command.startswith("$(FRESH_HOME) $(BIN)/pytest"), f"make {target}: {line}"


def test_ci_runs_make_test_with_ci_set() -> None:
    text = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^export CI=true$", text, re.M)
    assert text.rstrip().splitlines()[-1] == "make test"


@pytest.mark.integration
def test_fresh_home_gives_the_command_a_new_empty_home_and_removes_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in freshhome.VARIABLES}
    env["TMPDIR"] = str(tmp_path)
    shown = "; ".join(f'echo "{name}=${name}"' for name in (*freshhome.VARIABLES, "FLEXMIG_FRESH_HOME"))
    res = subprocess.run(
        [str(SCRIPT), "bash", "-c", f'{shown}; ls -A "$HOME" | wc -l; exit 3'],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 3, res.stderr  # the command's own status
    *pairs, count = res.stdout.splitlines()
    seen = dict(p.split("=", 1) for p in pairs)
    home = Path(seen["HOME"])
    assert home.parent == tmp_path and seen["FLEXMIG_FRESH_HOME"] == str(home)
    assert count.strip() == "0"
    for name in freshhome.VARIABLES:
        assert Path(seen[name]).is_relative_to(home), f"{name}={seen[name]}"
    assert not home.exists()


def test_a_ci_run_of_the_suite_is_in_a_fresh_home_that_was_empty_at_its_start() -> None:
    if freshhome.FRESH is None:
        ci = os.environ.get("CI")
        assert not ci, f"CI={ci}: CI runs the suite through .ci/fresh-home (make test, make check)"
        pytest.skip("this run was not started through .ci/fresh-home (make test does)")
    assert freshhome.AT_START == (), f"{freshhome.FRESH} held {freshhome.AT_START} when the run began"
    for name in freshhome.VARIABLES:
        value = os.environ.get(name)
        assert value is not None and Path(value).is_relative_to(freshhome.FRESH), f"{name}={value}"
