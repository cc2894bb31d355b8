"""Reading each process's job markers once: :class:`MarkedScan`, the executor's default process scanner.

A process's markers are fixed when it starts (``exec`` gives a new environment and a new name), so a process already
read under the same PID, start time and name is not read again, and exited ones are forgotten. On a node with
thousands of processes that turns a scan of every environment (the strays watch looks every planning interval) into
one of ``/proc``'s listing.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from flexmig.act.procs import FoundRank, MarkedRank, ProcessScanner
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB, ENV_JOB_ID, ENV_SLOT

__all__ = ["MarkedScan"]

_Key = tuple[str, str]
"""What tells one process from the next under the same PID: its start time (clock ticks since boot, as
``/proc/PID/stat`` writes it) and its name (``exec`` changes it)."""
_PROC = "/proc"
_STARTTIME = 19  # field 22 of /proc/PID/stat, counted from the state (field 3), the first after the name
_ENVIRON_MAX = 1 << 20  # more than any environment the kernel lets a process start with (ARG_MAX is 2 MiB with argv)


@dataclass(frozen=True, slots=True)
class _Markers:
    """The job markers of one process's environment, as :meth:`PsutilScanner.find_marked` reads them."""

    job_id: str
    job: str
    generation: int
    slot: int
    device: str


class MarkedScan:
    """:meth:`~flexmig.act.procs.ProcessScanner.find_marked` that reads each process's environment once.

    Same answer as :class:`~flexmig.act.procs.PsutilScanner` (the user and the parent, which can change, are read
    every time); :meth:`find` and :meth:`find_all` go to the scanner it wraps unchanged.
    """

    def __init__(self, inner: ProcessScanner) -> None:
        self.inner = inner
        self._seen: dict[int, tuple[_Key, _Markers | None]] = {}
        """PID -> (start time, name) and its markers (None: none, or an environment this process may not read)."""

    def find(self, job_uid: str) -> list[FoundRank]:
        """See :class:`~flexmig.act.procs.ProcessScanner`."""
        return self.inner.find(job_uid)

    def find_all(self, job_uid: str) -> list[FoundRank]:
        """See :class:`~flexmig.act.procs.ProcessScanner`."""
        return self.inner.find_all(job_uid)

    def find_marked(self) -> list[MarkedRank]:
        """See :class:`~flexmig.act.procs.ProcessScanner`; environments of processes read before are not read again."""
        seen: dict[int, tuple[_Key, _Markers | None]] = {}
        found: dict[int, MarkedRank] = {}
        parents: dict[int, int] = {}
        for pid in psutil.pids():
            stat = _stat(pid)
            if stat is None:
                continue  # exited meanwhile, or a zombie
            key, ppid = stat
            known = self._seen.get(pid)
            markers = known[1] if known is not None and known[0] == key else self._read(pid)
            seen[pid] = (key, markers)
            if markers is not None:
                found[pid] = MarkedRank(pid, markers.job_id, markers.job, markers.generation, markers.slot,
                                        markers.device, _username(pid))  # fmt: skip
                parents[pid] = ppid
        self._seen = seen  # exited processes are forgotten
        tops = [r for pid, r in found.items() if parents[pid] not in found]  # a job's children inherit its markers
        return sorted(tops, key=lambda r: r.pid)

    def _read(self, pid: int) -> _Markers | None:
        """The markers of process ``pid``'s environment (None: it has none, or it may not be read: another user's
        without root, one that exited; the last is forgotten at the next scan, as it is no longer listed)."""
        try:
            with open(f"{_PROC}/{pid}/environ", "rb") as f:  # noqa: PTH123 - /proc, read as psutil does
                data = f.read(_ENVIRON_MAX)
        except OSError:
            return None
        env = {}
        for entry in data.decode("utf-8", "surrogateescape").split("\0"):
            k, sep, v = entry.partition("=")
            if sep:
                env[k] = v
        job_id = env.get(ENV_JOB_ID)
        if not job_id:
            return None
        return _Markers(job_id[:64], env.get(ENV_JOB, "")[:64], _marker(env.get(ENV_GENERATION, "")),
                        _marker(env.get(ENV_SLOT, "")), env.get("CUDA_VISIBLE_DEVICES", "")[:128])  # fmt: skip


def _stat(pid: int) -> tuple[_Key, int] | None:
    """``((start time, name), parent)`` of process ``pid`` from ``/proc/PID/stat`` (None: gone, or a zombie)."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:  # noqa: PTH123 - /proc, one read
            text = f.read().decode("utf-8", "surrogateescape")
    except OSError:
        return None
    head, _, rest = text.rpartition(")")  # the name may hold spaces and parentheses: it ends at the last ")"
    fields = rest.split()
    if len(fields) < _STARTTIME + 1 or fields[0] == "Z":
        return None
    return (fields[_STARTTIME], head.partition("(")[2]), int(fields[1])


def _username(pid: int) -> str:
    """The user of a marked process, read every scan (a process may change it); empty when it cannot be read."""
    try:
        return str(psutil.Process(pid).username() or "")
    except (psutil.Error, OSError, KeyError):
        return ""


def _marker(text: str) -> int:
    """A number marker (generation, slot), -1 unless it is 1-9 ASCII digits (anyone may set any environment)."""
    return int(text) if 0 < len(text) <= 9 and text.isascii() and text.isdigit() else -1
