"""Rank processes: launching them (never through a shell), watching them, and finding them after a restart.

Two kinds of handle share the :class:`RankProcess` Protocol: a process this daemon launched (its exit status is
known) and a process a previous daemon launched and this one adopted after a crash (found by the job's ID in its
environment; it is not our child, so its exit status is unknown and reported as None).

The checkpoint signal starts *ignored* in every rank (set between fork and exec): a request that arrives while a
job is still importing torch is lost instead of killing it, and the daemon repeats its request until the job has
installed its handler (``flexmig_hook.install``) and acknowledges. A job without the hook simply never
acknowledges and keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import psutil

from flexmig.act.ranklogs import DEFAULT_RANK_LOGS, RankLogs, start_pump
from flexmig.errors import FlexmigError
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB, ENV_JOB_ID, ENV_SLOT, ENV_STANDBY_FD
from flexmig.jobspec.programs import runnable_program

__all__ = [
    "AdoptedProcess",
    "FoundRank",
    "LaunchRequest",
    "LaunchedProcess",
    "Launcher",
    "MarkedRank",
    "ProcessScanner",
    "PsutilScanner",
    "RankProcess",
    "SubprocessLauncher",
    "process_alive",
]

_R = TypeVar("_R")


def process_alive(pid: int, create_time: float | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, started at ``create_time`` (guards against pid reuse)."""
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.01:
            return False
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class RankProcess(Protocol):
    """A running (or finished) rank process."""

    @property
    def pid(self) -> int:
        """The process ID."""

    @property
    def create_time(self) -> float:
        """When the process started (psutil's create_time), to tell it from a later process with the same pid."""

    @property
    def returncode(self) -> int | None:
        """Exit status once finished; None while running, or when unknown (adopted processes)."""

    def finished(self) -> bool:
        """True once the process has exited."""

    async def wait(self) -> int | None:
        """Wait for the exit; returns the status (None when unknown)."""

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` unless the process has exited."""

    def worker_pids(self) -> list[int]:
        """The processes that run the job's code: itself, or torchrun's workers under it."""

    @property
    def log_writer(self) -> tuple[int, float] | None:
        """The pid and start time (psutil's ``create_time``) of the rank's log writer (:mod:`flexmig.act.logpump`)
        when this daemon started it, else None."""


class LaunchedProcess:
    """A rank this daemon started (a ``subprocess.Popen``), its exit seen through a pidfd on the event loop.

    Ranks are started from worker threads, several at once (:class:`SubprocessLauncher`), which asyncio's own
    subprocess support does not allow; the pidfd makes the exit an event of the loop without a waiting thread.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        launcher_kind: str,
        loop: asyncio.AbstractEventLoop,
        log_writer: tuple[int, float] | None = None,
    ) -> None:
        self._proc = proc
        self._writer = log_writer
        self._kind = launcher_kind
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        try:
            self._ctime = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            self._ctime = 0.0
        self._pidfd = -1
        try:
            self._pidfd = os.pidfd_open(proc.pid)
        except OSError:  # no pidfd (old kernel): a thread waits instead
            threading.Thread(target=self._wait_thread, name=f"wait-{proc.pid}", daemon=True).start()
        else:
            loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        if self._pidfd >= 0:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        code = self._proc.wait()  # the process has exited: this only reaps it
        if not self._exited.done():
            self._exited.set_result(code)

    def _wait_thread(self) -> None:
        code = self._proc.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._set, code)

    def _set(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)

    @property
    def pid(self) -> int:
        """The process ID."""
        return int(self._proc.pid)

    @property
    def create_time(self) -> float:
        """psutil create_time of the process."""
        return self._ctime

    @property
    def returncode(self) -> int | None:
        """Exit status (negative: killed by that signal), None while running."""
        return self._exited.result() if self._exited.done() else None

    def finished(self) -> bool:
        """True once exited (and reaped)."""
        return self._exited.done()

    async def wait(self) -> int | None:
        """Wait for the exit."""
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` (no-op once exited)."""
        if not self._exited.done():
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def worker_pids(self) -> list[int]:
        """The rank itself (plain) or torchrun's workers."""
        return _workers(self.pid, self._kind)

    @property
    def log_writer(self) -> tuple[int, float] | None:
        """The pid and start time of the rank's log writer."""
        return self._writer


class AdoptedProcess:
    """A rank found after a daemon restart; watched by polling because it is not our child."""

    def __init__(self, pid: int, create_time: float, launcher_kind: str, poll_s: float = 0.05) -> None:
        self._pid = pid
        self._ctime = create_time
        self._kind = launcher_kind
        self._poll_s = poll_s
        self._done = False

    @property
    def pid(self) -> int:
        """The process ID."""
        return self._pid

    @property
    def create_time(self) -> float:
        """psutil create_time of the process."""
        return self._ctime

    @property
    def returncode(self) -> int | None:
        """Always None: the exit status of a process that is not our child cannot be read."""
        return None

    def finished(self) -> bool:
        """True once the process is gone (or a zombie)."""
        if not self._done and not process_alive(self._pid, self._ctime):
            self._done = True
        return self._done

    async def wait(self) -> int | None:
        """Poll until the process is gone."""
        while not self.finished():  # noqa: ASYNC110 - no event exists for the exit of a process that is not our child
            await asyncio.sleep(self._poll_s)
        return None

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` if the very same process still runs."""
        if not self.finished():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._pid, sig)

    def worker_pids(self) -> list[int]:
        """The rank itself (plain) or torchrun's workers."""
        return _workers(self._pid, self._kind)

    @property
    def log_writer(self) -> tuple[int, float] | None:
        """None: a previous daemon started it (it is in the job's cgroup, where the supervisor finds it)."""
        return None


def _workers(pid: int, kind: str) -> list[int]:
    if kind != "torchrun":
        return [pid]
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=False)]
    except psutil.Error:
        return []


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Everything needed to start one rank: argv (a list, run without a shell), environment, directory, identity.

    ``uid``/``gid``/``groups`` are applied in the child before exec (only when the daemon is root and they
    differ from its own). ``ignore_signal`` starts the rank with that signal ignored (see module doc). ``log_limits``
    bounds what is kept of the rank's output (:mod:`flexmig.act.ranklogs`).
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    log_path: Path
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    ignore_signal: int | None = None
    launcher_kind: str = "plain"
    log_limits: RankLogs = DEFAULT_RANK_LOGS
    pass_fds: tuple[int, ...] = ()
    """Descriptors the rank inherits under the same numbers (a standby rank's channel to the daemon)."""
    cgroup_fd: int | None = None
    """The job's ``cgroup.procs``, open for writing (:mod:`flexmig.act.jobcgroups`): the rank places itself in its
    job's cgroup through it before ``exec``, so that everything it starts is born there. Not inherited."""


class Launcher(Protocol):
    """Starts rank processes."""

    async def launch(self, req: LaunchRequest) -> RankProcess:
        """Start one rank; raises OSError when the program cannot be run."""


class SubprocessLauncher:
    """The real launcher: ``subprocess.Popen`` in a new session, from a worker thread, output to a capped log.

    Starting a process from a daemon of some hundred megabytes costs milliseconds of ``fork`` and ``exec``; run
    from worker threads, the ranks of one launch start side by side instead of one after another.
    """

    async def launch(self, req: LaunchRequest) -> RankProcess:
        """Start the rank; its stdout and stderr go through a pipe to its log writer (:mod:`flexmig.act.logpump`),
        which appends them to ``req.log_path`` and rotates it at ``req.log_limits``.

        The program is judged again by what it resolves to now (:func:`~flexmig.jobspec.programs.shell_reason`:
        a link may have been changed since the spec was read), and that resolved file is what is executed, with
        the spec's ``argv[0]`` kept as the process's name. OSError when it is a shell.
        """
        loop = asyncio.get_running_loop()
        program = await asyncio.to_thread(runnable_program, req.argv[0])  # judged before anything is started
        owner = (req.uid, req.gid if req.gid is not None else -1) if req.uid is not None else None
        try:
            log_fd, writer = await start_pump(req.log_path, req.log_limits, owner)  # reaped by start_pump's watch
        except FlexmigError as exc:  # the log directory is not what it must be
            raise OSError(f"rank log {req.log_path}: {exc}") from exc
        if req.cgroup_fd is not None:  # the job's cgroup: its output's cost counts as the job's, and ends with it
            with contextlib.suppress(OSError):  # it then ends when the rank's exit is settled (the supervisor)
                os.write(req.cgroup_fd, str(writer.pid).encode())
        try:
            proc = await asyncio.to_thread(_start, req, log_fd, program)
        finally:
            os.close(log_fd)  # the rank holds it now (or, if it did not start, the writer sees its pipe end)
        try:
            writer_id: tuple[int, float] | None = (writer.pid, psutil.Process(writer.pid).create_time())
        except psutil.Error:
            writer_id = None  # it has ended already (the rank did not start): nothing of it to end later
        return LaunchedProcess(proc, req.launcher_kind, loop, writer_id)


def _start(req: LaunchRequest, log_fd: int, program: str) -> subprocess.Popen[bytes]:
    """Start one rank (in a worker thread): fork and exec ``program`` (``argv[0]`` as judged and resolved) with its
    output on ``log_fd`` (the write end of its log writer's pipe)."""
    sig = req.ignore_signal
    cgroup_fd = req.cgroup_fd

    def _child_setup() -> None:  # runs in the child between fork and exec: two syscalls, no locks
        if cgroup_fd is not None:
            with contextlib.suppress(OSError):  # the supervisor checks where the rank landed
                os.write(cgroup_fd, b"0")
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)

    return subprocess.Popen(
        list(req.argv),
        executable=program,
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=log_fd,
        cwd=req.cwd,
        env=dict(req.env),
        start_new_session=True,  # jobs outlive a daemon crash and ignore its terminal's signals
        user=req.uid,
        group=req.gid,
        extra_groups=list(req.groups) if req.groups is not None else None,
        preexec_fn=_child_setup if sig is not None or cgroup_fd is not None else None,  # noqa: PLW1509 - see above
        pass_fds=req.pass_fds,
    )


@dataclass(frozen=True, slots=True)
class FoundRank:
    """A rank process found by scanning the process table."""

    pid: int
    create_time: float
    generation: int
    slot: int
    standby: bool = False
    """Started as a standby rank (``FLEXMIG_STANDBY_FD`` in its environment): whether it was handed over, only
    the journal can say."""
    uid: int = -1
    """The process's real user ID (-1: unknown): the markers are what the process says about itself, and anyone
    may start a process with any environment; its user, its cgroup and its start time are what the kernel says."""


@dataclass(frozen=True, slots=True)
class MarkedRank:
    """A top-level process carrying flexmig's job markers, whatever job: what the scan for unknown ranks sees."""

    pid: int
    job_id: str
    job: str
    generation: int
    slot: int
    device: str
    """Its ``CUDA_VISIBLE_DEVICES`` (``MIG-<uuid>`` for a rank the daemon launched)."""
    user: str


class ProcessScanner(Protocol):
    """Finds the top-level rank processes of a job by the ID in their environment."""

    def find(self, job_uid: str) -> list[FoundRank]:
        """Every live rank process (not its children) whose environment carries ``FLEXMIG_JOB_ID=job_uid``."""

    def find_marked(self) -> list[MarkedRank]:
        """Every live top-level process whose environment carries a ``FLEXMIG_JOB_ID`` at all."""

    def find_all(self, job_uid: str) -> list[FoundRank]:
        """Every live process whose environment carries ``FLEXMIG_JOB_ID=job_uid``: the ranks, their children,
        and whatever left a rank's process group (``setsid``, a double fork) but kept the environment."""


class PsutilScanner:
    """Scans ``/proc`` through psutil. Reading another user's environment needs root, as the daemon is in act mode."""

    def find(self, job_uid: str) -> list[FoundRank]:
        """See :class:`ProcessScanner`."""
        matches: dict[int, FoundRank] = {}
        parents: dict[int, int] = {}
        for p, env in _readable_environments("create_time", "uids"):
            if env.get(ENV_JOB_ID) != job_uid:
                continue
            gen, slot = _marker(env, ENV_GENERATION), _marker(env, ENV_SLOT)
            standby = ENV_STANDBY_FD in env
            started = float(p.info["create_time"])
            matches[p.info["pid"]] = FoundRank(p.info["pid"], started, gen, slot, standby, _real_uid(p))
            parents[p.info["pid"]] = int(p.info["ppid"])
        return sorted(_tops(matches, parents), key=lambda f: (f.generation, f.slot))

    def find_all(self, job_uid: str) -> list[FoundRank]:
        """See :class:`ProcessScanner`."""
        out = []
        for p, env in _readable_environments("create_time", "uids"):
            if env.get(ENV_JOB_ID) != job_uid:
                continue
            pid, started = int(p.info["pid"]), float(p.info["create_time"])
            gen, slot = _marker(env, ENV_GENERATION), _marker(env, ENV_SLOT)
            out.append(FoundRank(pid, started, gen, slot, ENV_STANDBY_FD in env, _real_uid(p)))
        return sorted(out, key=lambda f: f.pid)

    def find_marked(self) -> list[MarkedRank]:
        """See :class:`ProcessScanner`."""
        found: dict[int, MarkedRank] = {}
        parents: dict[int, int] = {}
        for p, env in _readable_environments("username"):
            job_id = env.get(ENV_JOB_ID)
            if not job_id:
                continue
            found[p.info["pid"]] = MarkedRank(
                pid=int(p.info["pid"]),
                job_id=job_id[:64],
                job=env.get(ENV_JOB, "")[:64],
                generation=_marker(env, ENV_GENERATION),
                slot=_marker(env, ENV_SLOT),
                device=env.get("CUDA_VISIBLE_DEVICES", "")[:128],
                user=str(p.info.get("username") or ""),
            )
            parents[p.info["pid"]] = int(p.info["ppid"])
        return sorted(_tops(found, parents), key=lambda r: r.pid)


def _real_uid(p: psutil.Process) -> int:
    """The real user ID among the ``uids`` psutil read for ``p`` (-1 when it could not)."""
    uids = p.info.get("uids")
    return int(uids.real) if uids is not None else -1


def _marker(env: Mapping[str, str], name: str) -> int:
    """A number marker of a process's environment (generation, slot), -1 unless it is 1-9 ASCII digits: anyone may
    start a process with any environment, and ``int()`` of 5,000 digits (or of ``"²"``) raises."""
    text = env.get(name, "")
    return int(text) if 0 < len(text) <= 9 and text.isascii() and text.isdigit() else -1


def _readable_environments(*attrs: str) -> Iterator[tuple[psutil.Process, dict[str, str]]]:
    """Every live process (no zombie) whose environment this process may read, with that environment; ``pid``,
    ``ppid``, ``status`` and ``attrs`` are in its ``info``."""
    for p in psutil.process_iter(["pid", "ppid", "status", *attrs]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        yield p, env


def _tops(found: Mapping[int, _R], parents: Mapping[int, int]) -> list[_R]:
    """The processes of ``found`` (by pid) whose parent is not among them. A job's own children (torchrun's workers)
    inherit its markers: only the top of each tree is a rank."""
    return [r for pid, r in found.items() if parents[pid] not in found]
