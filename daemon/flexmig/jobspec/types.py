"""A job spec's parts that are values of their own: what one rank needs, and the checkpoint hook's settings.

Kept apart from :mod:`flexmig.jobspec.spec` so that the key readers (:mod:`flexmig.jobspec.readers`) can build
them without importing the spec's loader.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from flexmig.mig.catalogue import MODELS, GpuModel, Profile
from flexmig.mig.need import fitting_profile, need_mib

__all__ = ["HookSettings", "NeedSpec"]


@dataclass(frozen=True, slots=True)
class NeedSpec:
    """A spec's ``[need]`` table: what one rank needs, a named MIG profile or memory (GiB) and compute slices.

    :meth:`profile_on` picks the profile by the one rule of :func:`flexmig.mig.need.fitting_profile`, which the
    planner follows too (through :func:`flexmig.act.planview.job_request`).
    """

    profile: str | None = None
    memory_gib: float | None = None
    compute_slices: int | None = None

    def describe(self) -> str:
        """For messages: ``1g.18gb`` or ``>= 10 GiB, >= 1 compute slice(s)``."""
        if self.profile:
            return self.profile
        return f">= {self.memory_gib or 0:g} GiB, >= {self.compute_slices or 1} compute slice(s)"

    def profile_on(self, model: GpuModel) -> Profile:
        """The profile a rank gets on ``model``; ValueError when no profile of that model can satisfy the need."""
        if self.profile:
            return model.profile(self.profile)  # KeyError lists the model's profiles
        try:
            fit = fitting_profile(model, need_mib(self.memory_gib or 0.0), self.compute_slices or 1)
        except ValueError:  # not a finite amount of memory
            fit = None
        if fit is None:
            raise ValueError(f"no MIG profile of {model.key} offers {self.describe()}")
        return fit

    def possible_anywhere(self) -> bool:
        """True when some supported GPU model has a profile that satisfies this need."""
        for m in MODELS:
            try:
                self.profile_on(m)
            except (KeyError, ValueError):
                continue
            return True
        return False


@dataclass(frozen=True, slots=True)
class HookSettings:
    """The checkpoint hook's settings for one job."""

    signal: signal.Signals = signal.SIGUSR1
    ack_timeout_s: float = 300.0  # no acknowledgement within this: the move is cancelled, the job keeps running
    exit_timeout_s: float = 30.0  # after the acknowledgement, how long ranks get to exit 0
    standby: bool = False
    """Start the next generation's ranks on a move's targets before the current one checkpoints (the job's script
    calls ``flexmig_hook.install()`` after its start-up; docs/jobs.md, "Standby ranks")."""
    standby_timeout_s: float = 120.0
    """How long a move waits for its standby ranks to be ready before it asks for the checkpoint anyway."""
    keep: int = 2
    """Checkpoints of a series rank 0 keeps after acknowledging one (the acknowledged one and the newest before it;
    0: all): a job moved twice an hour would otherwise leave 48 a day."""
