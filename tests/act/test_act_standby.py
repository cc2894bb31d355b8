"""Standby ranks: a job with ``[hook] standby = true`` gets its next generation started on the move's targets before
the current one is asked to checkpoint, and handed the checkpoint and the world over a private channel.

The actuator runs as ``python -m flexmig.actuatord`` on a simulated node (the rig of ``test_act_crash``); the jobs
are the stdlib example and two small scripts that misbehave as a standby rank can: one whose start-up fails, one
whose current generation never acknowledges.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_act_crash import Node, check_runs_exactly_once_from_its_checkpoint, job_spec

from flexmig.act.journal import Journal
from flexmig.act.procs import PsutilScanner

pytestmark = pytest.mark.integration


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="flexmig-standby-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def steps_of_last_move(node: Node, kind: str = "migrate") -> dict[str, dict[str, object]]:
    j = Journal(node.base / "journal.sqlite3")
    try:
        (row,) = [a for a in j.recent_actions() if a.kind == kind][:1]
        return {s.name: {"state": s.state, "result": s.result, "started": s.started_s} for s in j.steps(row.id)}
    finally:
        j.close()


def test_a_standby_job_is_handed_its_checkpoint_by_ranks_started_before_the_request(base: Path) -> None:
    node = Node(base, "h200")
    try:
        node.start()
        assert node.call("jobs.submit", path=str(job_spec(base, ranks=2, standby=True)))["ok"]
        first = node.wait_steps()
        assert first["standby"] is False, "a first start has nothing to wait for"
        res = node.call("jobs.migrate", name="counter")
        assert res["ok"], res
        check_runs_exactly_once_from_its_checkpoint(node, [(0, 2), (0, 3)])
        steps = steps_of_last_move(node)
        names = list(steps)
        assert names.index("standby") < names.index("request"), "the standby starts before the checkpoint request"
        standby = steps["standby"]["result"]
        launch = steps["launch"]["result"]
        assert isinstance(standby, dict) and isinstance(launch, dict)
        assert sorted(standby["ready"]) == [0, 1], "both standby ranks said they were ready"
        assert launch["handed_over"] == [0, 1]
        assert launch["pids"] == standby["pids"], "the ranks that run are the standby ranks, not new processes"
        start = node.wait_steps()
        assert start["standby"] is True and start["pid"] == standby["pids"]["0"]
    finally:
        node.stop()
        node.kill_ranks()


FAILS_AS_STANDBY = textwrap.dedent(
    """
    import os, sys, time
    import flexmig_hook as hook
    if os.environ.get("FLEXMIG_STANDBY_FD"):
        sys.exit(3)  # its start-up fails: a bad image, a missing file
    h = hook.install()
    while not h.should_checkpoint():
        time.sleep(0.01)
    p = h.checkpoint_dir / "c.json"
    hook.atomic_write_json(p, {"step": 1})
    h.acknowledge(1, p)
    h.exit(0)
    """
)

NEVER_ACKNOWLEDGES = textwrap.dedent(
    """
    import time
    import flexmig_hook as hook
    h = hook.install()
    while True:
        time.sleep(0.01)
    """
)


def script_spec(base: Path, script: str, *, ack_timeout_s: float = 30) -> Path:
    (base / "job.py").write_text(script)
    text = textwrap.dedent(
        f"""\
        name = "counter"
        argv = ["{sys.executable}", "{base}/job.py"]
        user = "root"
        working_dir = "{base}"
        checkpoint_dir = "{base}/counter.ckpt"
        [ranks]
        min = 1
        max = 2
        start = 2
        [need]
        profile = "1g.18gb"
        [hook]
        standby = true
        ack_timeout_s = {ack_timeout_s}
        exit_timeout_s = 10
        """
    )
    p = base / "job.toml"
    p.write_text(text)
    p.chmod(0o644)
    return p


def wait_ranks(node: Node, n: int, timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = PsutilScanner().find(node.record().uid)
        if len(live) == n:
            return sorted(f.pid for f in live)
        time.sleep(0.05)
    raise AssertionError(f"the job does not run {n} ranks")


def test_a_standby_that_fails_before_it_is_ready_cancels_the_move_and_the_job_keeps_running(base: Path) -> None:
    node = Node(base, "h200")
    try:
        node.start()
        assert node.call("jobs.submit", path=str(script_spec(base, FAILS_AS_STANDBY)))["ok"]
        pids = wait_ranks(node, 2)
        res = node.call("jobs.migrate", name="counter")
        assert not res["ok"]
        (move,) = [a for a in res["actions"] if a["kind"] == "migrate"]
        assert move["outcome"] == "cancelled"
        assert "standby of job counter failed before it was ready: rank 0 exited with status 3" in move["error"]
        assert "move cancelled, the job keeps running" in move["error"]
        rec = node.record()
        assert rec.state == "running" and rec.generation == 1 and [s.key for s in rec.slots] == [(0, 0), (0, 1)]
        assert wait_ranks(node, 2) == pids, "the running generation was never asked to stop"
        node.stop()
        assert node.layout() == "1g.18gb@0+1g.18gb@1", "the targets made for the move are destroyed again"
    finally:
        node.stop()
        node.kill_ranks()


def test_a_move_cancelled_while_its_standby_waits_ends_the_standby_ranks(base: Path) -> None:
    node = Node(base, "h200")
    try:
        node.start()
        assert node.call("jobs.submit", path=str(script_spec(base, NEVER_ACKNOWLEDGES, ack_timeout_s=3)))["ok"]
        pids = wait_ranks(node, 2)
        res = node.call("jobs.migrate", name="counter")
        assert not res["ok"]
        (move,) = [a for a in res["actions"] if a["kind"] == "migrate"]
        assert move["outcome"] == "cancelled" and "did not acknowledge" in move["error"]
        standby = steps_of_last_move(node)["standby"]["result"]
        assert isinstance(standby, dict) and sorted(standby["ready"]) == [0, 1]
        for pid in standby["pids"].values():
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert wait_ranks(node, 2) == pids and node.record().generation == 1
        node.stop()
        assert node.layout() == "1g.18gb@0+1g.18gb@1"
    finally:
        node.stop()
        node.kill_ranks()


def test_an_in_place_resplit_of_a_standby_job_starts_its_rank_cold_after_the_create(base: Path) -> None:
    # No room elsewhere: 2g.35gb@0 can exist only once the job's own 1g@0 and 1g@1 are gone, so no rank can start
    # there before the checkpoint; the move runs as it would without standby (asked for: in_place).
    node = Node(base, "h200:1g.18gb@0+1g.18gb@1+1g.18gb@2+1g.18gb@3+3g.71gb@4")
    try:
        node.start()
        assert node.call("jobs.submit", path=str(job_spec(base, ranks=2, standby=True)))["ok"]
        node.wait_steps()
        assert node.call("jobs.resplit", name="counter", ranks=1, profile="2g.35gb", in_place=True)["ok"]
        check_runs_exactly_once_from_its_checkpoint(node, [(0, 0)])
        steps = steps_of_last_move(node, "resplit")
        assert "standby" not in steps
        assert node.wait_steps()["standby"] is False
    finally:
        node.stop()
        node.kill_ranks()
