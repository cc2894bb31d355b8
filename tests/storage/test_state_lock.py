"""Two daemons never share a state directory, nor a node: the second is refused, naming the first one's pid.

Real flexmigd processes on a simulated node: the first runs; a second on the same state directory (or, with its
own state directory, on the same simulated node's state file) exits at once with one line naming the state
directory (or the node) and the pid of the daemon that holds it, and changes nothing: the first keeps running,
its journal and its ranks untouched. The lock goes with its holder, however it ends (SIGKILL included).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.errors import StateInUseError
from flexmig.storage import DirectoryLock, LockSet
from support.flexmigd import ActNode, act_node, short_base
from support.wait import free_port, wait_for_file

SIM = "h200x1:1g.18gb@0+1g.18gb@1"


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base("fm-lock-") as d:
        yield d


def second_daemon(
    config: Path, sim_state: Path, timeout_s: float = 60.0, spec: str = SIM
) -> subprocess.CompletedProcess[str]:
    """Start another flexmigd on ``config`` and ``sim_state``; it is expected to refuse and exit."""
    argv = [
        sys.executable, "-m", "flexmig.daemon", "--sim", spec, "--sim-state", str(sim_state),
        "--config", str(config), "--metrics-addr", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, check=False, env={**os.environ, "NOTIFY_SOCKET": ""}
    )


@pytest.mark.integration
def test_a_second_daemon_on_the_same_state_directory_is_refused_naming_the_first_ones_pid(base: Path) -> None:
    with act_node(base, SIM, mode="advise") as first:
        assert first.proc is not None
        before = first.journal.read_bytes()
        out = second_daemon(first.config, base / "other-sim.json")
        assert out.returncode != 0
        (line,) = [x for x in out.stderr.splitlines() if "in use by another flexmigd" in x]
        assert f"state directory {first.journal.parent} is in use by another flexmigd (pid {first.proc.pid}" in line
        assert "Traceback" not in out.stderr
        assert first.proc.poll() is None, "the first daemon keeps running"
        assert first.journal.read_bytes() == before
        assert first.cli_json("status")["mode"] == "advise"


@pytest.mark.integration
def test_a_second_daemon_on_the_same_simulated_node_is_refused_even_with_its_own_state(base: Path) -> None:
    with act_node(base, SIM) as first:
        assert first.proc is not None
        other = ActNode(base / "two", SIM)
        other.base.mkdir()
        other.write_config()
        # The first daemon saves its node after every change of its own: stopped while the second one runs, any
        # change to the file can only be the second's. A stopped process keeps its locks.
        os.kill(first.proc.pid, signal.SIGSTOP)
        try:
            truth = first.sim_state.read_bytes()
            out = second_daemon(other.config, first.sim_state)
            after = first.sim_state.read_bytes()
        finally:
            os.kill(first.proc.pid, signal.SIGCONT)
        assert out.returncode != 0
        assert f"simulated node {first.sim_state} is in use by another flexmigd (pid {first.proc.pid}" in out.stderr
        assert after == truth, "the second daemon wrote nothing into the node's state"
        assert not other.journal.exists()
        assert first.proc.poll() is None


@pytest.mark.integration
def test_the_lock_goes_with_a_daemon_killed_by_sigkill(base: Path) -> None:
    node = ActNode(base, SIM, mode="observe")
    try:
        node.start()
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(30)
        node.start()  # the same state directory and node, at once
        assert node.cli_json("status")["mode"] == "observe"
        assert node.stop() == 0
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(30)


def test_a_held_lock_names_its_holder_and_taking_it_twice_in_one_daemon_only_counts(tmp_path: Path) -> None:
    locks = LockSet()
    key = locks.take_dir(tmp_path, "state directory")
    again = locks.take_dir(tmp_path, "state directory")  # the journal and the outbox in one directory
    assert key == again and locks.held() == [key]
    with pytest.raises(StateInUseError, match=rf"state directory {tmp_path} is in use .*pid {os.getpid()}"):
        DirectoryLock.acquire(key, f"state directory {tmp_path}")  # another holder, here another open file
    locks.drop(key)
    assert locks.held() == [key]
    locks.drop(key)
    assert locks.held() == []
    DirectoryLock.acquire(key, "state directory").release()


def test_a_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "flexmigd.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Exception, match=r"lock file .*flexmigd.lock: refused: it is a symlink"):
        LockSet().take_dir(tmp_path, "state directory")


@pytest.mark.integration
def test_the_holder_is_found_in_proc_locks_when_its_pid_is_not_in_the_file(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            wait_for_file(lock, what="the lock to show")
            with pytest.raises(StateInUseError, match=rf"pid {holder.pid}, lock {lock}"):
                DirectoryLock.acquire(lock, "the test's lock")
        finally:
            holder.kill()
