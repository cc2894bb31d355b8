"""The strays watch reads the environment of new processes only, and finds what a full scan finds.

Real processes started here with flexmig's markers: one that appears after the first scan is found at the next one,
one that exits is forgotten, a process that ``exec``\\ s into a marked environment under the same PID is read again,
and a scan of a node where nothing started reads no environment at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flexmig.act.marked_scan import MarkedScan
from flexmig.act.procs import PsutilScanner
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB, ENV_JOB_ID, ENV_SLOT
from support.wait import wait_until

pytestmark = pytest.mark.integration


def _env(job_id: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", ENV_JOB: "s", ENV_JOB_ID: job_id, ENV_GENERATION: "3", ENV_SLOT: "1"}


@contextmanager
def _process(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, text=True, cwd="/")
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def _ours(scan: MarkedScan | PsutilScanner, job_id: str) -> list[tuple[int, str, int, int, str]]:
    return [(r.pid, r.job, r.generation, r.slot, r.user) for r in scan.find_marked() if r.job_id == job_id]


def test_a_new_marked_process_is_found_at_the_next_scan_and_an_exited_one_is_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scan = MarkedScan(PsutilScanner())
    read: list[int] = []
    inner_read = scan._read

    def counted(pid: int) -> object:
        read.append(pid)
        return inner_read(pid)

    monkeypatch.setattr(scan, "_read", counted)
    job_id = f"stray-scan-{os.getpid()}"
    assert _ours(scan, job_id) == []
    with _process(["/bin/sleep", "600"], _env(job_id)) as proc:
        wait_until(lambda: proc.pid in {r.pid for r in PsutilScanner().find_marked()}, 10, "the process started")
        found = _ours(scan, job_id)
        assert [f[:4] for f in found] == [(proc.pid, "s", 3, 1)]
        assert found == _ours(PsutilScanner(), job_id), "the same answer as a full scan"
        read.clear()
        known = {pid: key for pid, (key, _) in scan._seen.items()}
        assert _ours(scan, job_id) == found, "still there"
        new = {pid for pid, (key, _) in scan._seen.items() if known.get(pid) != key}
        assert proc.pid not in new
        assert sorted(read) == sorted(new), "only what started since (others share this machine)"
    assert _ours(scan, job_id) == []
    assert proc.pid not in scan._seen, "an exited process is forgotten"


def test_a_process_that_execs_into_a_marked_environment_under_the_same_pid_is_read_again() -> None:
    scan = MarkedScan(PsutilScanner())
    job_id = f"stray-exec-{os.getpid()}"
    marked = " ".join(f"{k}={v}" for k, v in _env(job_id).items())
    script = (
        "import os, sys; sys.stdin.readline(); "
        f"os.execv('/usr/bin/env', ['env', '-i', *'{marked}'.split(), '/bin/sleep', '600'])"
    )
    with _process([sys.executable, "-c", script], {"PATH": "/usr/bin:/bin"}) as proc:
        wait_until(lambda: _ours(scan, job_id) == [] and proc.pid in scan._seen, 10, "the unmarked process seen")
        assert _ours(scan, job_id) == []
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        (found,) = wait_until(lambda: _ours(scan, job_id), 10, "the process after its exec")
        assert found[:4] == (proc.pid, "s", 3, 1)
