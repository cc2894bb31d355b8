"""Which processes are really a job's ranks: what the kernel says about a process, never what it says itself.

A restarted daemon finds a job's ranks by the markers in their environment (``FLEXMIG_JOB_ID``, ``_GENERATION``,
``_SLOT``), but anyone may start a process with any environment, and a job's ID is no secret (it is in
``/proc/PID/cgroup`` for all to read). A decoy of another user carrying a job's markers, adopted in place of the
real rank, made the daemon take its exit for the rank's and kill the real rank as a stray. So a found process counts
as the job's only when

* its real user is the job's (the ranks are launched as the spec's user, who cannot change that back);
* it lies in the job's cgroup, when the job has one with anything in it (only root moves a process into it);
* for adoption, when the journal remembers which process was launched for the slot (its pid, start time and user:
  :meth:`flexmig.act.journal.Journal.record_ranks`), it is that very process.

What fails these is never adopted, never signalled by the daemon, and reported as an unknown rank.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterable, Mapping

import psutil

from flexmig.act.jobcgroups import JobCgroups
from flexmig.act.journal import RankRecord
from flexmig.act.procs import FoundRank
from flexmig.act.records import JobRecord

__all__ = ["NOBODY", "cgroup_members", "genuine", "job_owner", "rank_records"]

NOBODY = -2
"""The owner of a job whose user does not exist (any more): no process matches it."""

_SAME_START_S = 0.01  # psutil's create_time of one process read twice agrees to well within this


def job_owner(rec: JobRecord) -> int:
    """The real user ID the ranks of ``rec`` run as: the spec's user when the daemon is root (it switches to
    them), else the daemon's own (it cannot switch). :data:`NOBODY` for a user that does not exist."""
    if os.geteuid() != 0:
        return os.geteuid()
    try:
        return pwd.getpwnam(rec.spec.user).pw_uid
    except KeyError:
        return NOBODY


def cgroup_members(cgroups: JobCgroups | None, job_uid: str) -> set[int] | None:
    """The pids in the job's cgroup, or None when there is nothing to judge by (no job cgroups on this system, no
    cgroup for this job, or an empty one: a job launched before its cgroup could be made)."""
    if cgroups is None:
        return None
    try:
        pids = set(cgroups.pids(job_uid))
    except (OSError, ValueError):
        return None
    return pids or None


def genuine(
    found: Iterable[FoundRank],
    rec: JobRecord,
    cgroups: JobCgroups | None,
    recorded: Mapping[int, RankRecord] | None = None,
) -> list[FoundRank]:
    """The processes of ``found`` (scanned by ``rec``'s ID) that really are ``rec``'s: of its user, in its cgroup
    when it has one, and, for the slots of ``recorded`` (the journal's ranks of ``rec.generation``), the very
    process launched there. The rest say they are the job's and are not."""
    owner = job_owner(rec)
    members = cgroup_members(cgroups, rec.uid)
    out = []
    for f in found:
        if f.uid != owner or (members is not None and f.pid not in members):
            continue
        known = (recorded or {}).get(f.slot) if f.generation == rec.generation else None
        if known is not None and (
            known.pid != f.pid or known.uid != f.uid or abs(known.started - f.create_time) > _SAME_START_S
        ):
            continue
        out.append(f)
    return out


def rank_records(pids: Mapping[int, int]) -> dict[int, RankRecord]:
    """For ``pids`` (slot to pid of a job's running ranks), what the journal keeps to know them again: start time
    and real user, read from the kernel now (a rank that has exited already is left out)."""
    out = {}
    for slot, pid in pids.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            with p.oneshot():
                out[slot] = RankRecord(pid, p.create_time(), p.uids().real)
    return out
