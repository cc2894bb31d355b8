"""Anyone may start a process with any environment, flexmig's markers included: whatever they hold, scanning the
process table for ranks reads them as numbers of 1-9 ASCII digits or as -1, and never raises (``int()`` of 5,000
digits raised ValueError out of the scan for ranks of no journalled job). A real process with hostile markers."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from flexmig.act.procs import PsutilScanner
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB_ID, ENV_SLOT

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("generation", "slot"), [("9" * 5000, "²"), ("-3", "0x1"), ("", " 1"), ("1" * 10, "٣")])
def test_hostile_markers_read_as_minus_one_and_the_scan_goes_on(generation: str, slot: str) -> None:
    job_id = f"marker-test-{uuid.uuid4().hex}"
    env = {**os.environ, ENV_JOB_ID: job_id, ENV_GENERATION: generation, ENV_SLOT: slot}
    with subprocess.Popen(["/bin/sleep", "60"], env=env) as proc:
        try:
            scanner = PsutilScanner()
            (marked,) = [r for r in scanner.find_marked() if r.job_id == job_id]
            assert (marked.pid, marked.generation, marked.slot) == (proc.pid, -1, -1)
            assert [(f.pid, f.generation, f.slot) for f in scanner.find(job_id)] == [(proc.pid, -1, -1)]
            assert [f.pid for f in scanner.find_all(job_id)] == [proc.pid]
        finally:
            proc.kill()
