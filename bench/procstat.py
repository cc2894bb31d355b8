"""What the benchmarks that start a daemon read of it: a free loopback port to serve on, and the process's CPU time
and memory from /proc (shared by ``daemon.py`` and ``sampling.py``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["free_port", "proc_cpu_s", "proc_status_bytes", "thread_cpu_s", "threads_cpu_s", "window_cpu_s"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice), for a daemon's ``--metrics-addr``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, every thread included (``/proc/PID/stat``, in clock
    ticks: threads that ended are still counted there, which the per-thread schedstat files would lose)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds thread ``tid`` of process ``pid`` has run so far (``/proc/PID/task/TID/schedstat``, in ns: exact
    where ``/proc/PID/stat``'s clock ticks would be 10 ms coarse); the main thread's TID is the process's PID."""
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9


def threads_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds each live thread of process ``pid`` has run so far, by TID (:func:`thread_cpu_s`); a thread that
    ends between the listing and its read is left out."""
    out: dict[int, float] = {}
    for entry in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(entry.name)] = thread_cpu_s(pid, int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def window_cpu_s(before: dict[int, float], after: dict[int, float]) -> float | None:
    """The CPU seconds a process ran between two :func:`threads_cpu_s` readings, ns-exact; None when a thread of the
    first ended before the second (its last slice is lost: read ``/proc/PID/stat`` instead)."""
    if any(tid not in after for tid in before):
        return None
    return sum(cpu - before.get(tid, 0.0) for tid, cpu in after.items())


def proc_status_bytes(pid: int, key: str) -> int:
    """One ``kB`` field of ``/proc/PID/status`` in bytes (``VmRSS``: resident memory now, ``VmHWM``: its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(f"{key} is not in /proc/{pid}/status")
