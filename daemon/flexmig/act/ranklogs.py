"""Rank logs, the daemon's side: the pipe a rank writes to, the log writer process that reads it
(:mod:`flexmig.act.logpump`), and the removal of old generations' logs.

``STATE_DIR/logs/NAME/`` holds job ``NAME``'s logs, ``gGENERATION-rSLOT.log`` per rank (``.1``, ``.2``... rotated).
The directory is the daemon's (mode 0700, made and opened without following links); each file is handed to the
job's user where the daemon may ``chown``, so quotas count it. Bounds: ``jobs.rank_log_max_bytes`` per file and
``jobs.rank_log_keep`` rotated files per rank and earlier generations per job, so a job's output takes at most
``(keep + 1)² × max_bytes`` per rank slot however long it runs and however often it moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil

from flexmig.act.userpaths import UserPathError, ensure_dir, opened_dir

__all__ = ["DEFAULT_RANK_LOGS", "LOGPUMP", "RankLogs", "log_writer_generation", "prune_generations", "start_pump"]

log = logging.getLogger(__name__)

LOGPUMP = Path(__file__).with_name("logpump.py")
"""The log writer, run as a file by the daemon's interpreter (``-I -S``: nothing but the standard library)."""

_GENERATION = re.compile(r"g(\d{1,9})-r\d{1,4}\.log(?:\.\d{1,3})?")


@dataclass(frozen=True, slots=True)
class RankLogs:
    """How much of each rank's output is kept (``[jobs]`` ``rank_log_max_bytes``, ``rank_log_keep``)."""

    max_bytes: int = 16 * 1024 * 1024
    keep: int = 2


DEFAULT_RANK_LOGS = RankLogs()


async def start_pump(
    log_path: Path, limits: RankLogs, owner: tuple[int, int] | None
) -> tuple[int, subprocess.Popen[bytes]]:
    """Make ``log_path``'s directory (the daemon's, 0700), start the log writer for it, and return the write end
    of its pipe (for the rank's stdout and stderr; the caller closes it once the rank holds it) and the writer.

    The writer is this process's child until it ends: it is reaped as soon as it does, through a pidfd on the
    event loop (a thread where the kernel has no pidfd), so it never lingers as a zombie."""
    proc, write_end = await asyncio.to_thread(_spawn, log_path, limits, owner)
    _reap_when_done(proc)
    return write_end, proc


def _spawn(log_path: Path, limits: RankLogs, owner: tuple[int, int] | None) -> tuple[subprocess.Popen[bytes], int]:
    """In a worker thread (fork and exec cost milliseconds): the directory, the pipe, the writer."""
    directory = log_path.parent
    ensure_dir(directory, None, None, 0o700)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        with opened_dir(directory) as dir_fd:
            argv = [sys.executable, "-I", "-S", str(LOGPUMP), str(dir_fd), log_path.name]
            argv += [str(limits.max_bytes), str(limits.keep), *(str(x) for x in owner or ())]
            proc = subprocess.Popen(
                argv, stdin=read_end, stdout=subprocess.DEVNULL, pass_fds=(dir_fd,), start_new_session=True
            )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return proc, write_end


def _reap_when_done(proc: subprocess.Popen[bytes]) -> None:
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        threading.Thread(target=proc.wait, name=f"logpump-{proc.pid}", daemon=True).start()
        return

    def done() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc.poll()

    loop.add_reader(pidfd, done)


def log_writer_generation(pid: int) -> int | None:
    """The generation whose rank log the process ``pid`` writes, when it is one of this daemon's log writers (run
    as the daemon's user, from :data:`LOGPUMP`); None for any other process, or one that has ended. A job's log
    writers run in its cgroup (its CPU and memory count there) and are no strays of it."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            if p.uids().real != os.geteuid():
                return None
            cmd = p.cmdline()
    except psutil.Error:
        return None
    try:
        name = cmd[cmd.index(str(LOGPUMP)) + 2]
    except (ValueError, IndexError):
        return None
    m = _GENERATION.fullmatch(name)
    return int(m.group(1)) if m else None


def prune_generations(directory: Path, generation: int, keep: int) -> list[str]:
    """Remove the logs of generations before ``generation - keep`` from ``directory`` (relative to a descriptor
    opened without following links; nothing else there is touched); returns the names removed."""
    removed: list[str] = []
    try:
        with opened_dir(directory) as fd:
            for entry in os.scandir(fd):
                m = _GENERATION.fullmatch(entry.name)
                if m is None or int(m.group(1)) >= generation - keep:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
                    removed.append(entry.name)
    except FileNotFoundError:
        return removed
    except (OSError, UserPathError) as exc:
        log.warning("could not remove old rank logs in %s: %s", directory, exc)
    return sorted(removed)
