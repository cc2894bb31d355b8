"""Stopping a process a test started: SIGTERM, a bounded wait, then SIGKILL (one helper for every rig)."""

from __future__ import annotations

import subprocess

__all__ = ["stop_process"]


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float, *, kill_wait_s: float = 10.0) -> int | None:
    """SIGTERM ``proc`` (if it still runs) and wait up to ``timeout_s``; past that SIGKILL it and wait up to
    ``kill_wait_s``. Its exit status (None for no process)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(kill_wait_s)
    return proc.returncode
