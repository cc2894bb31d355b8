"""What mode act does to processes, tried under a given capability set (``setpriv --bounding-set=...``).

Run as ``python -m support.act_privileges WORKDIR`` as root with the capabilities of a unit: it launches a rank as
the user ``nobody`` through the daemon's own launcher (CAP_SETUID, CAP_SETGID), finds it again by the job ID in its
environment as a restarted daemon does (reading another user's ``/proc/PID/environ``), and signals it (CAP_KILL).
It prints one JSON object with what worked and each error; tests/systemd/test_systemd_unit.py reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import signal
import sys
import time
from pathlib import Path

from flexmig.act.procs import LaunchRequest, PsutilScanner, SubprocessLauncher
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB_ID, ENV_SLOT

JOB_ID = "privilege-probe"


async def probe(workdir: Path) -> dict[str, object]:
    """Launch, find, signal: each step's outcome (True, or the error as text)."""
    nobody = pwd.getpwnam("nobody")
    out: dict[str, object] = {}
    req = LaunchRequest(
        argv=("/bin/sleep", "60"),
        env={"PATH": "/usr/bin:/bin", ENV_JOB_ID: f"{JOB_ID}-{os.getpid()}", ENV_GENERATION: "1", ENV_SLOT: "0"},
        cwd=Path("/"),
        log_path=workdir / "rank.log",
        uid=nobody.pw_uid,
        gid=nobody.pw_gid,
        groups=(),
    )
    try:
        rank = await SubprocessLauncher().launch(req)
    except OSError as exc:
        out["launch"] = f"{type(exc).__name__}: {exc}"
        return out
    out["launch"] = True
    pid = rank.pid
    try:
        deadline = time.monotonic() + 10
        found: list[int] = []
        while time.monotonic() < deadline and not found:
            found = [f.pid for f in PsutilScanner().find(f"{JOB_ID}-{os.getpid()}")]
            if not found:
                await asyncio.sleep(0.1)
        out["find"] = found == [pid] or f"found {found}, launched {pid}"
        try:
            os.kill(pid, signal.SIGTERM)
            out["signal"] = True
        except OSError as exc:
            out["signal"] = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(OSError):  # the rank sleeps 60 s and ends by itself where this is not allowed
            os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(rank.wait(), 70)
    return out


def main() -> int:
    """Print the probe's findings as JSON."""
    print(json.dumps(asyncio.run(probe(Path(sys.argv[1])))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
