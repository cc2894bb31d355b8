"""What the actuator remembers about each job across restarts: spec, state, instances, generation, checkpoints.

A job record lives in the journal's database and changes only inside journalled steps, in the same transaction
as the step's intent, so after a crash the record and the journal agree. Instances are named the planner's way,
``(gpu, start)``, plus the MIG device UUID the ranks were given (UUIDs change when an instance is re-created).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from flexmig.act.userpaths import UserPathError, ensure_dir, opened_dir
from flexmig.hook.protocol import Ack
from flexmig.jobspec.spec import JobSpec

__all__ = ["AckPlacement", "JobRecord", "JobState", "Slot", "inside"]

#: ``pending``: submitted, not started; ``running``: ranks up (or being checked after a restart); ``stopped``:
#: stopped by an operator after a checkpoint; ``failed``: ranks crashed or a move could not be undone; ``done``:
#: every rank exited 0 without a checkpoint request.
JobState = Literal["pending", "running", "stopped", "failed", "done"]
JOB_STATES: tuple[str, ...] = ("pending", "running", "stopped", "failed", "done")


@dataclass(frozen=True, slots=True, order=True)
class Slot:
    """One rank's place: MIG instance ``(gpu, start)`` of ``profile``, seen by CUDA as ``uuid``."""

    gpu: int
    start: int
    profile: str
    uuid: str = ""

    @property
    def key(self) -> tuple[int, int]:
        """``(gpu, start)``."""
        return (self.gpu, self.start)

    def spec(self) -> str:
        """``gpu0:1g.18gb@3``."""
        return f"gpu{self.gpu}:{self.profile}@{self.start}"

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"gpu": self.gpu, "start": self.start, "profile": self.profile, "uuid": self.uuid}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Slot:
        """Inverse of :meth:`to_json`."""
        return cls(int(d["gpu"]), int(d["start"]), str(d["profile"]), str(d.get("uuid", "")))


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A registered job.

    ``uid`` is unique per submission and travels in every rank's environment (``FLEXMIG_JOB_ID``) with the
    ``generation`` (bumped at every launch), which is how a restarted daemon finds and adopts its ranks.
    ``resume`` is the checkpoint the current generation started from; ``last_ack`` the newest acknowledged one.
    ``master_port`` is the rendezvous port of the current generation.
    """

    name: str
    uid: str
    spec: JobSpec
    state: JobState
    generation: int = 0
    slots: tuple[Slot, ...] = ()
    resume: Ack | None = None
    last_ack: Ack | None = None
    master_port: int = 0
    error: str | None = None
    submitted_s: float = 0.0
    updated_s: float = 0.0

    def with_(self, **changes: Any) -> JobRecord:
        """A copy with ``changes``."""
        return replace(self, **changes)

    def summary(self) -> dict[str, Any]:
        """What ``flexmig jobs list --json`` shows for this job. Only a running job holds instances: a job that ended
        (stopped, failed, done) lists none, since the instances it ran on may belong to another job by now."""
        held = self.slots if self.state == "running" else ()
        return {
            "name": self.name,
            "state": self.state,
            "ranks": len(held),
            "instances": [s.to_json() for s in held],
            "generation": self.generation,
            "resume": self.resume.to_json() if self.resume else None,
            "last_ack": self.last_ack.to_json() if self.last_ack else None,
            "error": self.error,
            "launcher": self.spec.launcher,
            "user": self.spec.user,
        }


@dataclass(frozen=True, slots=True)
class AckPlacement:
    """Where each job acknowledges checkpoints (``FLEXMIG_ACK_PATH``).

    ``directory`` None: in the job's checkpoint directory. Set it when the daemon's root lacks CAP_DAC_OVERRIDE
    (the shipped systemd unit) and so cannot read inside job directories: acknowledgements then go to a
    daemon-owned directory, mode 1733 (anyone may create a file, nobody may list it, only the owner may remove it),
    under a name no other user can guess (it holds the job's random ID).
    """

    directory: Path | None = None

    def path(self, rec: JobRecord) -> Path:
        """The acknowledgement file of ``rec``'s current submission."""
        if self.directory is None:
            return rec.spec.ack_path
        return self.directory / f"{rec.name}.{rec.uid}.ack.json"

    def prepare(self) -> AckPlacement:
        """Create the directory (mode 1733) if one is configured; returns the placement with the directory's path
        resolved (the operator's configuration may name it through a symlink such as ``/var/run``: acknowledgements
        are then read from the real directory, through which no symlink is followed)."""
        if self.directory is None:
            return self
        real = Path(os.path.realpath(self.directory))
        ensure_dir(real, None, None, 0o1733)
        with opened_dir(real) as fd:
            st = os.fstat(fd)
            if st.st_uid not in (0, os.geteuid()):
                raise UserPathError(f"acknowledgement directory {real}: owned by uid {st.st_uid}, not the daemon's")
            os.fchmod(fd, 0o1733)
        return AckPlacement(real)


def inside(path: Path, root: Path) -> bool:
    """True when ``path``, normalised, is ``root`` or lies below it (by name: no link is followed)."""
    p = Path(os.path.normpath(path))
    return p == root or root in p.parents
