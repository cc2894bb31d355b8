"""Job cgroups: one cgroup v2 directory per job, so that no process a job starts can leave it unseen.

A rank's process group and its environment markers (``FLEXMIG_JOB_ID``) find most of what a job starts, but a
child that calls ``setsid`` and then runs with an emptied environment (``env -i``, a double fork, a daemonising
library) is found by neither, and would run on after the job is stopped, holding its MIG device and its files. A
cgroup is different: a process is placed in its job's cgroup between ``fork`` and ``exec`` (before any of the job's
code runs), every process it starts is born there, and only a writer of another cgroup's ``cgroup.procs`` (root, not
the job's user) can move it out. The supervisor then counts what is in the cgroup: the ranks, their children, and
whatever escaped their process group, and ``cgroup.kill`` ends them all at once when the job is over.

The cgroups live under the daemon's own cgroup, in ``flexmig-jobs/job-<job ID>``. That needs a writable cgroup v2
hierarchy: root on a host or container with cgroup v2 mounted read-write, and under systemd ``Delegate=yes`` with
``ProtectControlGroups=no`` (both in the act drop-in). Without one, :func:`probe` says why in one line and
the daemon finds escaped processes by their environment only.

The rank writes ``0`` (itself) to its job's ``cgroup.procs`` through a descriptor the daemon opened as root: the
kernel checks a migration against the credentials of the file's *opener* (Linux 5.16 and the stable kernels it was
backported to), so the write succeeds after the rank has already switched to the job's user, and the descriptor is
closed at ``exec`` (``O_CLOEXEC``), so the job's code never holds it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JobCgroups", "cgroup2_root", "own_cgroup", "probe"]

BASE_NAME = "flexmig-jobs"
"""The directory under the daemon's own cgroup that holds the job cgroups."""

_PREFIX = "job-"
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_READ = 1 << 20  # a cgroup.procs listing of ~100,000 pids; more is not a job's


def cgroup2_root(mountinfo: str) -> tuple[Path, str] | None:
    """The mount point of the cgroup v2 hierarchy and the cgroup path mounted there (``/`` unless the mount shows
    only a subtree), from the text of ``/proc/self/mountinfo``; None when no cgroup2 is mounted."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep or not right.startswith("cgroup2 "):
            continue
        fields = left.split()
        if len(fields) >= 5:
            return Path(_unescape(fields[4])), _unescape(fields[3])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path (``0::<path>``) from the text of ``/proc/self/cgroup``; None without one."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::/"):
            return line[3:]
    return None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as three octal digits after a backslash."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True, slots=True)
class JobCgroups:
    """The job cgroups under ``base`` (an existing cgroup v2 directory the daemon may write)."""

    base: Path

    def path(self, job_id: str) -> Path:
        """The cgroup directory of the job whose ID (``FLEXMIG_JOB_ID``) is ``job_id``; ValueError for an ID that
        is not a plain name (a journal row is input too)."""
        if not _JOB_ID.fullmatch(job_id):
            raise ValueError(f"job ID {job_id[:80]!r} is not 1-64 letters, digits, '_' or '-'")
        return self.base / f"{_PREFIX}{job_id}"

    def open_procs(self, job_id: str) -> int:
        """Make the job's cgroup (if it is not there yet) and open its ``cgroup.procs`` for writing: the descriptor
        a rank writes ``0`` to before ``exec`` (close-on-exec; the caller closes it after the launch). OSError when
        the cgroup cannot be made or opened."""
        d = self.path(job_id)
        d.mkdir(0o755, exist_ok=True)
        return os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def pids(self, job_id: str) -> list[int]:
        """The processes in the job's cgroup now (none when it has no cgroup)."""
        try:
            fd = os.open(self.path(job_id) / "cgroup.procs", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            text = os.read(fd, _MAX_READ)
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # removed (emptied, by another look) between the open and the read
                return []
            raise
        finally:
            os.close(fd)
        return sorted(int(t) for t in text.split() if t.isdigit() and len(t) <= 10)

    def jobs(self) -> list[str]:
        """The job IDs that have a cgroup here."""
        try:
            names = [e.name for e in self.base.iterdir()]
        except FileNotFoundError:
            return []
        ids = [n[len(_PREFIX) :] for n in names if n.startswith(_PREFIX)]
        return sorted(i for i in ids if _JOB_ID.fullmatch(i))

    def kill(self, job_id: str) -> None:
        """SIGKILL every process in the job's cgroup, including any started while this runs (``cgroup.kill``,
        Linux 5.14; before it, each listed pid in turn)."""
        d = self.path(job_id)
        try:
            fd = os.open(d / "cgroup.kill", os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            for pid in self.pids(job_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return
        try:
            os.write(fd, b"1")
        except OSError as exc:
            if exc.errno != errno.ENODEV:  # ENODEV: removed since the open, so nothing is left in it to kill
                raise
        finally:
            os.close(fd)

    def remove(self, job_id: str) -> bool:
        """Remove the job's cgroup if no process is left in it; True when it is gone (or was never made)."""
        try:
            self.path(job_id).rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise
        return True


def probe() -> tuple[JobCgroups | None, str]:
    """The job cgroups this process can use, or None and the reason in a few words (for one log line at start).

    They live under this process's own cgroup v2 directory, in ``flexmig-jobs`` (made here if missing)."""
    try:
        mounted = cgroup2_root(Path("/proc/self/mountinfo").read_text())
        own = own_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return None, f"cannot read /proc/self: {exc.strerror}"
    if mounted is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if own is None:
        return None, "this process is in no cgroup v2 (/proc/self/cgroup has no 0:: line)"
    mount, mount_root = mounted
    if mount_root != "/":
        if own != mount_root and not own.startswith(mount_root.rstrip("/") + "/"):
            return None, f"its cgroup {own} is outside the cgroup2 mount at {mount} (which shows {mount_root})"
        own = own[len(mount_root.rstrip("/")) :] or "/"
    base = mount / own.lstrip("/") / BASE_NAME
    try:
        base.mkdir(0o755, exist_ok=True)
        st = os.lstat(base)
        if st.st_uid != os.geteuid():
            return None, f"{base} is owned by uid {st.st_uid}, not by this process"
        fd = os.open(base / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        os.close(fd)
    except OSError as exc:
        return None, f"{base}: {exc.strerror or exc}"
    return JobCgroups(base), ""
