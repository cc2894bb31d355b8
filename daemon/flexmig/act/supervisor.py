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
import logging
import os
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
from flexmig.act.jobcgroups import JobCgroups
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
from flexmig.act.rankenv import LOOPBACK, free_port, mig_visible, rank_requests, rank_world
from flexmig.act.ranklogs import DEFAULT_RANK_LOGS, RankLogs, log_writer_generation, prune_generations
from flexmig.act.reaping import (
    check_placed,
    clear_cgroup,
    kill_group,
    open_procs,
    outlives,
    signal_found,
    signal_pid,
    trees,
    writers_in,
)
from flexmig.act.records import AckPlacement, JobRecord, Slot
from flexmig.hook.protocol import (
    READY_LINE,
    Ack,
    encode_handover,
)
from flexmig.tasks import cancel_and_wait, spawn

__all__ = ["LOOPBACK", "RankHandle", "Supervisor", "free_port", "mig_visible", "rank_requests"]

log = logging.getLogger(__name__)

WRITER_DRAIN_S = 5.0
"""How long a rank's log writer may go on after the rank ended (its last lines, a child's flush) before it is
ended whatever still holds its pipe."""


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
        cgroup_fd = None if self.cgroups is None else open_procs(self.cgroups, rec)
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
                kill_group(h.proc, signal.SIGKILL)
            raise errors[0]
        if cgroup_fd is not None and self.cgroups is not None:
            check_placed(rec, self.cgroups, [(h.slot, h.proc.pid) for h in started])
        return started

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
                kill_group(h.proc, signal.SIGKILL)
                continue
            msg = encode_handover(rank_world(rec, slot, port=port, resume=resume, host=self.host))
            try:
                assert h.channel is not None
                async with asyncio.timeout(5.0):
                    await loop.sock_sendall(h.channel, msg)
            except (OSError, TimeoutError) as exc:
                log.warning("standby rank %d of job %s not handed over (%s); started afresh", slot, rec.name, exc)
                self._close_channel(h)
                kill_group(h.proc, signal.SIGKILL)
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
            kill_group(h.proc, signal.SIGTERM)
        alive = [h for h in hs if not h.proc.finished()]
        if not alive:
            return
        try:
            async with asyncio.timeout(grace_s):
                await asyncio.gather(*(h.proc.wait() for h in alive))
        except TimeoutError:
            for h in alive:
                kill_group(h.proc, signal.SIGKILL)
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
        if await outlives([writer], WRITER_DRAIN_S):
            signal_pid(writer, signal.SIGKILL)
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
        return self.pids(job) | trees(h.proc.pid for h in self.standby(job) if not h.proc.finished())

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
            kill_group(h.proc, signal.SIGTERM)
        if not await self.wait_exited(job, grace_s):
            for h in self.alive(job):
                kill_group(h.proc, signal.SIGKILL)
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
                signal_found(f, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            while any(process_alive(f.pid, f.create_time) for f in strays) and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # no event tells the end of a process that is not our child
            for f in strays:
                signal_found(f, signal.SIGKILL)
        await self._end_old_writers(job, uid)
        if not own and self.cgroups is not None:  # nothing of the job runs: whatever is still in its cgroup goes
            await asyncio.to_thread(clear_cgroup, self.cgroups, uid, 5.0 if strays else 0.0)
        return [f.pid for f in strays]

    async def _end_old_writers(self, job: str, uid: str) -> None:
        """The log writers in the job's cgroup (started by this daemon or a previous one) of generations that no
        longer run: each is given :data:`WRITER_DRAIN_S` after the strays to write its rank's last lines, then
        ended, whatever still holds its pipe (a writer that outlived its generation would re-create that
        generation's logs after they were pruned, past the documented bound)."""
        if self.cgroups is None:
            return
        running = {h.generation for h in self.alive(job)} | {h.generation for h in self.standby(job)}
        writers = await asyncio.to_thread(writers_in, self.cgroups, uid)
        old = [w for w, gen in writers.items() if gen not in running]
        if not old:
            return
        if await outlives(old, WRITER_DRAIN_S):
            left = [w for w in old if process_alive(*w)]
            for w in left:
                signal_pid(w, signal.SIGKILL)
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
