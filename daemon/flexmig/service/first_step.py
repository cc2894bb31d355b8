"""The job's own downtime in a move: from its last step before the checkpoint to its first step after the move.

flexmig sees only its share of a move's pause (the old ranks had exited to the new ranks started,
:func:`flexmig.service.action_record.move_downtime`); the job loses more: the save, the exit, its start-up, the load,
the rendezvous and its first step. The hook tells both ends over the acknowledgement's channel: the
acknowledgement carries when the last step before it ended (``step_done_s``), and rank 0 of the resumed generation
writes a first-step report beside it once its first step is done (:class:`flexmig_hook.protocol.FirstStep`).

:class:`FirstSteps` remembers each completed move whose job has yet to report, and :meth:`FirstSteps.poll` (at every
sweep) reads the reports that came: the report is read as an acknowledgement is (its directory reached with no
symlink followed, the file not followed, bounded), then removed. A move waits at most ``keep_s`` for its report:
a job whose hook is older than this, or that never completes a step, has no job-side figure.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flexmig.act.userpaths import UserPathError, open_dir, remove_in
from flexmig.hook.protocol import AckError, FirstStep, first_step_path, read_first_step

__all__ = ["FirstSteps", "Resumed"]


@dataclass(frozen=True, slots=True)
class Resumed:
    """A moved job that reported its first step: the move, and the job's downtime in it (with flexmig's share)."""

    job: str
    action: str
    action_id: int
    generation: int
    downtime_s: float
    pause_s: float | None


@dataclass(frozen=True, slots=True)
class _Awaited:
    action: str
    action_id: int
    generation: int
    step_done_s: float
    pause_s: float | None
    report: Path
    since_s: float


class FirstSteps:
    """Completed moves waiting for their job's first-step report (one per job: a later move replaces it)."""

    def __init__(self, keep_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep_s = keep_s
        self.clock = clock
        self._awaited: dict[str, _Awaited] = {}

    def expect(
        self,
        job: str,
        *,
        action: str,
        action_id: int,
        generation: int,
        step_done_s: float,
        pause_s: float | None,
        ack_path: Path,
    ) -> None:
        """Wait for generation ``generation`` of ``job`` to report its first step; its last step before the move
        ended at ``step_done_s`` (the acknowledgement's). The report may be there already (a standby rank steps
        within milliseconds of its handover); one of an earlier generation is not taken for it."""
        report = first_step_path(ack_path)
        self._awaited[job] = _Awaited(action, action_id, generation, step_done_s, pause_s, report, self.clock())

    def forget(self, job: str) -> None:
        """Stop waiting for ``job`` (it stopped, failed or moves again)."""
        self._awaited.pop(job, None)

    def waiting(self) -> list[str]:
        """The jobs whose report is still awaited."""
        return sorted(self._awaited)

    def poll(self) -> list[Resumed]:
        """The awaited jobs that reported since the last call (their reports removed); waits past ``keep_s`` end
        without a figure. A report of another generation is left for its own move; one that cannot be read (a
        symlink, not JSON) ends the wait, without a figure."""
        out: list[Resumed] = []
        now = self.clock()
        for job, w in list(self._awaited.items()):
            try:
                got = _read(w.report)
            except (AckError, UserPathError, OSError):
                got = None
                self._awaited.pop(job, None)
            if got is not None and got.generation == w.generation:
                self._awaited.pop(job, None)
                self._remove(w.report)
                downtime = max(0.0, got.step_done_s - w.step_done_s)
                out.append(Resumed(job, w.action, w.action_id, w.generation, downtime, w.pause_s))
            elif now - w.since_s > self.keep_s:
                self._awaited.pop(job, None)
        return out

    @staticmethod
    def _remove(report: Path) -> None:
        with contextlib.suppress(OSError, UserPathError):
            fd = open_dir(report.parent)
            try:
                remove_in(fd, report.name, report)
            finally:
                os.close(fd)


def _read(report: Path) -> FirstStep | None:
    """The report at ``report`` (None while there is none or its directory does not exist)."""
    try:
        fd = open_dir(report.parent)
    except FileNotFoundError:
        return None
    try:
        return read_first_step(Path(report.name), dir_fd=fd)
    finally:
        os.close(fd)
