"""A job's processes beyond its ranks: placing the ranks in the job's cgroup, and ending what the job leaves
behind (process trees, its cgroup, its log writers, signals to processes that may be gone already).

Helpers of :class:`flexmig.act.supervisor.Supervisor`: a process that is not the supervisor's child gives no event
at its end, so these check that a pid is still the very process (its start time) before signalling it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from flexmig.act.jobcgroups import JobCgroups, own_cgroup
from flexmig.act.procs import FoundRank, RankProcess, process_alive
from flexmig.act.ranklogs import log_writer_generation
from flexmig.act.records import JobRecord

__all__ = [
    "check_placed",
    "clear_cgroup",
    "kill_group",
    "open_procs",
    "outlives",
    "signal_found",
    "signal_pid",
    "trees",
    "writers_in",
]

log = logging.getLogger("flexmig.act.supervisor")


def open_procs(cgroups: JobCgroups, rec: JobRecord) -> int | None:
    """The job's ``cgroup.procs`` open for writing, or None when that fails (one warning)."""
    try:
        return cgroups.open_procs(rec.uid)
    except (OSError, ValueError) as exc:
        log.warning(
            "job %s: no cgroup of its own (%s): processes that leave its ranks' process groups are found by "
            "their environment only", rec.name, exc,
        )  # fmt: skip
        return None


def check_placed(rec: JobRecord, cgroups: JobCgroups, started: Iterable[tuple[int, int]]) -> None:
    """Warn about a rank (slot, pid) that did not land in its job's cgroup (its write before ``exec`` failed)."""
    want = "/" + cgroups.path(rec.uid).name
    for slot, pid in started:
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue  # it has exited already; its exit is reported as usual
        where = own_cgroup(text)
        if where is not None and not where.endswith(want):
            log.warning(
                "job %s: rank %d (pid %d) is in cgroup %s, not in its job's (%s): processes it starts and that "
                "leave its process group are found by their environment only",
                rec.name, slot, pid, where, cgroups.path(rec.uid),
            )  # fmt: skip


def trees(pids: Iterable[int]) -> set[int]:
    """``pids`` and all their descendants (a standby generation's ranks are the job's next ranks, not strays)."""
    out: set[int] = set()
    for pid in pids:
        out.add(pid)
        with contextlib.suppress(psutil.Error):
            out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    return out


def clear_cgroup(cgroups: JobCgroups, uid: str, wait_s: float) -> None:
    """End what is left in the job's cgroup (``cgroup.kill``) and remove it, waiting at most ``wait_s`` for its
    processes to be gone; a cgroup not yet empty then stays (the next start's reconciliation removes it)."""
    try:
        if cgroups.pids(uid):
            cgroups.kill(uid)
        deadline = time.monotonic() + wait_s
        while not cgroups.remove(uid) and time.monotonic() < deadline:
            time.sleep(0.01)  # no event tells a worker thread that the kernel has finished the kill
    except (OSError, ValueError) as exc:
        log.warning("job cgroup %s: %s", uid, exc)


def writers_in(cgroups: JobCgroups, uid: str) -> dict[tuple[int, float], int]:
    """The log writers in job ``uid``'s cgroup (pid and start time), with the generation each writes for."""
    out = {}
    for pid in cgroups.pids(uid):
        gen = log_writer_generation(pid)
        if gen is None:
            continue
        with contextlib.suppress(psutil.Error):
            out[(pid, psutil.Process(pid).create_time())] = gen
    return out


async def outlives(procs: list[tuple[int, float]], grace_s: float) -> bool:
    """Wait at most ``grace_s`` for ``procs`` (pid, start time) to end; True when one of them still runs then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while any(process_alive(*p) for p in procs):  # no event tells the end of a process that is not our child
        if loop.time() >= deadline:
            return True
        await asyncio.sleep(0.01)  # a writer whose pipe has ended exits within milliseconds: a move waits for it
    return False


def signal_pid(proc: tuple[int, float], sig: int) -> None:
    """Signal process ``proc`` (pid, start time) if it is still that very process."""
    if process_alive(*proc):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc[0], sig)


def signal_found(found: FoundRank, sig: int) -> None:
    """Signal a process found by scanning, if it is still that very process (not a later one with its pid)."""
    if process_alive(found.pid, found.create_time):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(found.pid, sig)


def kill_group(proc: RankProcess, sig: int) -> None:
    """Signal the rank's process group (its session: the rank and whatever it started)."""
    if proc.finished():
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)
