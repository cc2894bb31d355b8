"""The private directories of simulated daemons: one killed with SIGKILL leaves its ``flexmig-sim-*`` behind, and
the next start removes it; anything that may still be in use, or is not ours, is left alone.

Liveness is real: the pids are those of processes this test starts and ends (or keeps running).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.service.simdirs import PID_FILE, PREFIX, make_private_dir, remove_stale_private_dirs
from support.flexmigd import short_base
from support.wait import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    return proc.pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(SLEEPER)
    yield proc
    proc.kill()
    proc.wait(30)


def left_by(parent: Path, pid: int, name: str = "x") -> Path:
    """A private directory as a daemon with ``pid`` leaves it: its pid file, a journal, a rank log."""
    d = parent / f"{PREFIX}{name}"
    (d / "logs").mkdir(parents=True)
    d.chmod(0o700)
    (d / PID_FILE).write_text(f"{pid}\n")
    (d / "journal.sqlite3").write_bytes(b"")
    (d / "logs" / "g0001-r0.log").write_text("rank output\n")
    return d


def test_a_new_private_directory_holds_this_process_pid_and_is_private(tmp_path: Path) -> None:
    d = make_private_dir(tmp_path)
    assert d.name.startswith(PREFIX) and (d.stat().st_mode & 0o777) == 0o700
    assert (d / PID_FILE).read_text() == f"{os.getpid()}\n"


@pytest.mark.integration
def test_the_directory_of_a_daemon_that_is_gone_is_removed(tmp_path: Path, dead_pid: int) -> None:
    d = left_by(tmp_path, dead_pid)
    assert remove_stale_private_dirs(tmp_path) == [d]
    assert not d.exists()


@pytest.mark.integration
def test_the_directory_of_a_live_process_is_kept(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    d = left_by(tmp_path, sleeper.pid)
    own = left_by(tmp_path, os.getpid(), "own")
    assert remove_stale_private_dirs(tmp_path) == []
    assert d.exists() and own.exists()


@pytest.mark.integration
def test_a_directory_a_live_rank_still_writes_in_is_kept(tmp_path: Path, dead_pid: int) -> None:
    d = left_by(tmp_path, dead_pid)
    with (d / "logs" / "g0001-r0.log").open("ab") as log:
        rank = subprocess.Popen(SLEEPER, stdout=log, stderr=log)
    try:
        assert remove_stale_private_dirs(tmp_path) == []
        assert d.exists()
    finally:
        rank.kill()
        rank.wait(30)
    assert remove_stale_private_dirs(tmp_path) == [d]  # once the rank is gone


@pytest.mark.integration
def test_a_process_working_in_the_directory_keeps_it(tmp_path: Path, dead_pid: int) -> None:
    d = left_by(tmp_path, dead_pid)
    worker = subprocess.Popen(SLEEPER, cwd=d)
    try:
        assert remove_stale_private_dirs(tmp_path) == []
    finally:
        worker.kill()
        worker.wait(30)


@pytest.mark.parametrize("content", ["", "not a pid\n", "0\n", "-5\n", "1" * 64])
def test_a_directory_without_a_readable_pid_is_kept(tmp_path: Path, content: str) -> None:
    d = left_by(tmp_path, 1)
    (d / PID_FILE).write_text(content)
    assert remove_stale_private_dirs(tmp_path) == []
    assert d.exists()


@pytest.mark.integration
def test_a_directory_without_a_pid_file_is_kept(tmp_path: Path, dead_pid: int) -> None:
    d = left_by(tmp_path, dead_pid)
    (d / PID_FILE).unlink()
    assert remove_stale_private_dirs(tmp_path) == []


@pytest.mark.integration
def test_a_symlink_is_never_followed(tmp_path: Path, dead_pid: int) -> None:
    target = left_by(tmp_path / "elsewhere", dead_pid, "target")
    link = tmp_path / f"{PREFIX}link"
    link.symlink_to(target)
    pid_link_dir = left_by(tmp_path, dead_pid, "pidlink")
    (pid_link_dir / PID_FILE).unlink()
    (pid_link_dir / PID_FILE).symlink_to(target / PID_FILE)
    assert remove_stale_private_dirs(tmp_path) == []
    assert target.exists() and link.is_symlink() and pid_link_dir.exists()


def test_other_files_named_like_it_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / f"{PREFIX}file").write_text("123\n")
    (tmp_path / "not-flexmig-sim-x").mkdir()
    assert remove_stale_private_dirs(tmp_path) == []


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_another_users_directory_is_kept(tmp_path: Path, dead_pid: int) -> None:
    d = left_by(tmp_path, dead_pid)
    os.chown(d, 65534, 65534)
    os.chown(d / PID_FILE, 65534, 65534)
    assert remove_stale_private_dirs(tmp_path) == []
    assert d.exists()


# ------------------------------------------------------------------------------------------------- flexmigd


def private_dir_in(log: Path) -> Path | None:
    for line in log.read_text(errors="replace").splitlines():
        if "journal, rank logs and control socket under " in line:
            return Path(line.rsplit(" under ", 1)[1].strip())
    return None


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_flexmigd_removes_the_directory_a_sigkilled_simulated_daemon_left() -> None:
    with short_base() as tmp:
        env = {**os.environ, "TMPDIR": str(tmp), "NOTIFY_SOCKET": ""}
        config = tmp / "flexmig.toml"
        config.write_text("[prometheus]\nenabled = false\n")
        config.chmod(0o600)
        argv = [sys.executable, "-m", "flexmig.daemon", "--sim", "h200", "--config", str(config)]

        def start(name: str) -> tuple[subprocess.Popen[bytes], Path]:
            log = tmp / name
            with log.open("wb") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
            wait_until(lambda: private_dir_in(log), what=f"{name}: its private directory")
            wait_until(lambda: " up: 1 GPU(s)" in log.read_text(), what=f"{name}: up")
            return proc, private_dir_in(log)  # type: ignore[return-value]

        first, first_dir = start("first.log")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        assert first_dir.exists(), "SIGKILL leaves it behind"
        second, second_dir = start("second.log")
        try:
            assert not first_dir.exists()
            assert (
                f"removed {first_dir}, left by a simulated flexmigd that is gone (pid {first.pid})"
                in (tmp / "second.log").read_text()
            )
            assert second_dir.exists() and second_dir != first_dir
        finally:
            second.send_signal(signal.SIGTERM)
            rc = second.wait(60)
        assert rc == 0 and not second_dir.exists()  # a clean stop removes its own
