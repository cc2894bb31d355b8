"""The suite's own clean-up (``support.jobs.kill_ranks``): a job left running by a test goes with its whole process
group, and nothing outside the test's directory is touched; orphans the run adopts are reaped once they exit
(``support.reaper``), and nobody else's child is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from support.jobs import kill_ranks
from support.reaper import reap_adopted_orphans
from support.wait import wait_until

pytestmark = pytest.mark.integration

# A rank that leads its own session (as the supervisor starts them) and has a child of its own (a launcher's
# worker); both sleep until killed, and the leader names the test's directory on its command line.
RANK = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(600)
"""


def _children_of(pid: int, timeout_s: float = 30) -> list[psutil.Process]:
    kids: list[psutil.Process] = wait_until(lambda: psutil.Process(pid).children(), timeout_s, "the rank's worker")
    return kids


def test_a_rank_left_running_is_killed_with_its_workers_and_a_bystander_is_not(tmp_path: Path) -> None:
    base = tmp_path / "job"
    base.mkdir()
    rank = subprocess.Popen([sys.executable, "-c", RANK, "--log", f"{base}/x.log"], start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], cwd=tmp_path)
    try:
        (worker,) = _children_of(rank.pid)
        killed = kill_ranks(base / "journal.sqlite3", base=base)  # no journal: found by the directory alone
        assert killed == [rank.pid]
        assert rank.wait(10) < 0
        worker.wait(10)  # the worker went with its group (psutil waits for a process that is not our child)
        assert bystander.poll() is None
    finally:
        for p in (rank, bystander):
            p.kill()
            p.wait(10)


def _zombie(pid: int, timeout_s: float = 30) -> None:
    wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, timeout_s, f"pid {pid} to exit")


# A parent that starts a child and exits at once, as a daemon that double-forks or an actuator killed mid-move.
ORPHANING = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
print(child.pid, flush=True)
"""


def test_an_orphan_the_run_adopted_is_reaped_after_it_exits_and_a_child_of_a_popen_keeps_its_status() -> None:
    parent = subprocess.Popen([sys.executable, "-c", ORPHANING], stdout=subprocess.PIPE, text=True)
    out, _ = parent.communicate(timeout=30)
    orphan = int(out)  # its stdin pipe closed with its parent, so it exits by itself
    own = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    _zombie(orphan)
    _zombie(own.pid)
    assert psutil.Process(orphan).ppid() == os.getpid()  # adopted: the session fixture made this a subreaper
    reaped = reap_adopted_orphans()
    assert orphan in reaped and own.pid not in reaped
    assert not psutil.pid_exists(orphan)
    assert own.wait(10) == 7  # its exit status was left to its owner
