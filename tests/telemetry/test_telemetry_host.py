"""The host source: user, command line, cgroup, CPU and RSS of GPU processes; vanished processes are no error."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flexmig.telemetry.host import HostSource, read_cgroup


@pytest.mark.integration
def test_a_live_process_reports_user_cmdline_rss_and_cpu_from_the_second_read() -> None:
    busy = "print('ready', flush=True)\nwhile True: sum(range(10000))"
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"  # it runs Python by now
        now = [0.0]
        source = HostSource(clock=lambda: now[0])
        first = source.read([child.pid])[child.pid]
        assert first.user == getpass.getuser()
        assert first.cmdline is not None and first.cmdline[0] == sys.executable
        assert first.rss_bytes is not None and first.rss_bytes > 0
        assert first.cpu_ratio is None  # a rate needs two readings
        # let the child burn some CPU (its CPU time moves on past the first reading), then read again one (fake)
        # second later
        cpu = psutil.Process(child.pid).cpu_times
        burnt, deadline = cpu().user + cpu().system, time.monotonic() + 30
        while cpu().user + cpu().system <= burnt:
            assert time.monotonic() < deadline, "the child used no CPU time in 30 s"
            time.sleep(0.01)
        now[0] = 1.0
        second = source.read([child.pid])[child.pid]
        assert second.cpu_ratio is not None and second.cpu_ratio > 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.integration
def test_a_vanished_process_is_left_out_and_its_history_dropped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    source = HostSource()
    assert source.read([child.pid, os.getpid()]).keys() == {os.getpid()}
    assert source.errors == 0


def test_pids_that_cannot_exist_are_ignored() -> None:
    assert HostSource().read([0, -5]) == {}


def test_cgroup_prefers_the_unified_v2_line(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("12:cpu,cpuacct:/legacy/job\n0::/system.slice/train.service\n")
    assert read_cgroup(42, tmp_path) == "/system.slice/train.service"
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("4:memory:/slurm/uid_1000/job_7\n")
    assert read_cgroup(43, tmp_path) == "/slurm/uid_1000/job_7"
    assert read_cgroup(44, tmp_path) is None


def test_the_cgroup_of_this_process_is_read_from_proc() -> None:
    assert read_cgroup(os.getpid()) is not None
