"""The hook is a distribution of its own, ``flexmig-hook``, with no dependencies, and ``flexmig.hook`` re-exports it.

A training environment that holds nothing but the hook's wheel (no prometheus_client, aiomqtt, psutil, pynvml, nor
flexmig itself) runs ``examples/hook_minimal.py`` as a job of the real daemon: it is started, asked to checkpoint,
migrated to another instance and resumed from its acknowledged step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import flexmig
import flexmig.hook
import flexmig.hook.atomic
import flexmig.hook.boundedjson
import flexmig.hook.protocol
import flexmig_hook
import flexmig_hook.atomic
import flexmig_hook.boundedjson
import flexmig_hook.protocol
from support.flexmigd import act_node, short_base
from support.jobs import counter_spec, log_lines, write_spec
from support.jobs import flexmig as jobs_cli
from support.wait import wait_until
from support.wheels import ROOT, build_wheel, fresh_venv, install_wheels, pip_into, source_copy

DAEMON_DEPS = ("prometheus_client", "aiomqtt", "psutil", "pynvml", "rich", "flexmig")


def test_flexmig_hook_is_the_hook_distribution_under_the_daemon_packages_name() -> None:
    for ours, theirs in (
        (flexmig.hook, flexmig_hook),
        (flexmig.hook.atomic, flexmig_hook.atomic),
        (flexmig.hook.boundedjson, flexmig_hook.boundedjson),
        (flexmig.hook.protocol, flexmig_hook.protocol),
    ):
        assert ours.__all__ == theirs.__all__
        for name in theirs.__all__:
            assert getattr(ours, name) is getattr(theirs, name), f"{ours.__name__}.{name}"


def test_the_hook_distribution_has_no_dependencies_and_the_daemons_version() -> None:
    hook = tomllib.loads((ROOT / "hook" / "pyproject.toml").read_text())["project"]
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert hook["dependencies"] == []
    assert hook["version"] == main["version"] == flexmig.__version__
    assert f"flexmig-hook=={hook['version']}" in [d.split("#")[0].strip() for d in main["dependencies"]]
    assert hook["license"] == main["license"] == "Apache-2.0"
    assert (ROOT / "hook" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()


@pytest.fixture(scope="module")
def hook_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the hook's wheel and nothing else; its python."""
    tmp = tmp_path_factory.mktemp("hook-env")
    wheel = build_wheel(source_copy(tmp / "src") / "hook", tmp / "wheels")
    python = fresh_venv(tmp / "venv")
    install_wheels(python, wheel)
    return python


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base() as d:
        yield d


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_venv_with_only_the_hook_holds_none_of_the_daemons_packages(hook_env: Path) -> None:
    listed = json.loads(pip_into(hook_env, "list", "--format=json").stdout)
    assert [d["name"] for d in listed] == ["flexmig-hook"]
    code = (
        "import importlib.util, json; "
        f"print(json.dumps({{m: importlib.util.find_spec(m) is not None for m in {list(DAEMON_DEPS)!r}}}))"
    )
    found = json.loads(subprocess.run([str(hook_env), "-c", code], capture_output=True, text=True, check=True).stdout)
    assert found == dict.fromkeys(DAEMON_DEPS, False)
    where = subprocess.run(
        [str(hook_env), "-c", "import flexmig_hook; print(flexmig_hook.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(hook_env.parents[1])), "the hook came from this environment, not the checkout"


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_the_minimal_example_in_a_hook_only_venv_is_migrated_by_flexmigd_and_resumes(
    hook_env: Path, base: Path
) -> None:
    log = base / "counter.log"
    with act_node(base, "h200") as node:
        spec = write_spec(base / "counter.toml", counter_spec(base, "counter", python=str(hook_env)))
        assert "job counter: running on" in jobs_cli(node.sock, "submit", str(spec))
        wait_until(lambda: sum(e["event"] == "step" for e in log_lines(log)) >= 3, what="the first steps")
        jobs_cli(node.sock, "migrate", "counter")

        def second_start() -> list[dict[str, Any]]:
            lines = log_lines(log)
            return lines if sum(e["event"] == "start" for e in lines) == 2 else []

        lines: list[dict[str, Any]] = wait_until(second_start, what="a second start after the move")
        rank = psutil.Process([e for e in lines if e["event"] == "start"][-1]["pid"])
        assert rank.cmdline()[0] == str(hook_env), "the rank runs on the hook-only environment's python"
    (checkpoint,) = [e for e in lines if e["event"] == "checkpoint"]
    first, second = [e for e in lines if e["event"] == "start"]
    assert first["resume"] is None and first["step"] == 0
    assert second["resume"] == checkpoint["path"]
    assert (second["step"], second["total"]) == (checkpoint["step"] + 1, checkpoint["total"])
    assert checkpoint["total"] == sum(range(checkpoint["step"] + 1))
    assert first["visible"] != second["visible"], "the job moved to another MIG instance"


def test_the_examples_import_the_hook_distribution_not_the_daemon() -> None:
    for example in ("hook_minimal.py", "train_ddp.py"):
        text = (ROOT / "examples" / example).read_text()
        assert "import flexmig_hook" in text and "from flexmig import" not in text, example
    assert sys.modules["flexmig_hook"].__name__ == "flexmig_hook"
