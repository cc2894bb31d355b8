"""The host side of GPU processes: user, command line, cgroup, CPU and resident memory, through psutil and /proc.

NVML gives a PID per MIG instance and nothing else; who runs it, in which cgroup (systemd unit, container) and
how much CPU it burns is what an operator needs to decide whether an instance may be reclaimed. Processes come
and go between the NVML read and this one, so a vanished process is an ordinary outcome (absent from the
result), never an error; a PID we may not inspect (another user's, without privileges) gives what it can.

CPU is a rate (CPU seconds over wall seconds since the previous read, in cores), so the source keeps the previous
reading per process, keyed by PID *and* start time so that a recycled PID never inherits another's history.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from flexmig.telemetry.snapshot import HostProcess

__all__ = ["HostSource", "read_cgroup"]


def read_cgroup(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The cgroup path of ``pid`` (the v2 line ``0::/...``, else the first v1 path); None if unreadable."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    first: str | None = None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        _controllers, _, path = rest.partition(":")
        if hier == "0" and _controllers == "":
            return path
        if first is None and path:
            first = path
    return first


class HostSource:
    """Reads host facts for a set of PIDs; keeps per-process CPU readings between calls (bounded by live PIDs)."""

    def __init__(self, proc_root: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic) -> None:
        self._proc_root = proc_root
        self._clock = clock
        # (pid, create_time) -> (wall time, cpu seconds); entries of processes not seen in a read are dropped
        self._cpu: dict[tuple[int, float], tuple[float, float]] = {}
        self._static: dict[tuple[int, float], tuple[str | None, tuple[str, ...] | None, str | None]] = {}
        self.errors = 0  # reads that failed for a reason other than the process having exited

    def read(self, pids: Iterable[int]) -> dict[int, HostProcess]:
        """Host facts for each live PID of ``pids``; PIDs that exited (or are not visible) are left out."""
        now = self._clock()
        out: dict[int, HostProcess] = {}
        seen: set[tuple[int, float]] = set()
        for pid in sorted(set(pids)):
            got = self._read_one(pid, now)
            if got is None:
                continue
            key, proc = got
            seen.add(key)
            out[pid] = proc
        for stale in [k for k in self._cpu if k not in seen]:
            del self._cpu[stale]
        for stale in [k for k in self._static if k not in seen]:
            del self._static[stale]
        return out

    def _read_one(self, pid: int, now: float) -> tuple[tuple[int, float], HostProcess] | None:
        if pid <= 0 or not _may_exist(pid):
            return None
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                key = (pid, proc.create_time())
                static = self._static.get(key)
                if static is None:
                    static = (_safe_user(proc), _safe_cmdline(proc), read_cgroup(pid, self._proc_root))
                    self._static[key] = static
                cpu_now: float | None
                try:
                    times = proc.cpu_times()
                    cpu_now = times.user + times.system
                except psutil.AccessDenied:
                    cpu_now = None
                rss: int | None
                try:
                    rss = int(proc.memory_info().rss)
                except psutil.AccessDenied:
                    rss = None
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        except psutil.AccessDenied:
            # Not even the start time: we cannot key its history safely, so report the bare PID.
            return (pid, -1.0), HostProcess(pid, None, None, read_cgroup(pid, self._proc_root), None, None)
        except OSError:
            self.errors += 1
            return None
        ratio: float | None = None
        if cpu_now is not None:
            before = self._cpu.get(key)
            if before is not None and now > before[0]:
                ratio = max(0.0, (cpu_now - before[1]) / (now - before[0]))
            self._cpu[key] = (now, cpu_now)
        user, cmdline, cgroup = static
        return key, HostProcess(pid, user, cmdline, cgroup, ratio, rss)


def _may_exist(pid: int) -> bool:
    """False when no process ``pid`` is visible here (no ``/proc/PID``: it exited, it lives in another PID namespace,
    or it is above ``pid_max``): one ``stat``, where psutil would build a Process and read its ``stat`` file to say
    NoSuchProcess (about ten times the CPU, paid at every sweep for every such PID)."""
    try:
        os.stat(f"{psutil.PROCFS_PATH}/{pid}")  # noqa: PTH116  # a Path would cost as much again, per PID and sweep
    except FileNotFoundError:
        return False
    except OSError:
        return True  # psutil will say what is wrong
    return True


def _safe_user(proc: psutil.Process) -> str | None:
    try:
        return str(proc.username())
    except (psutil.AccessDenied, KeyError):
        # KeyError: a UID with no passwd entry (a container's user); fall back to the number.
        try:
            return str(proc.uids().real)
        except psutil.AccessDenied:
            return None


def _safe_cmdline(proc: psutil.Process) -> tuple[str, ...] | None:
    try:
        return tuple(proc.cmdline())
    except psutil.AccessDenied:
        return None
