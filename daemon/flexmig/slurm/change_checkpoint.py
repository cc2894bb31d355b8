"""The steps of a Slurm re-registration that move its hook jobs: each one signalled, its acknowledgement awaited and
checked, then requeued held; released once the node is registered again (or the change is cancelled).

:class:`CheckpointSteps` is a part of :class:`flexmig.slurm.change.SlurmChange` (its base). An acknowledgement is
trusted only if the file belongs to the job's user, lies in the job's checkpoint directory (computed as the
TaskProlog does), is newer than the one before the request, and names a non-empty regular file inside that
directory.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexmig.act.steps import StepFailed
from flexmig.act.userpaths import UserPathError, open_dir, resolve_beneath
from flexmig.errors import SlurmError
from flexmig.slurm.change_types import ChangeSettings, StepRunner
from flexmig.slurm.client import SlurmClient
from flexmig.slurm.hookcheck import job_checkpoint_dir
from flexmig.slurm.taskprolog import ACK_NAME
from flexmig_hook.protocol import Ack, AckError, read_ack

__all__ = ["CheckpointSteps"]


def _ack_stamp(path: Path) -> dict[str, Any] | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return {"mtime_ns": st.st_mtime_ns, "size": st.st_size, "ino": st.st_ino}


class CheckpointSteps:
    """The hook-job steps of :class:`flexmig.slurm.change.SlurmChange` (see the module docstring)."""

    client: SlurmClient
    settings: ChangeSettings
    clock: Callable[[], float]
    on_event: Callable[[str, dict[str, Any]], None]

    async def _checkpoint(self, run: StepRunner, job: dict[str, Any]) -> bool:
        """Signal job ``job``, wait for its acknowledgement, requeue it held. False if it ended by itself."""
        job_id = int(job["job_id"])
        ack_path = self._ack_path(job)
        base = await run.step(f"baseline:{job_id}", {"ack": str(ack_path)}, lambda: self._baseline(ack_path))
        sent = await run.step(f"signal:{job_id}", {"signal": self.settings.signal}, lambda: self._signal(job_id))
        if sent.get("ended"):
            return False
        got = await run.step(
            f"await_ack:{job_id}",
            {"timeout_s": self.settings.ack_timeout_s},
            lambda: self._await_ack(job, ack_path, base.get("stamp")),
        )
        if got.get("ended"):
            return False
        await run.step(f"hold:{job_id}", {"job_id": job_id}, lambda: self._hold(job_id))
        self.on_event("slurm_job_requeued", {"slurm_job": job_id, "step": got.get("ack", {}).get("step")})
        return True

    def _ack_path(self, job: dict[str, Any]) -> Path:
        # The template's fixed part is the operator's (it may lie below a symlink such as /var/tmp -> /tmp): resolved
        # there; the part a job's user owns is then walked with no symlink followed (flexmig.act.userpaths).
        try:
            d = job_checkpoint_dir(
                self.settings.checkpoint_dir, job["job_id"], job.get("user", ""), job.get("user_id", "")
            )
        except (ValueError, KeyError) as exc:
            raise StepFailed(
                f"Slurm job {job.get('job_id')}: no checkpoint directory: {exc}", outcome="cancelled"
            ) from exc
        return d / ACK_NAME

    async def _baseline(self, ack_path: Path) -> dict[str, Any]:
        return {"stamp": _ack_stamp(ack_path)}

    async def _job_state(self, job_id: int) -> str | None:
        try:
            jobs = await self.client.jobs()
        except SlurmError as exc:
            raise StepFailed(str(exc), outcome="cancelled", code="SLURM") from exc
        found = next((j for j in jobs if j.job_id == job_id), None)
        return found.state if found is not None else None

    async def _signal(self, job_id: int) -> dict[str, Any]:
        state = await self._job_state(job_id)
        if state != "RUNNING":
            return {"ended": True, "state": state}
        try:
            await self.client.signal_batch(job_id, self.settings.signal)
        except SlurmError as exc:
            raise StepFailed(str(exc), outcome="cancelled", code="SLURM") from exc
        self.on_event("slurm_job_signalled", {"slurm_job": job_id, "signal": self.settings.signal})
        return {"signalled": True}

    async def _await_ack(self, job: dict[str, Any], ack_path: Path, before: dict[str, Any] | None) -> dict[str, Any]:
        job_id = int(job["job_id"])
        deadline = self.clock() + self.settings.ack_timeout_s
        next_state = self.clock()
        while True:
            stamp = _ack_stamp(ack_path)
            if stamp is not None and stamp != before:
                ack = self._validate(job, ack_path)
                if ack is not None:
                    return {"ack": ack.to_json()}
            if self.clock() >= next_state:
                state = await self._job_state(job_id)
                if state not in ("RUNNING", "COMPLETING"):
                    return {"ended": True, "state": state}
                next_state = self.clock() + 2.0
            if self.clock() >= deadline:
                raise StepFailed(
                    f"Slurm job {job_id} did not acknowledge the checkpoint within {self.settings.ack_timeout_s:g} s",
                    outcome="cancelled",
                    code="ACK_TIMEOUT",
                )
            await asyncio.sleep(self.settings.poll_s)

    def _validate(self, job: dict[str, Any], ack_path: Path) -> Ack | None:
        """The acknowledgement if it is the job's own and names a checkpoint in its directory; None if not yet.

        The directory is the job user's: it is opened with no symlink followed and everything in it is read
        relative to it (:mod:`flexmig.act.userpaths`). An acknowledgement that is not valid (a symlink, a
        directory, another user's file, a step of 5,000 digits, a checkpoint outside the directory) cancels the
        move with one line, StepFailed; the job is left running and nothing is requeued."""
        job_id = job.get("job_id")

        def cancel(why: str) -> StepFailed:
            text = f"Slurm job {job_id}: acknowledgement {ack_path}: {why}; move cancelled"
            return StepFailed(text, outcome="cancelled")

        try:
            fd = open_dir(ack_path.parent)
        except FileNotFoundError:
            return None
        except (UserPathError, PermissionError) as exc:
            raise cancel(str(exc)) from exc
        try:
            try:
                st = os.stat(ack_path.name, dir_fd=fd, follow_symlinks=False)
                ack = read_ack(Path(ack_path.name), dir_fd=fd)
            except FileNotFoundError:
                return None
            except (OSError, AckError) as exc:
                raise cancel(str(exc)) from exc
        finally:
            os.close(fd)
        if ack is None:
            return None
        uid = job.get("user_id")
        if isinstance(uid, int) and st.st_uid != uid:
            raise cancel(f"it belongs to uid {st.st_uid}, not the job's {uid}")
        root = ack_path.parent
        named = Path(os.path.normpath(root / ack.checkpoint))
        try:
            found = resolve_beneath(root, named)
        except UserPathError as exc:
            raise cancel(str(exc)) from exc
        except OSError:
            return None
        if found is None or not stat.S_ISREG(found[1].st_mode) or found[1].st_size == 0:
            return None
        return Ack(ack.step, str(found[0]))

    async def _hold(self, job_id: int) -> dict[str, Any]:
        try:
            jobs = await self.client.jobs()
            found = next((j for j in jobs if j.job_id == job_id), None)
            if found is not None and found.pending:
                return {"already": found.reason}
            if found is None or not found.active:
                return {"ended": True}
            await self.client.requeue_hold(job_id)
        except SlurmError as exc:
            raise StepFailed(str(exc), code="SLURM") from exc
        return {"held": True}

    async def _release(self, job_id: int) -> dict[str, Any]:
        try:
            jobs = await self.client.jobs()
            found = next((j for j in jobs if j.job_id == job_id), None)
            if found is None or not found.pending or not found.reason.startswith("JobHeld"):
                return {"not_held": found.state if found else None}
            await self.client.release(job_id)
        except SlurmError as exc:
            raise StepFailed(str(exc), code="SLURM") from exc
        self.on_event("slurm_job_released", {"slurm_job": job_id})
        return {"released": True}
