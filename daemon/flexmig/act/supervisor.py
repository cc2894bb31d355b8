"""The job supervisor: one process per MIG instance, launched as the job's user, never through a shell, watched.

Each rank gets ``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` (its one MIG device, ``cuda:0`` inside the process), the hook
variables (``FLEXMIG_JOB``, ``FLEXMIG_CHECKPOINT_DIR``, ``FLEXMIG_ACK_PATH``, ``FLEXMIG_CHECKPOINT_SIGNAL``,
``FLEXMIG_RESUME`` and ``FLEXMIG_RESUME_STEP`` when resuming) and the daemon's markers (``FLEXMIG_JOB_ID``,
``FLEXMIG_GENERATION``, ``FLEXMIG_SLOT``). With the ``plain`` launcher it also gets torch.distributed's
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (0: one device per process), ``MASTER_ADDR`` (loopback) and
``MASTER_PORT``. With ``torchrun``, each instance runs one torch elastic agent (``--nproc-per-node 1``) and the
agents meet in a c10d rendezvous on loopback, which sets those variables for the workers.

A **standby** rank (a job with ``[hook] standby = true``, during a move) is started before the current generation
checkpoints, on a target instance, without the world (no ``RANK``, ``WORLD_SIZE``, ``MASTER_*``, ``FLEXMIG_RESUME``)
and with ``FLEXMIG_STANDBY_FD``: one end of a Unix socket pair whose other end the supervisor keeps. The rank writes
"ready" on it once its start-up is done; the supervisor hands it the world and the checkpoint over it
(:meth:`Supervisor.handover`), and only then does it count as a rank of its job (signalled, stopped, registered on
its device, its exit reported). Standby ranks are kept apart until then: a cancelled move drops them
(:meth:`Supervisor.drop_standby`) without touching the running generation.

The supervisor decides nothing: it launches, signals, waits and reports exits to its ``on_exit`` callback; the
executor owns every decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import grp
import logging
import os
import pwd
import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from flexmig.act.devices import DeviceProcessTable
from flexmig.act.events import ActEvent, EventSink
from flexmig.act.genuine import job_owner
from flexmig.act.jobcgroups import JobCgroups, own_cgroup
from flexmig.act.migops import Offload
from flexmig.act.procs import (
    AdoptedProcess,
    FoundRank,
    Launcher,
    LaunchRequest,
    ProcessScanner,
    RankProcess,
    process_alive,
)
from flexmig.act.ranklogs import DEFAULT_RANK_LOGS, RankLogs, log_writer_generation, prune_generations
from flexmig.act.records import AckPlacement, JobRecord, Slot
from flexmig.tasks import cancel_and_wait, spawn
from flexmig_hook.protocol import (
    ENV_ACK_PATH,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_KEEP,
    ENV_CHECKPOINT_SIGNAL,
    ENV_DIST_BACKEND,
    ENV_GENERATION,
    ENV_JOB,
    ENV_JOB_ID,
    ENV_RESUME,
    ENV_RESUME_STEP,
    ENV_SLOT,
    ENV_STANDBY_FD,
    READY_LINE,
    Ack,
    encode_handover,
)

__all__ = ["RankHandle", "Supervisor", "free_port", "mig_visible", "rank_requests"]

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
WRITER_DRAIN_S = 5.0
"""How long a rank's log writer may go on after the rank ended (its last lines, a child's flush) before it is
ended whatever still holds its pipe."""
_BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now (for a job's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class RankHandle:
    """A rank of a running job: its slot number (the rank, for ``plain``), its instance, its process.

    A standby rank (``standby`` True) also holds the daemon's end of its channel and whether it said it is
    ready; it becomes an ordinary rank at its handover.
    """

    slot: int
    place: Slot
    proc: RankProcess
    generation: int
    standby: bool = False
    channel: socket.socket | None = None
    ready: asyncio.Event | None = None


def _identity(user: str, group: str | None) -> tuple[int | None, int | None, tuple[int, ...] | None, str]:
    """(uid, gid, groups, home) to switch to, or Nones when no switch is needed (or possible)."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise OSError(f"no such user {user!r}") from None
    home = pw.pw_dir or "/"
    if os.geteuid() != 0:
        return None, None, None, home
    gid = grp.getgrnam(group).gr_gid if group else pw.pw_gid
    if pw.pw_uid == 0 and gid == 0:
        return None, None, None, home
    return pw.pw_uid, gid, tuple(os.getgrouplist(user, gid)), home


def mig_visible(uuid: str) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for a MIG device UUID (NVML's UUIDs already start with ``MIG-``)."""
    return uuid if uuid.startswith("MIG-") else f"MIG-{uuid}"


def rank_world(rec: JobRecord, slot: int, *, port: int, resume: Ack | None, host: str = LOOPBACK) -> dict[str, str]:
    """The variables that place slot ``slot`` of ``rec`` in its world: the checkpoint to resume from and, with the
    ``plain`` launcher, torch.distributed's ``RANK``, ``WORLD_SIZE``, ``LOCAL_*``, ``MASTER_*`` (torchrun sets
    those itself). In a rank's environment from the start, or handed to a standby rank when its move comes."""
    env: dict[str, str] = {}
    if resume is not None:
        env[ENV_RESUME] = resume.checkpoint
        env[ENV_RESUME_STEP] = str(resume.step)
    if rec.spec.launcher == "plain":
        env.update(
            RANK=str(slot),
            WORLD_SIZE=str(len(rec.slots)),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=host,
            MASTER_PORT=str(port),
        )
    return env


def rank_requests(
    rec: JobRecord,
    logs_dir: Path,
    *,
    port: int,
    resume: Ack | None,
    host: str = LOOPBACK,
    acks: AckPlacement | None = None,
    log_limits: RankLogs = DEFAULT_RANK_LOGS,
    standby: Mapping[int, int] | None = None,
) -> list[LaunchRequest]:
    """The launch requests of every rank of ``rec`` (its ``slots``, ``generation`` and spec), in slot order.

    ``standby`` maps slots to start as standby ranks to the descriptor of their channel: those get
    ``FLEXMIG_STANDBY_FD`` and inherit it, and get their world only at the handover (:func:`rank_world`).
    """
    spec = rec.spec
    uid, gid, groups, home = _identity(spec.user, spec.group)
    n = len(rec.slots)
    base = {
        "PATH": _BASE_PATH,
        "HOME": home,
        "USER": spec.user,
        "LOGNAME": spec.user,
        "LANG": "C.UTF-8",
        **dict(spec.env),
        ENV_JOB: spec.name,
        ENV_CHECKPOINT_DIR: str(spec.checkpoint_dir),
        ENV_ACK_PATH: str((acks or AckPlacement()).path(rec)),
        ENV_CHECKPOINT_SIGNAL: spec.hook.signal.name,
        ENV_CHECKPOINT_KEEP: str(spec.hook.keep),
        ENV_DIST_BACKEND: "gloo",
        ENV_JOB_ID: rec.uid,
        ENV_GENERATION: str(rec.generation),
    }
    out = []
    for slot, place in enumerate(rec.slots):
        env = dict(base)
        env["CUDA_VISIBLE_DEVICES"] = mig_visible(place.uuid)
        env[ENV_SLOT] = str(slot)
        fd = (standby or {}).get(slot)
        if fd is not None:
            env[ENV_STANDBY_FD] = str(fd)
        else:
            env.update(rank_world(rec, slot, port=port, resume=resume, host=host))
        if spec.launcher == "plain":
            argv = spec.argv
        else:
            argv = (
                spec.argv[0],
                "-m",
                "torch.distributed.run",
                "--nnodes",
                f"{n}:{n}",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{host}:{port}",
                "--rdzv-id",
                f"{rec.uid}-g{rec.generation}",
                "--rdzv-conf",
                f"is_host={'true' if slot == 0 else 'false'}",
                "--local-addr",
                host,
                "--max-restarts",
                "0",
                "--",  # the script's own options must not be read as (abbreviated) torchrun options
                *spec.argv[1:],
            )
        out.append(
            LaunchRequest(
                argv=tuple(argv),
                env=env,
                cwd=spec.working_dir,
                log_path=logs_dir / spec.name / f"g{rec.generation:04d}-r{slot}.log",
                uid=uid,
                gid=gid,
                groups=groups,
                ignore_signal=int(spec.hook.signal),
                launcher_kind=spec.launcher,
                log_limits=log_limits,
                pass_fds=(fd,) if fd is not None else (),
            )
        )
    return out


ExitCallback = Callable[[str, int, int | None], None]


class Supervisor:
    """Launches, adopts, signals and watches the ranks of every job; reports each exit to ``on_exit``."""

    def __init__(
        self,
        *,
        launcher: Launcher,
        devices: DeviceProcessTable,
        offload: Offload,
        logs_dir: Path,
        events: EventSink,
        wall: Callable[[], float] = time.time,
        host: str = LOOPBACK,
        acks: AckPlacement | None = None,
        rank_logs: RankLogs | None = None,
        scanner: ProcessScanner | None = None,
        cgroups: JobCgroups | None = None,
    ) -> None:
        self.acks = acks or AckPlacement()
        self.rank_logs = rank_logs or DEFAULT_RANK_LOGS
        """What is kept of each rank's output (``[jobs]`` ``rank_log_*``; a reload changes it for later launches)."""
        self.launcher = launcher
        self.devices = devices
        self.offload = offload
        # Resolved once (the operator's state directory may lie below a symlink such as /var/lib -> /data): the
        # rank logs are then made and opened with no symlink followed (flexmig.act.userpaths).
        self.logs_dir = Path(os.path.realpath(logs_dir))
        self.events = events
        self.wall = wall
        self.host = host
        self.scanner = scanner
        """Finds a job's processes by the ID in their environment, for the strays (see :meth:`end_strays`)."""
        self.cgroups = cgroups
        """One cgroup per job (:mod:`flexmig.act.jobcgroups`), where the system allows: its ranks are placed in it
        before ``exec``, and what is in it counts for the strays whatever its environment. None: not available."""
        self._uids: dict[str, str] = {}  # job name -> ID of the submission whose ranks run
        self._owners: dict[str, int] = {}  # job name -> the real user ID its ranks run as
        self.on_exit: ExitCallback | None = None
        self._ranks: dict[str, dict[int, RankHandle]] = {}
        self._standby: dict[str, dict[int, RankHandle]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------------------------------- launching
    async def launch(
        self, rec: JobRecord, *, port: int, resume: Ack | None, only: Iterable[int] | None = None
    ) -> list[RankHandle]:
        """Start the ranks of ``rec`` (all, or the slots in ``only``) side by side; raises OSError if one cannot
        start.

        On a failure the ranks already started by this call are killed again, so a launch is all or nothing.
        """
        limits = self.rank_logs
        reqs = rank_requests(
            rec, self.logs_dir, port=port, resume=resume, host=self.host, acks=self.acks, log_limits=limits
        )
        await asyncio.to_thread(prune_generations, self.logs_dir / rec.spec.name, rec.generation, limits.keep)
        self._uids[rec.name] = rec.uid
        self._owners[rec.name] = job_owner(rec)
        wanted = sorted(set(range(len(reqs))) if only is None else set(only))
        started = await self._start_all(rec, {s: reqs[s] for s in wanted})
        ranks = self._ranks.setdefault(rec.name, {})
        for h in started:
            ranks[h.slot] = h
        await asyncio.gather(*(self._attach(h) for h in started))
        for h in started:
            self._watch(rec.name, h)
        if started:  # a move whose standby ranks were all handed over starts none here: nothing to tell twice
            self._emit_started(rec, started, resume)
        return started

    async def _start_all(self, rec: JobRecord, reqs: Mapping[int, LaunchRequest]) -> list[RankHandle]:
        """Start every request at once; if one fails, kill the others and raise its error."""
        cgroup_fd = self._open_cgroup(rec)
        if cgroup_fd is not None:
            reqs = {slot: dataclasses.replace(r, cgroup_fd=cgroup_fd) for slot, r in reqs.items()}
        try:
            results = await asyncio.gather(*(self.launcher.launch(r) for r in reqs.values()), return_exceptions=True)
        finally:
            if cgroup_fd is not None:
                os.close(cgroup_fd)
        started = [
            RankHandle(slot, rec.slots[slot], res, rec.generation)
            for slot, res in zip(reqs, results, strict=True)
            if not isinstance(res, BaseException)
        ]
        errors = [res for res in results if isinstance(res, BaseException)]
        if errors:
            for h in started:
                _kill_group(h.proc, signal.SIGKILL)
            raise errors[0]
        if cgroup_fd is not None and self.cgroups is not None:
            self._check_cgroup(rec, self.cgroups, started)
        return started

    def _open_cgroup(self, rec: JobRecord) -> int | None:
        """The job's ``cgroup.procs`` open for writing, or None without job cgroups (one warning if it fails)."""
        if self.cgroups is None:
            return None
        try:
            return self.cgroups.open_procs(rec.uid)
        except (OSError, ValueError) as exc:
            log.warning(
                "job %s: no cgroup of its own (%s): processes that leave its ranks' process groups are found by "
                "their environment only", rec.name, exc,
            )  # fmt: skip
            return None

    @staticmethod
    def _check_cgroup(rec: JobRecord, cgroups: JobCgroups, started: Iterable[RankHandle]) -> None:
        """Warn about a rank that did not land in its job's cgroup (its write before ``exec`` failed)."""
        want = "/" + cgroups.path(rec.uid).name
        for h in started:
            try:
                text = Path(f"/proc/{h.proc.pid}/cgroup").read_text()
            except OSError:
                continue  # it has exited already; its exit is reported as usual
            where = own_cgroup(text)
            if where is not None and not where.endswith(want):
                log.warning(
                    "job %s: rank %d (pid %d) is in cgroup %s, not in its job's (%s): processes it starts and that "
                    "leave its process group are found by their environment only",
                    rec.name, h.slot, h.proc.pid, where, cgroups.path(rec.uid),
                )  # fmt: skip

    def _emit_started(self, rec: JobRecord, started: Iterable[RankHandle], resume: Ack | None, **extra: object) -> None:
        self.events.emit(
            ActEvent(
                kind="job_started",
                time_s=self.wall(),
                job=rec.name,
                detail={
                    "generation": rec.generation,
                    "pids": {str(h.slot): h.proc.pid for h in started},
                    "instances": [s.spec() for s in rec.slots],
                    "resume_step": resume.step if resume else None,
                    **extra,
                },
            )
        )

    # ---------------------------------------------------------------------------------------------- standby
    async def launch_standby(self, rec: JobRecord, slots: Iterable[int]) -> list[RankHandle]:
        """Start standby ranks of ``rec`` (the *next* generation's record) on ``slots``, whose instances exist.

        They run the job's start-up, say "ready" on their channel and wait for :meth:`handover`; until then they
        are no ranks of the job: not signalled, not registered on their device, their exit reported to nobody
        but :meth:`standby`'s readers. OSError (and nothing left running) if one cannot start.
        """
        wanted = sorted(set(slots))
        pairs = {s: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for s in wanted}
        try:
            fds = {s: child.fileno() for s, (_, child) in pairs.items()}
            reqs = rank_requests(
                rec, self.logs_dir, port=0, resume=None, host=self.host, acks=self.acks, standby=fds,
                log_limits=self.rank_logs,
            )  # fmt: skip
            started = await self._start_all(rec, {s: reqs[s] for s in wanted})
        except BaseException:
            for ours, child in pairs.values():
                ours.close()
                child.close()
            raise
        for _, child in pairs.values():
            child.close()  # the rank holds its end; ours alone stays here
        standby = self._standby.setdefault(rec.name, {})
        for h in started:
            ours = pairs[h.slot][0]
            ours.setblocking(False)
            h.standby, h.channel, h.ready = True, ours, asyncio.Event()
            standby[h.slot] = h
            self._watch(rec.name, h)
            task = spawn(self._await_ready(h), name=f"standby-{rec.name}-{h.slot}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._emit_started(rec, started, None, standby=True)
        return started

    async def _await_ready(self, h: RankHandle) -> None:
        """Read the standby rank's "ready" line (at most its length; anything else is not readiness)."""
        assert h.channel is not None and h.ready is not None
        loop = asyncio.get_running_loop()
        got = b""
        try:
            while len(got) < len(READY_LINE):
                chunk = await loop.sock_recv(h.channel, len(READY_LINE) - len(got))
                if not chunk:
                    return
                got += chunk
        except OSError:
            return
        if got == READY_LINE:
            h.ready.set()
        else:
            log.warning("standby rank %d of generation %d wrote %r instead of ready", h.slot, h.generation, got)

    def standby(self, job: str) -> list[RankHandle]:
        """The standby ranks of ``job`` this supervisor started and has not handed over or dropped (running or
        not), in slot order."""
        return [h for _, h in sorted(self._standby.get(job, {}).items())]

    async def wait_standby_ready(
        self, job: str, timeout_s: float, interrupt: asyncio.Event | None = None
    ) -> list[RankHandle]:
        """Wait until every standby rank of ``job`` is ready or has exited, at most ``timeout_s``, and no longer
        once ``interrupt`` is set (another request waits for the action lock: a standby rank that never says ready
        must not hold every other request up); returns those that exited (before saying ready)."""

        async def one(h: RankHandle) -> None:
            assert h.ready is not None
            ready = asyncio.ensure_future(h.ready.wait())
            ended = asyncio.ensure_future(h.proc.wait())
            try:
                await asyncio.wait({ready, ended}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                ended.cancel()

        hs = self.standby(job)
        if hs:
            every = asyncio.ensure_future(asyncio.gather(*(one(h) for h in hs)))
            waits = {every} | ({asyncio.ensure_future(interrupt.wait())} if interrupt is not None else set())
            try:
                await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await every
        return [h for h in hs if h.proc.finished() and not (h.ready and h.ready.is_set())]

    async def handover(self, rec: JobRecord, *, port: int, resume: Ack | None) -> list[int]:
        """Hand each live standby rank of ``rec``'s generation its world and checkpoint; they become its ranks.

        Returns the slots handed over. A standby rank that has exited, or whose channel is gone, is dropped, and
        its slot left for the caller to launch afresh.
        """
        loop = asyncio.get_running_loop()
        handed: list[RankHandle] = []
        mine = self._standby.pop(rec.name, {})
        for slot, h in sorted(mine.items()):
            ready = h.ready is not None and h.ready.is_set()
            if h.generation != rec.generation or not 0 <= slot < len(rec.slots) or h.proc.finished() or not ready:
                # Never ready: it may never read its world either. It goes, and its slot starts cold, with the world
                # in its environment, so the job never shows a generation running whose rank has no world.
                self._close_channel(h)
                _kill_group(h.proc, signal.SIGKILL)
                continue
            msg = encode_handover(rank_world(rec, slot, port=port, resume=resume, host=self.host))
            try:
                assert h.channel is not None
                async with asyncio.timeout(5.0):
                    await loop.sock_sendall(h.channel, msg)
            except (OSError, TimeoutError) as exc:
                log.warning("standby rank %d of job %s not handed over (%s); started afresh", slot, rec.name, exc)
                self._close_channel(h)
                _kill_group(h.proc, signal.SIGKILL)
                continue
            self._close_channel(h)
            h.standby = False
            h.place = rec.slots[slot]
            handed.append(h)
        ranks = self._ranks.setdefault(rec.name, {})
        for h in handed:
            ranks[h.slot] = h
        await asyncio.gather(*(self._attach(h) for h in handed))
        if handed:
            self._emit_started(rec, handed, resume, handed_over=True)
        return [h.slot for h in handed]

    async def drop_standby(self, job: str, grace_s: float = 10.0) -> None:
        """End ``job``'s standby ranks (a cancelled or failed move): close their channels (a standby rank that
        reads the end exits by itself), then SIGTERM their process groups and SIGKILL what is left after
        ``grace_s``."""
        hs = list(self._standby.pop(job, {}).values())
        for h in hs:
            self._close_channel(h)
            _kill_group(h.proc, signal.SIGTERM)
        alive = [h for h in hs if not h.proc.finished()]
        if not alive:
            return
        try:
            async with asyncio.timeout(grace_s):
                await asyncio.gather(*(h.proc.wait() for h in alive))
        except TimeoutError:
            for h in alive:
                _kill_group(h.proc, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(*(h.proc.wait() for h in alive))

    @staticmethod
    def _close_channel(h: RankHandle) -> None:
        if h.channel is not None:
            h.channel.close()
            h.channel = None

    async def adopt(self, rec: JobRecord, found: Iterable[FoundRank]) -> list[RankHandle]:
        """Take over ranks of generation ``rec.generation`` that a previous daemon launched (``found`` must hold
        only processes that really are the job's: :func:`~flexmig.act.genuine.genuine`)."""
        self._uids[rec.name] = rec.uid
        self._owners[rec.name] = job_owner(rec)
        out = []
        for f in found:
            if f.generation != rec.generation or not 0 <= f.slot < len(rec.slots):
                continue
            if f.slot in self._ranks.get(rec.name, {}):
                continue
            proc = AdoptedProcess(f.pid, f.create_time, rec.spec.launcher)
            h = RankHandle(f.slot, rec.slots[f.slot], proc, rec.generation)
            self._ranks.setdefault(rec.name, {})[f.slot] = h
            await self._attach(h)
            self._watch(rec.name, h)
            out.append(h)
        return out

    async def _attach(self, h: RankHandle) -> None:
        if not h.place.uuid:
            return
        try:
            await self.offload(lambda: self.devices.attach(h.place.uuid, h.proc.pid))
        except Exception as exc:  # registration is bookkeeping for NVML's view; never fail a launch over it
            log.warning("could not register pid %d on %s: %s", h.proc.pid, h.place.uuid, exc)

    def _watch(self, job: str, h: RankHandle) -> None:
        task = spawn(self._wait_rank(job, h), name=f"rank-{job}-{h.slot}")  # its death stops the daemon
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wait_rank(self, job: str, h: RankHandle) -> None:
        code = await h.proc.wait()
        writer = h.proc.log_writer
        if writer is not None:
            task = spawn(self._end_writer(job, h, writer), name=f"logwriter-{job}-{h.slot}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if h.standby:  # never handed over: no rank of the job yet, not on its device; the move decides
            self._close_channel(h)
            self.events.emit(
                ActEvent(
                    kind="job_exited",
                    time_s=self.wall(),
                    job=job,
                    detail={
                        "slot": h.slot,
                        "pid": h.proc.pid,
                        "generation": h.generation,
                        "exit_code": code,
                        "standby": True,
                    },
                )
            )
            return
        if h.place.uuid:
            with contextlib.suppress(Exception):
                await self.offload(lambda: self.devices.detach(h.place.uuid, h.proc.pid))
        self.events.emit(
            ActEvent(
                kind="job_exited",
                time_s=self.wall(),
                job=job,
                detail={"slot": h.slot, "pid": h.proc.pid, "generation": h.generation, "exit_code": code},
            )
        )
        if self.on_exit is not None:
            self.on_exit(job, h.slot, code)

    async def _end_writer(self, job: str, h: RankHandle, writer: tuple[int, float]) -> None:
        """Once rank ``h`` has exited, its log writer ends when the last holder of its pipe closes it; if something
        outside the job still holds it (a rank can hand its output descriptor to any process of its user) after
        :data:`WRITER_DRAIN_S`, the writer is ended anyway: no root process outlives the rank it writes for."""
        pid = writer[0]
        if await _outlives([writer], WRITER_DRAIN_S):
            _signal_pid(writer, signal.SIGKILL)
            log.warning(
                "job %s: the log writer (pid %d) of rank %d of generation %d still had its pipe held open by another "
                "process %g s after the rank ended: ended (what that process writes there now goes nowhere)",
                job, pid, h.slot, h.generation, WRITER_DRAIN_S,
            )  # fmt: skip

    # -------------------------------------------------------------------------------------------- queries
    def ranks(self, job: str) -> list[RankHandle]:
        """The ranks of ``job`` this supervisor knows, in slot order (running or finished)."""
        return [h for _, h in sorted(self._ranks.get(job, {}).items())]

    def alive(self, job: str) -> list[RankHandle]:
        """The ranks of ``job`` still running."""
        return [h for h in self.ranks(job) if not h.proc.finished()]

    def pids(self, job: str) -> set[int]:
        """Pids of ``job``'s running ranks and all their descendants (what NVML may list on their devices)."""
        out: set[int] = set()
        for h in self.alive(job):
            out.add(h.proc.pid)
            with contextlib.suppress(psutil.Error):
                out.update(c.pid for c in psutil.Process(h.proc.pid).children(recursive=True))
        return out

    def all_pids(self, job: str) -> set[int]:
        """:meth:`pids`, and the pids of ``job``'s standby ranks still running and their descendants (the job's
        next ranks, not strays)."""
        return self.pids(job) | _trees(h.proc.pid for h in self.standby(job) if not h.proc.finished())

    # ------------------------------------------------------------------------------------------- control
    def signal_workers(self, job: str, sig: int) -> list[int]:
        """Send ``sig`` to the processes running the job's code (torchrun: its workers); returns their pids."""
        sent = []
        for h in self.alive(job):
            for pid in h.proc.worker_pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                    sent.append(pid)
        return sent

    async def wait_exited(self, job: str, timeout_s: float) -> bool:
        """Wait until every rank of ``job`` exited; False on timeout."""
        alive = self.alive(job)
        if not alive:
            return True
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: Python 3.11's may swallow a cancellation
                await asyncio.gather(*(h.proc.wait() for h in alive))
        except TimeoutError:
            return False
        return True

    async def terminate(self, job: str, grace_s: float = 10.0) -> None:
        """SIGTERM every rank's process group, then SIGKILL what is left after ``grace_s``; then the strays."""
        for h in self.alive(job):
            _kill_group(h.proc, signal.SIGTERM)
        if not await self.wait_exited(job, grace_s):
            for h in self.alive(job):
                _kill_group(h.proc, signal.SIGKILL)
            await self.wait_exited(job, 5.0)
        await self.end_strays(job, grace_s)

    async def end_strays(self, job: str, grace_s: float = 10.0) -> list[int]:
        """Stop the processes of ``job`` that outlived its ranks: they left their rank's process group (``setsid``,
        a double fork), so neither the rank's exit nor a signal to its group reached them, and they would run on
        unreported, holding the job's MIG device and files. Found in the job's cgroup (whatever their environment)
        and by the job's ID in their environment (which a child inherits) when they run as the job's user, outside
        the process trees of the job's ranks and standby ranks still running; SIGTERM, SIGKILL after ``grace_s``.
        One warning line naming them; returns their pids. Then the log writers of generations that no longer run
        end (:meth:`_end_old_writers`), and when nothing of the job runs any more its cgroup is killed and
        removed."""
        uid = self._uids.get(job)
        if uid is None:
            return []
        found = await asyncio.to_thread(self._processes_of, uid)
        own = self.all_pids(job)
        strays = [f for f in found if f.pid not in own and f.pid != os.getpid()]
        if strays:
            log.warning(
                "job %s: %d process(es) left their rank's process group and outlived it (pids %s): stopped (SIGTERM, "
                "SIGKILL after %g s)", job, len(strays), ", ".join(str(f.pid) for f in strays), grace_s,
            )  # fmt: skip
            for f in strays:
                _signal_found(f, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            while any(process_alive(f.pid, f.create_time) for f in strays) and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # no event tells the end of a process that is not our child
            for f in strays:
                _signal_found(f, signal.SIGKILL)
        await self._end_old_writers(job, uid)
        if not own and self.cgroups is not None:  # nothing of the job runs: whatever is still in its cgroup goes
            await asyncio.to_thread(_clear_cgroup, self.cgroups, uid, 5.0 if strays else 0.0)
        return [f.pid for f in strays]

    async def _end_old_writers(self, job: str, uid: str) -> None:
        """The log writers in the job's cgroup (started by this daemon or a previous one) of generations that no
        longer run: each is given :data:`WRITER_DRAIN_S` after the strays to write its rank's last lines, then
        ended, whatever still holds its pipe (a writer that outlived its generation would re-create that
        generation's logs after they were pruned, past the documented bound)."""
        if self.cgroups is None:
            return
        running = {h.generation for h in self.alive(job)} | {h.generation for h in self.standby(job)}
        writers = await asyncio.to_thread(_writers_in, self.cgroups, uid)
        old = [w for w, gen in writers.items() if gen not in running]
        if not old:
            return
        if await _outlives(old, WRITER_DRAIN_S):
            left = [w for w in old if process_alive(*w)]
            for w in left:
                _signal_pid(w, signal.SIGKILL)
            log.warning(
                "job %s: %d log writer(s) of generations that no longer run still had their pipes held open by "
                "another process (pids %s): ended", job, len(left), ", ".join(str(w[0]) for w in left),
            )  # fmt: skip

    def _processes_of(self, uid: str) -> list[FoundRank]:
        """Every process of the job with ID ``uid``: those carrying the ID in their environment, and those in its
        cgroup whatever their environment (as generation and slot -1)."""
        found = {f.pid: f for f in self.scanner.find_all(uid)} if self.scanner is not None else {}
        owner = self._owners.get(self._job_of(uid))
        found = {pid: f for pid, f in found.items() if f.uid == owner}  # markers alone prove nothing
        if self.cgroups is not None:
            for pid in self.cgroups.pids(uid):
                if pid in found or log_writer_generation(pid) is not None:  # the job's log writers are no strays
                    continue
                try:
                    found[pid] = FoundRank(pid, psutil.Process(pid).create_time(), -1, -1)
                except psutil.Error:
                    continue  # it ended meanwhile
        return sorted(found.values(), key=lambda f: f.pid)

    def _job_of(self, uid: str) -> str:
        """The name of the job whose submission has ID ``uid`` ("" for none)."""
        return next((name for name, u in self._uids.items() if u == uid), "")

    def forget(self, job: str) -> None:
        """Drop the handles of ``job``'s finished ranks (before a relaunch)."""
        ranks = self._ranks.get(job, {})
        for slot in [s for s, h in ranks.items() if h.proc.finished()]:
            del ranks[slot]

    async def close(self) -> None:
        """Stop watching (ranks keep running: jobs outlive the daemon). Standby ranks lose their channel and end:
        no daemon is left to hand them over."""
        for hs in self._standby.values():
            for h in hs.values():
                self._close_channel(h)
        await cancel_and_wait(self._tasks)


def _trees(pids: Iterable[int]) -> set[int]:
    """``pids`` and all their descendants (a standby generation's ranks are the job's next ranks, not strays)."""
    out: set[int] = set()
    for pid in pids:
        out.add(pid)
        with contextlib.suppress(psutil.Error):
            out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    return out


def _clear_cgroup(cgroups: JobCgroups, uid: str, wait_s: float) -> None:
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


def _writers_in(cgroups: JobCgroups, uid: str) -> dict[tuple[int, float], int]:
    """The log writers in job ``uid``'s cgroup (pid and start time), with the generation each writes for."""
    out = {}
    for pid in cgroups.pids(uid):
        gen = log_writer_generation(pid)
        if gen is None:
            continue
        with contextlib.suppress(psutil.Error):
            out[(pid, psutil.Process(pid).create_time())] = gen
    return out


async def _outlives(procs: list[tuple[int, float]], grace_s: float) -> bool:
    """Wait at most ``grace_s`` for ``procs`` (pid, start time) to end; True when one of them still runs then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while any(process_alive(*p) for p in procs):  # no event tells the end of a process that is not our child
        if loop.time() >= deadline:
            return True
        await asyncio.sleep(0.01)  # a writer whose pipe has ended exits within milliseconds: a move waits for it
    return False


def _signal_pid(proc: tuple[int, float], sig: int) -> None:
    """Signal process ``proc`` (pid, start time) if it is still that very process."""
    if process_alive(*proc):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc[0], sig)


def _signal_found(found: FoundRank, sig: int) -> None:
    """Signal a process found by scanning, if it is still that very process (not a later one with its pid)."""
    if process_alive(found.pid, found.create_time):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(found.pid, sig)


def _kill_group(proc: RankProcess, sig: int) -> None:
    """Signal the rank's process group (its session: the rank and whatever it started)."""
    if proc.finished():
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)
