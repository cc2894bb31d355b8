"""Crash safety: the actuator is killed with SIGKILL at each journalled step of a migration (and of an in-place
re-split), for a job without and with standby ranks; after a restart the job runs exactly once, from an intact
checkpoint, no standby rank is left over, and no MIG instance is leaked or missing.

The actuator runs as ``python -m flexmig.actuatord`` in a child process on a simulated node whose state file survives
the kill, as a driver's state would. A harness wraps its ``main`` with a journal callback that SIGKILLs the
process right after the chosen step's journal commit (``intent``: before the step runs; ``done``: after).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexmig import sim
from flexmig.act.client import ControlError
from flexmig.act.journal import Journal
from flexmig.act.procs import PsutilScanner
from support.actuatord import Actuatord
from support.jobs import job_toml, kill_ranks
from support.wait import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HARNESS = textwrap.dedent(
    """
    import os, signal, sys
    from flexmig.actuatord import main
    kill_at = os.environ.get("TEST_KILL_AT", "")

    def on_step(ev):
        if f"{ev.action_kind}:{ev.step}:{ev.phase}" == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    sys.exit(main(sys.argv[1:], on_step=on_step))
    """
)


class Node(Actuatord):
    """One simulated node with the actuator as a child process (:mod:`support.actuatord`, run through the harness
    above) that may be killed and restarted."""

    def __init__(self, base: Path, spec: str) -> None:
        (base / "harness.py").write_text(HARNESS)
        super().__init__(base, spec, harness=base / "harness.py")

    def start(self, kill_at: str = "", extra_env: dict[str, str] | None = None) -> None:  # type: ignore[override]
        super().start(env={"TEST_KILL_AT": kill_at, **(extra_env or {})})

    # ------------------------------------------------------------------------------------------- checks
    def record(self, name: str = "counter") -> Any:
        j = Journal(self.base / "journal.sqlite3")
        try:
            return j.get_job(name)
        finally:
            j.close()

    def log(self) -> list[dict[str, Any]]:
        p = self.base / "counter.ckpt" / "counter.log"
        return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []

    def wait_steps(self, past: int = 5, timeout_s: float = 30) -> dict[str, Any]:
        """Wait until the record's generation has started and run ``past`` steps; return its start event."""

        def progressed() -> dict[str, Any] | None:
            rec = self.record()
            log = self.log()
            idx = [i for i, e in enumerate(log) if e["event"] == "start" and e["generation"] == str(rec.generation)]
            if idx and any(e["event"] == "step" and e["step"] >= log[idx[-1]]["step"] + past for e in log[idx[-1] :]):
                return log[idx[-1]]
            return None

        try:
            start: dict[str, Any] = wait_until(progressed, timeout_s, f"{past} steps of the job's generation")
            return start
        except AssertionError:
            raise AssertionError(f"job made no progress: {self.log()[-5:]} {self.tail()}") from None

    def layout(self) -> str:
        """The simulated driver's layout of GPU 0, read from a copy of its state file."""
        copy = self.base / "sim-copy.json"
        shutil.copy(self.base / "sim.json", copy)
        node = sim.install(self.spec, state_path=copy)
        try:
            layout = node.gpu(0).layout
            assert layout is not None
            return layout.spec()
        finally:
            sim.uninstall()

    def kill_ranks(self) -> None:
        kill_ranks(self.base / "journal.sqlite3", base=self.base)


def job_spec(base: Path, ranks: int, *, standby: bool = False) -> Path:
    argv = [sys.executable, f"{ROOT}/examples/hook_minimal.py", "--log", f"{base}/counter.ckpt/counter.log"]
    text = job_toml(
        "counter",
        [*argv, "--log-every", "1", "--step-time", "0.01"],
        base,
        checkpoint_dir=base / "counter.ckpt",
        ranks=(1, 2, ranks),
        hook={"ack_timeout_s": 20, "exit_timeout_s": 10, "standby": standby},
    )
    p = base / "counter.toml"
    p.write_text(text)
    p.chmod(0o644)
    return p


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="flexmig-crash-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def request_in_background(node: Node, op: str, **args: Any) -> threading.Thread:
    """Send a request whose connection dies with the actuator; the answer does not matter."""

    def go() -> None:
        with contextlib.suppress(ControlError):
            node.call(op, **args)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def check_runs_exactly_once_from_its_checkpoint(node: Node, expect_slots: list[tuple[int, int]]) -> None:
    rec = node.record()
    assert rec.state == "running", rec
    assert [s.key for s in rec.slots] == expect_slots
    start = node.wait_steps()
    live = PsutilScanner().find(rec.uid)
    assert sorted((f.generation, f.slot) for f in live) == [(rec.generation, i) for i in range(len(expect_slots))], (
        "exactly one process per rank, all of the current generation, and no standby rank left over"
    )
    assert start["resume"] == rec.resume.checkpoint and start["step"] == rec.resume.step + 1
    assert start["total"] == sum(range(start["step"])), "the checkpoint it resumed from was intact"
    gens = [e["generation"] for e in node.log() if e["event"] == "start"]
    assert len(gens) == len(set(gens)), f"a generation was launched twice: {gens}"
    assert start["visible"] in {s.uuid for s in rec.slots}, "rank 0 sees the MIG device the journal gave it"


MIGRATE_POINTS = [
    "create_instance:create:0@2:intent",
    "create_instance:create:0@3:done",
    "migrate:clear_ack:done",
    "migrate:request:intent",
    "migrate:await_ack:intent",
    "migrate:await_ack:done",
    "migrate:await_exit:done",
    "migrate:launch:intent",
    "migrate:launch:done",
    "destroy_instance:destroy:0@0:intent",
    "destroy_instance:destroy:0@1:done",
]


# A job with standby ranks has one step more, before the checkpoint request.
STANDBY_POINTS = ["migrate:standby:intent", "migrate:standby:done"]
MIGRATIONS = [(p, False) for p in MIGRATE_POINTS] + [(p, True) for p in STANDBY_POINTS + MIGRATE_POINTS]


@pytest.mark.parametrize(("kill_at", "standby"), MIGRATIONS)
def test_a_migration_killed_at_any_step_finishes_after_restart_with_the_job_running_once(
    base: Path, kill_at: str, standby: bool
) -> None:
    node = Node(base, "h200")
    try:
        node.start(kill_at)
        assert node.call("jobs.submit", path=str(job_spec(base, ranks=2, standby=standby)))["ok"]
        node.wait_steps()
        request_in_background(node, "jobs.migrate", name="counter")
        node.wait_killed()
        node.start()
        check_runs_exactly_once_from_its_checkpoint(node, [(0, 2), (0, 3)])
        node.stop()
        assert node.layout() == "1g.18gb@2+1g.18gb@3", "no instance leaked or missing"
    finally:
        node.stop()
        node.kill_ranks()


RESPLIT_IN_PLACE_POINTS = [
    "resplit:destroy:0@0:done",
    "resplit:create:0@0:intent",
    "resplit:create:0@0:done",
]


@pytest.mark.parametrize("standby", [False, True])
@pytest.mark.parametrize("kill_at", RESPLIT_IN_PLACE_POINTS)
def test_an_in_place_resplit_killed_between_destroy_and_create_recovers_its_instances(
    base: Path, kill_at: str, standby: bool
) -> None:
    # 1g@2, 1g@3 and 3g@4 leave no room elsewhere, so 2g.35gb@0 must replace the job's own 1g@0 and 1g@1 (with
    # standby too: no rank can start there before the job stops, so the request asks for it: in_place).
    node = Node(base, "h200:1g.18gb@0+1g.18gb@1+1g.18gb@2+1g.18gb@3+3g.71gb@4")
    try:
        node.start(kill_at)
        assert node.call("jobs.submit", path=str(job_spec(base, ranks=2, standby=standby)))["ok"]
        node.wait_steps()
        request_in_background(node, "jobs.resplit", name="counter", ranks=1, profile="2g.35gb", in_place=True)
        node.wait_killed()
        node.start()
        check_runs_exactly_once_from_its_checkpoint(node, [(0, 0)])
        node.stop()
        assert node.layout() == "2g.35gb@0+1g.18gb@2+1g.18gb@3+3g.71gb@4"
    finally:
        node.stop()
        node.kill_ranks()
