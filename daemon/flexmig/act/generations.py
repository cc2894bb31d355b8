"""The executor's launch steps: the next generation of a job started (cold, or handed over to its standby ranks),
its standby ranks started ahead of a move, and what a crashed daemon left of either found and ended.

A ``launch`` step re-run after a crash adopts the ranks of its generation that already run and kills older ones
(or standby ranks of a previous daemon, whose channels died with it), so no generation ever runs twice. Used by
:class:`flexmig.act.executor.Executor`; the policy check comes from it (``policy_problem``), since a reload
changes the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexmig.act.durable import Durable
from flexmig.act.events import ActEvent, EventSink
from flexmig.act.genuine import genuine, rank_records
from flexmig.act.instances import Instances
from flexmig.act.journal import Journal, JournalError
from flexmig.act.nodeview import NodeView
from flexmig.act.procs import FoundRank, ProcessScanner, process_alive
from flexmig.act.rankenv import free_port
from flexmig.act.records import JobRecord, Slot, inside
from flexmig.act.steps import ActionRun, StepFailed
from flexmig.act.supervisor import RankHandle, Supervisor
from flexmig.act.userpaths import UserPathError, clear_ack, ensure_dir
from flexmig.hook.protocol import Ack

__all__ = ["Generations"]

log = logging.getLogger("flexmig.act.executor")


@dataclass(frozen=True, slots=True)
class _Launch:
    """What a ``launch`` step starts: its generation, rendezvous port, instances and checkpoint, the standby ranks
    it hands over, and whether it must look for ranks a previous daemon started (a re-run after a crash)."""

    generation: int
    port: int
    slots: tuple[Slot, ...]
    resume: Ack | None
    handover: list[int]
    scan: bool


class Generations:
    """Starts the generations of jobs for one executor (see the module docstring)."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        journal: Journal,
        events: EventSink,
        scanner: ProcessScanner,
        instances: Instances,
        durable: Durable,
        policy_problem: Callable[[JobRecord], str | None],
        wall: Callable[[], float],
        term_grace_s: float,
    ) -> None:
        self.supervisor = supervisor
        self.journal = journal
        self.events = events
        self.scanner = scanner
        self.instances = instances
        self.durable = durable
        self.policy_problem = policy_problem
        self.wall = wall
        self.term_grace_s = term_grace_s

    def refuse_launch(self, rec: JobRecord) -> None:
        """Mark ``rec`` failed and raise StepFailed when the current policy refuses its spec."""
        problem = self.policy_problem(rec)
        if problem is None:
            return
        why = f"not launched: {problem}"
        self.journal.put_job((self.journal.get_job(rec.name) or rec).with_(state="failed", error=why))
        self.events.emit(ActEvent(kind="job_failed", time_s=self.wall(), job=rec.name, error=why))
        raise StepFailed(why)

    async def start_standby(self, run: ActionRun, rec: JobRecord, src: Sequence[Slot], dst: Sequence[Slot]) -> None:
        """The ``standby`` step: start the next generation on the targets that exist now and are not the job's
        own, and wait until those ranks are ready (at most ``standby_timeout_s``). Targets the move must create
        in place of the job's own instances cannot host a rank yet (a rank's device is fixed when it starts):
        their ranks start cold at ``launch``. A standby rank that exits before it is ready cancels the move."""
        slots, early = _standby_slots(await self.instances.view(), src, dst)
        if not early:
            return
        gen = rec.generation + 1
        nxt = rec.with_(generation=gen, slots=tuple(slots))
        args = {"generation": gen, "slots": [s.to_json() for s in slots], "early": early}
        await run.step("standby", args, lambda: self._standby(run, rec, nxt, early))

    async def _standby(self, run: ActionRun, rec: JobRecord, nxt: JobRecord, early: list[int]) -> dict[str, Any]:
        """Start ``nxt``'s ranks of the slots ``early`` as standby ranks and wait until they are ready."""
        await self.prepare_dirs(nxt)
        if run.resumed:  # standby ranks a previous daemon started here have no channel any more
            await self.kill_found(rec, lambda f: f.generation > rec.generation)
        try:
            started = await self.supervisor.launch_standby(nxt, early)
        except OSError as exc:
            raise StepFailed(f"cannot start standby ranks of job {rec.name}: {exc}", outcome="cancelled") from exc
        timeout_s = rec.spec.hook.standby_timeout_s
        t0 = time.monotonic()
        dead = await self.supervisor.wait_standby_ready(rec.name, timeout_s, self.durable.contended)
        if dead:
            await self.supervisor.drop_standby(rec.name, self.term_grace_s)
            raise self._standby_failed(rec, nxt.generation, dead)
        ready = [h.slot for h in self.supervisor.standby(rec.name) if h.ready is not None and h.ready.is_set()]
        if len(ready) < len(started):
            log.warning(
                "job %s: standby ranks %s not ready after %.1f s (%s); checkpointing anyway, and they start "
                "cold after it",
                rec.name,
                sorted(set(early) - set(ready)),
                time.monotonic() - t0,
                "another request waits" if self.durable.contended.is_set() else f"standby_timeout_s {timeout_s:g}",
            )
        return {
            "pids": {str(h.slot): h.proc.pid for h in started},
            "ready": ready,
            "ready_s": round(time.monotonic() - t0, 3),
        }

    def _standby_failed(self, rec: JobRecord, gen: int, dead: Sequence[RankHandle]) -> StepFailed:
        """The cancellation of a move whose standby ranks ``dead`` exited before they were ready."""
        what = ", ".join(
            f"rank {h.slot} exited with status {h.proc.returncode} "
            f"(its log: {self.supervisor.logs_dir / rec.name / f'g{gen:04d}-r{h.slot}.log'})"
            for h in dead
        )
        return StepFailed(
            f"standby of job {rec.name} failed before it was ready: {what}; move cancelled, the job keeps running",
            outcome="cancelled",
            code="STANDBY_FAILED",
        )

    async def drop_standby(self, run: ActionRun, rec: JobRecord) -> None:
        """A move that will not launch: end its standby ranks, and those a previous daemon started for it."""
        await self.supervisor.drop_standby(rec.name, self.term_grace_s)
        if run.resumed and rec.spec.hook.standby:
            await self.kill_found(rec, lambda f: f.generation > rec.generation)

    async def kill_found(self, rec: JobRecord, which: Callable[[FoundRank], bool]) -> list[FoundRank]:
        """SIGKILL the process groups of job ``rec``'s rank processes that ``which`` selects (only what really is
        the job's: :func:`~flexmig.act.genuine.genuine`), and wait (at most a few seconds) until they are gone;
        returns them."""
        found = [f for f in await self.genuine_ranks(rec) if which(f)]
        for f in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(f.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while any(process_alive(f.pid, f.create_time) for f in found) and time.monotonic() < deadline:  # noqa: ASYNC110 - not our children: no exit event to wait on
            await asyncio.sleep(0.02)
        return found

    async def genuine_ranks(self, rec: JobRecord) -> list[FoundRank]:
        """The rank processes carrying ``rec``'s ID that really are its (its user's, in its cgroup, and those the
        journal recorded for its generation): never a decoy of someone else carrying its markers."""
        scanned = await asyncio.to_thread(self.scanner.find, rec.uid)
        recorded = self.journal.recorded_ranks(rec.uid, rec.generation)
        return genuine(scanned, rec, self.supervisor.cgroups, recorded)

    def record_ranks(self, rec: JobRecord) -> None:
        """Journal which processes are the running ranks of ``rec``'s generation (pid, start time, user), for a
        restarted daemon to adopt those and nothing else. A write that fails is one warning: adoption then goes by
        the job's user and cgroup alone."""
        pids = {h.slot: h.proc.pid for h in self.supervisor.alive(rec.name)}
        try:
            self.journal.record_ranks(rec.uid, rec.generation, rank_records(pids))
        except JournalError as exc:
            log.warning("job %s: its ranks' pids and start times not journalled (%s): a restart adopts them by "
                        "their user and cgroup alone", rec.name, exc)  # fmt: skip

    async def launch(
        self, run: ActionRun, name: str, rec: JobRecord, slots: Sequence[Slot], resume: Ack | None
    ) -> None:
        """Launch generation N+1 of ``rec`` on ``slots``: hand over to its standby ranks where it has some, start
        the others; after a crash, adopt what already started."""
        self.refuse_launch(rec)  # a resumed launch too: the journal, not a checked file, says what to run
        plan = self._launch_of(run, name, rec, slots, resume)
        new = run.job(rec.name).with_(
            state="running",
            generation=plan.generation,
            slots=plan.slots,
            resume=plan.resume,
            master_port=plan.port,
            error=None,
        )
        args = {
            "generation": plan.generation,
            "port": plan.port,
            "slots": [s.to_json() for s in plan.slots],
            "resume": plan.resume.to_json() if plan.resume else None,
            "handover": plan.handover,
        }
        await run.step(name, args, lambda: self._start(new, plan), job_before=new, job_failed=new.with_(state="failed"))

    def _launch_of(
        self, run: ActionRun, name: str, rec: JobRecord, slots: Sequence[Slot], resume: Ack | None
    ) -> _Launch:
        """What the ``name`` step of ``run`` starts: as journalled when it ran before, else the next generation."""
        prior = run.args_of(name)
        handover: list[int] = []
        if prior is not None:
            gen, port = int(prior["generation"]), int(prior["port"])
            slots = [Slot.from_json(s) for s in prior["slots"]]
            resume = Ack.from_json(prior["resume"]) if prior.get("resume") else None
            if prior.get("handover"):
                # The previous daemon may have handed some standby ranks over before it died, and their
                # channels died with it: start every rank afresh, as a generation of its own.
                gen, port = gen + 1, free_port()
        else:
            gen, port = rec.generation + 1, free_port()
            if name == "launch":
                live = self.supervisor.standby(rec.name)
                handover = sorted(
                    h.slot
                    for h in live
                    if h.generation == gen and not h.proc.finished() and h.ready is not None and h.ready.is_set()
                )
        scan = prior is not None or (run.resumed and rec.spec.hook.standby)
        if resume is not None and not inside(Path(resume.checkpoint), rec.spec.checkpoint_dir):
            log.warning(
                "job %s: checkpoint %s lies outside its checkpoint_dir %s: not resumed from it",
                rec.name, resume.checkpoint, rec.spec.checkpoint_dir,
            )  # fmt: skip
            resume = None
        return _Launch(gen, port, tuple(slots), resume, handover, scan)

    async def _start(self, new: JobRecord, plan: _Launch) -> dict[str, Any]:
        """The ``launch`` step's work: adopt what runs of generation ``new`` already, hand over to its standby
        ranks, start the rest."""
        await self.prepare_dirs(new)
        gen, port, resume = plan.generation, plan.port, plan.resume
        # Only a re-run after a crash can find ranks of this generation already started (or an older one
        # still running, or standby ranks of a previous daemon); a first run skips the process-table scan,
        # which costs tens of milliseconds.
        found: list[FoundRank] = []
        if plan.scan:  # an older generation still running would make the job run twice
            found = await self.kill_found(new, lambda f: f.generation != gen or f.standby)
            found = [f for f in await self.genuine_ranks(new) if f.generation == gen]
        mine = [f for f in found if not f.standby]
        if not mine:
            try:
                clear_ack(self.supervisor.acks.path(new))
            except UserPathError as exc:  # the job's next checkpoint will be refused for it; launch it anyway
                log.warning("job %s: stale acknowledgement not removed: %s", new.name, exc)
        self.supervisor.forget(new.name)
        await self.supervisor.adopt(new, mine)
        # Standby ranks not handed over (never ready) are ended there before their slots start cold.
        handed = (
            await self.supervisor.handover(new, port=port, resume=resume)
            if plan.handover or self.supervisor.standby(new.name)
            else []
        )
        have = {h.slot for h in self.supervisor.alive(new.name)}
        todo = [i for i in range(len(plan.slots)) if i not in have]
        try:
            await self.supervisor.launch(new, port=port, resume=resume, only=todo)
        except OSError as exc:
            raise StepFailed(f"cannot launch job {new.name}: {exc}") from exc
        self.record_ranks(new)
        return {"pids": {str(h.slot): h.proc.pid for h in self.supervisor.alive(new.name)}, "handed_over": handed}

    async def prepare_dirs(self, rec: JobRecord) -> None:
        """Create the checkpoint directory if missing, owned by the job's user, mode 0700, with no window in which
        the user could make root change another file (:func:`~flexmig.act.userpaths.ensure_dir`)."""
        d = rec.spec.checkpoint_dir
        try:
            uid: int | None = None
            gid: int | None = None
            if os.geteuid() == 0:
                pw = pwd.getpwnam(rec.spec.user)
                uid = pw.pw_uid
                gid = grp.getgrnam(rec.spec.group).gr_gid if rec.spec.group else pw.pw_gid
            await asyncio.to_thread(ensure_dir, d, uid, gid, 0o700)
        except UserPathError as exc:
            raise StepFailed(f"cannot prepare checkpoint_dir of job {rec.name}: {exc}") from exc
        except (OSError, KeyError) as exc:
            raise StepFailed(
                f"cannot create checkpoint_dir {d} for user {rec.spec.user} ({exc}); create it, owned by that user"
            ) from exc


def _standby_slots(view: NodeView, src: Sequence[Slot], dst: Sequence[Slot]) -> tuple[list[Slot], list[int]]:
    """The next generation's instances (with UUIDs where they exist now and are not the job's own), and the slots
    whose ranks can start on standby (those)."""
    own = {s.key for s in src}
    slots: list[Slot] = []
    early: list[int] = []
    for i, d in enumerate(dst):
        inst = view.instance(d.gpu, d.start)
        uuid = inst.uuid if inst is not None and inst.profile == d.profile and d.key not in own else None
        slots.append(Slot(d.gpu, d.start, d.profile, uuid or ""))
        if uuid:
            early.append(i)
    return slots, early
