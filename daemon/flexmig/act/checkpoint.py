"""Checkpointing a job before it is moved or stopped: request, wait for the acknowledgement, wait for the exit.

The daemon asks every rank (the job's hook signal, repeated every ``resend_s`` until rank 0 acknowledges, and to
the ranks still running until they exit), the job saves at its next step boundary and acknowledges with the step
number and the checkpoint's path; no acknowledgement within the job's ``ack_timeout_s`` cancels the move and the
job keeps running. A job whose ranks crash while checkpointing is marked failed; one whose every rank exits 0
without acknowledging finished its work before it could checkpoint, and is done (the move is cancelled). The
acknowledged checkpoint must be a non-empty file, or a directory with something in it (a framework's checkpoint:
Hugging Face's ``checkpoint-N/``, torch.distributed.checkpoint's), inside the job's checkpoint directory.

The acknowledgement and the checkpoint lie in directories the job's user owns: they are read, resolved and removed
through :mod:`flexmig.act.userpaths` (no symlink followed on the way, nothing done by name), and whatever is wrong
with them (a symlink, a directory, a step of 5,000 digits) cancels the move with one line; the job keeps running.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from flexmig.act.events import ActEvent, EventSink
from flexmig.act.records import JobRecord
from flexmig.act.steps import ActionRun, StepFailed
from flexmig.act.supervisor import Supervisor
from flexmig.act.userpaths import UserPathError, clear_ack, has_entries, read_ack_in, resolve_beneath
from flexmig.hook.protocol import Ack, AckError

__all__ = ["Checkpointer", "validate_ack"]


class Checkpointer:
    """Runs a job's checkpoint as journalled steps: ``clear_ack``, ``request``, ``await_ack``, ``await_exit``."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        events: EventSink,
        wall: Callable[[], float],
        poll_s: float,
        resend_s: float,
        term_grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.supervisor = supervisor
        self.events = events
        self.wall = wall
        self.clock = clock
        """Measures every wait (monotonic: a step of the wall clock neither cuts nor stretches a timeout)."""
        self.poll_s = poll_s
        self.resend_s = resend_s
        self.term_grace_s = term_grace_s

    async def checkpoint(self, run: ActionRun, rec: JobRecord) -> Ack:
        """Request a checkpoint, wait for the acknowledgement, then for every rank to exit."""
        spec = rec.spec
        name = rec.name
        ack_path = self.supervisor.acks.path(rec)

        async def clear() -> dict[str, Any]:
            try:
                clear_ack(ack_path)
            except UserPathError as exc:
                why = f"job {name}: {exc}; move cancelled, the job keeps running"
                raise StepFailed(why, outcome="cancelled") from exc
            return {}

        async def request() -> dict[str, Any]:
            return {"pids": self.supervisor.signal_workers(name, int(spec.hook.signal))}

        async def await_ack() -> dict[str, Any]:
            return {"ack": (await self._wait_ack(rec)).to_json()}

        await run.step("clear_ack", {"path": str(ack_path)}, clear)
        await run.step("request", {"signal": spec.hook.signal.name}, request)
        try:
            res = await run.step(
                "await_ack",
                {"timeout_s": spec.hook.ack_timeout_s},
                await_ack,
                job_after=lambda r: run.job(name).with_(last_ack=Ack.from_json(r["ack"])),
            )
        except StepFailed as exc:
            if exc.code == "FINISHED":
                done = run.job(name).with_(state="done", error=None)
                await run.write("end of the job", lambda: run.journal.put_job(done))
                self.events.emit(ActEvent(kind="job_exited", time_s=self.wall(), job=name, detail={"state": "done"}))
            elif exc.outcome == "failed":
                await self.supervisor.terminate(name, self.term_grace_s)
                failed = run.job(name).with_(state="failed", error=str(exc))
                await run.write("failure of the checkpoint", lambda: run.journal.put_job(failed))
                self.events.emit(ActEvent(kind="job_failed", time_s=self.wall(), job=name, error=str(exc)))
            raise
        ack = Ack.from_json(res["ack"])

        async def await_exit() -> dict[str, Any]:
            forced = False
            if not await self._wait_exited(rec):
                forced = True
                await self.supervisor.terminate(name, self.term_grace_s)
            codes = {str(h.slot): h.proc.returncode for h in self.supervisor.ranks(name)}
            strays = await self.supervisor.end_strays(name, self.term_grace_s)
            return {"exit_codes": codes, "forced": forced, **({"strays": strays} if strays else {})}

        await run.step("await_exit", {"timeout_s": spec.hook.exit_timeout_s}, await_exit)
        return ack

    async def _wait_ack(self, rec: JobRecord) -> Ack:
        """Poll for the acknowledgement; repeat the request meanwhile; fail if ranks die without one."""
        spec = rec.spec
        deadline = self.clock() + spec.hook.ack_timeout_s
        next_send = self.clock() + self.resend_s
        while True:
            ack = self._look(rec)
            if ack is not None:
                return ack
            ranks = self.supervisor.ranks(rec.name)
            bad = [h for h in ranks if h.proc.finished() and h.proc.returncode not in (0, None)]
            if bad or (ranks and all(h.proc.finished() for h in ranks)) or not ranks:
                # One last look: the ack may have landed just before the last rank exited.
                ack = self._look(rec)
                if ack is not None:
                    return ack
                if ranks and not bad and all(h.proc.returncode == 0 for h in ranks):
                    raise StepFailed(
                        f"job {rec.name} finished (every rank exited 0) before it could checkpoint; move cancelled, "
                        "the job is done",
                        outcome="cancelled",
                        code="FINISHED",
                    )
                what = ", ".join(f"rank {h.slot} exited with status {h.proc.returncode}" for h in bad) or (
                    "every rank exited"
                )
                raise StepFailed(f"job {rec.name} crashed while checkpointing ({what}) before acknowledging")
            now = self.clock()
            if now >= deadline:
                raise StepFailed(
                    f"job {rec.name} did not acknowledge the checkpoint within {spec.hook.ack_timeout_s:g} s; "
                    "move cancelled, the job keeps running",
                    outcome="cancelled",
                    code="ACK_TIMEOUT",
                )
            if now >= next_send:
                self.supervisor.signal_workers(rec.name, int(spec.hook.signal))
                next_send = now + self.resend_s
            await asyncio.sleep(self.poll_s)

    def _look(self, rec: JobRecord) -> Ack | None:
        """The job's acknowledgement, validated, or None; StepFailed (cancelled, one line) when it is malformed."""
        try:
            ack = read_ack_in(self.supervisor.acks.path(rec))
        except AckError as exc:
            why = f"job {rec.name}: {exc}; move cancelled, the job keeps running"
            raise StepFailed(why, outcome="cancelled") from exc
        return None if ack is None else validate_ack(rec, ack)

    async def _wait_exited(self, rec: JobRecord) -> bool:
        """Wait up to the job's ``exit_timeout_s`` for every rank to exit, asking those still running again every
        ``resend_s``: only rank 0 acknowledges, so a rank that was not listening yet when the request came (its
        signal starts ignored until its hook is installed; a move right after a launch) has to be asked again, or
        it would run on until the timeout and be killed. False on timeout."""
        spec = rec.spec
        deadline = self.clock() + spec.hook.exit_timeout_s
        while True:
            left = deadline - self.clock()
            if left <= 0:
                return False
            if await self.supervisor.wait_exited(rec.name, min(self.resend_s, left)):
                return True
            self.supervisor.signal_workers(rec.name, int(spec.hook.signal))


def validate_ack(rec: JobRecord, ack: Ack) -> Ack:
    """The acknowledged checkpoint, resolved; StepFailed (cancelled) unless it lies inside the job's checkpoint
    directory and is a non-empty file or a directory with at least one entry.

    The path is taken as the job wrote it (relative to its working directory), must lie inside the checkpoint
    directory as written, and is resolved inside that directory alone (:func:`~flexmig.act.userpaths.resolve_beneath`:
    a symlink within it is followed, one that leads out is refused). A daemon without CAP_DAC_READ_SEARCH (a unit of
    one's own) may not be allowed to look inside the job's directory; then only the path is checked, and the job's
    word taken for the rest.
    """
    root = rec.spec.checkpoint_dir
    named = Path(os.path.normpath(rec.spec.working_dir / ack.checkpoint))
    if named != root and root not in named.parents:
        raise StepFailed(
            f"job {rec.name} acknowledged a checkpoint outside {root}: {ack.checkpoint}", outcome="cancelled"
        )
    try:
        found = resolve_beneath(root, named)
    except UserPathError as exc:
        raise StepFailed(f"job {rec.name} acknowledged {ack.checkpoint}: {exc}", outcome="cancelled") from exc
    except OSError:
        why = f"job {rec.name} acknowledged a missing or empty checkpoint {named}"
        raise StepFailed(why, outcome="cancelled") from None
    if found is None:  # the daemon may not look inside: the job's word for it
        return replace(ack, checkpoint=str(named))
    real, st = found
    if stat.S_ISDIR(st.st_mode) and real != root:
        try:
            if has_entries(root, real):
                return replace(ack, checkpoint=str(real))
        except PermissionError:
            return replace(ack, checkpoint=str(real))
        except (OSError, UserPathError):
            pass
    elif stat.S_ISREG(st.st_mode) and st.st_size > 0:
        return replace(ack, checkpoint=str(real))
    raise StepFailed(f"job {rec.name} acknowledged a missing or empty checkpoint {named}", outcome="cancelled")
