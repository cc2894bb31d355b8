"""The processes and ports of the Slurm testbed (:mod:`flexmig.slurm.testbed`): the binaries it needs, free
loopback ports, stopping a daemon by its pid, and the Python every job's user may run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from flexmig.errors import SlurmError
from flexmig.slurm.client import SlurmCommands

__all__ = [
    "DEBIAN_PACKAGES",
    "alive",
    "check_reachable",
    "free_port",
    "free_ports",
    "job_python",
    "missing_binaries",
    "pid_from",
    "python",
    "slurmd_version",
    "stop_pid",
]

DEBIAN_PACKAGES = "slurmctld slurmd slurm-client munge"
_BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "squeue", "sinfo", "sbatch", "scancel")
_STOP_TIMEOUT_S = 15.0


def missing_binaries(commands: SlurmCommands | None = None) -> list[str]:
    """The daemons and commands a testbed needs that are not installed."""
    cmds = commands or SlurmCommands()
    out = []
    for name in _BINARIES:
        try:
            cmds.path(name)
        except SlurmError:
            out.append(name)
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (where :func:`free_port` and outgoing connections get theirs)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, tries: int = 50) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 now (one slurmd per GPU or instance node).

    Taken below the kernel's ephemeral range where it leaves room: the slurmds bind them only later, and a port of
    that range could meanwhile be handed to another server's :func:`free_port` (a metrics endpoint, a broker)."""
    low, high = 10000, _ephemeral_low() - count
    for _ in range(tries):
        base = low + secrets.randbelow(high - low) if high - low > 1000 else free_port()
        if base + count > 65535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise SlurmError(f"found no {count} consecutive free ports on 127.0.0.1")


def check_reachable(path: Path, user: str) -> None:
    """Every directory above ``path`` must let ``user`` (munge) through."""
    for parent in [path, *path.parents]:
        st = parent.stat()
        if not st.st_mode & stat.S_IXOTH:
            raise SlurmError(
                f"{parent} (mode {stat.S_IMODE(st.st_mode):o}) is not searchable by others: munged runs as "
                f"user {user} and must reach {path}; use a directory under /tmp or /var/tmp"
            )


def pid_from(path: Path) -> int | None:
    """The pid in pid file ``path``, None when there is none."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # noqa: PTH123 - a zombie still has a pid: read its state
            state = f.read().rsplit(b")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def stop_pid(pid: int, timeout_s: float = _STOP_TIMEOUT_S) -> None:
    """SIGTERM ``pid``, SIGKILL after ``timeout_s``; wait until it is gone (reaping it if it is our child)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def python() -> str:
    """The interpreter the testbed's own commands run with (root's: this one)."""
    return sys.executable or shutil.which("python3") or "/usr/bin/python3"


def _others_may_run(path: Path) -> bool:
    """Any user may execute ``path``: every directory on the way searchable by others, the file executable by them."""
    try:
        if not path.stat().st_mode & stat.S_IXOTH:
            return False
        return all(d.stat().st_mode & stat.S_IXOTH for d in path.parents)
    except OSError:
        return False


def job_python() -> str:
    """An interpreter every job's user may run, for the TaskProlog (standard library only: any Python 3.8 or later
    does): this one's own executable where others may run it (a virtual environment's link resolved), else the
    system's ``python3``. A Python installed under /root (pyenv, a virtual environment) cannot run a job of another
    user: the TaskProlog would exit 127 and every task of an ordinary user would start without its GPU."""
    candidates = [Path(os.path.realpath(sys.executable))] if sys.executable else []
    candidates += [Path("/usr/bin/python3"), Path("/usr/local/bin/python3")]
    found = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    candidates += [Path(os.path.realpath(found))] if found else []
    for candidate in candidates:
        if _others_may_run(candidate):
            return str(candidate)
    raise SlurmError(
        f"no Python that the jobs' users may run for the TaskProlog (tried {', '.join(map(str, candidates))}: each "
        "lies where others may not search or is not executable by them); install the system's python3 "
        "(Debian: apt-get install python3-minimal)"
    )


def slurmd_version(commands: SlurmCommands) -> str:
    """What ``slurmd -V`` prints (``slurm-wlm 22.05.8``; slurmd needs no slurm.conf for it); SlurmError when it
    cannot run."""
    try:
        res = subprocess.run(
            [commands.path("slurmd"), "-V"], capture_output=True, text=True, timeout=60, check=False,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"slurmd -V: {exc}") from None
    if res.returncode != 0:
        raise SlurmError(f"slurmd -V exited {res.returncode}: {(res.stderr or res.stdout).strip()[-200:]}")
    return res.stdout.strip()
