"""The private directories of simulated daemons (``<tmp>/flexmig-sim-*``): made with the daemon's pid inside, and
those of daemons that are gone removed at the next start.

A simulated node that was given no ``[state]`` and ``[control]`` paths keeps its journal, rank logs and control
socket in a fresh private directory (see :class:`~flexmig.service.actuator_host.ActuatorPaths`), removed at a clean
stop. A daemon killed with SIGKILL cannot remove it, so each start removes the ones left behind, only when all
of these hold:

* it is a real directory (not a symlink) named ``flexmig-sim-*``, owned by the user this daemon runs as;
* it holds the pid file its daemon wrote (a regular file of ours, a number), and no process with that pid is
  alive (a zombie counts as gone); a pid reused since only keeps the directory, which is the safe side;
* no process this daemon can inspect has a file open in it or works in it (the ranks of a job the dead daemon
  left running write their logs there).

Directories without a pid file (made by an older flexmigd, or one that is being made right now) are left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil

__all__ = ["PID_FILE", "PREFIX", "make_private_dir", "pid_alive", "remove_stale_private_dirs", "used_by_a_process"]

log = logging.getLogger(__name__)

PREFIX = "flexmig-sim-"
PID_FILE = "flexmigd.pid"
_MAX_PID_FILE_BYTES = 32


def make_private_dir(parent: Path | None = None) -> Path:
    """A fresh private directory (mode 0700) under ``parent`` (the temporary directory by default), with this
    process's pid in it."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    (path / PID_FILE).write_text(f"{os.getpid()}\n")
    return path


def pid_alive(pid: int) -> bool:
    """True while a process with ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # it exists, we may not look at it


def used_by_a_process(path: Path) -> bool:
    """True if a process we can inspect has a file open under ``path`` or works in it."""
    prefix = str(path) + os.sep
    for proc in psutil.process_iter():
        try:
            cwd = proc.cwd()
            files = proc.open_files()
        except psutil.Error:
            continue
        if (cwd + os.sep).startswith(prefix) or any(f.path.startswith(prefix) for f in files):
            return True
    return False


def _recorded_pid(directory: Path, uid: int) -> int | None:
    """The pid in ``directory``'s pid file, or None unless it is a small regular file of ``uid`` with a number."""
    pid_file = directory / PID_FILE
    try:
        st = pid_file.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > _MAX_PID_FILE_BYTES:
            return None
        text = pid_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def remove_stale_private_dirs(
    parent: Path | None = None,
    *,
    uid: int | None = None,
    alive: Callable[[int], bool] = pid_alive,
    in_use: Callable[[Path], bool] = used_by_a_process,
) -> list[Path]:
    """Remove the private directories under ``parent`` (the temporary directory by default) whose daemon is gone,
    following the rules of the module docstring; returns those removed. Never raises for what it finds there."""
    base = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    owner = os.geteuid() if uid is None else uid
    removed: list[Path] = []
    try:
        candidates = sorted(base.glob(f"{PREFIX}*"))
    except OSError:
        return removed
    for directory in candidates:
        try:
            st = directory.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner:
            continue
        pid = _recorded_pid(directory, owner)
        if pid is None or pid == os.getpid() or alive(pid) or in_use(directory):
            continue
        try:
            shutil.rmtree(directory)  # does not follow symlinks inside (fd-based on Linux)
        except OSError as exc:
            log.warning(
                "could not remove %s, left by a simulated flexmigd that is gone (pid %d): %s", directory, pid, exc
            )
            continue
        log.info("removed %s, left by a simulated flexmigd that is gone (pid %d)", directory, pid)
        removed.append(directory)
    return removed
