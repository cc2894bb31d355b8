"""What to do this round with a layout change on a Slurm node, once :func:`flexmig.plan.reregistration.choose` has
weighed it: the glue between the verdict and flexmig's reservation (``flexmig-<node>``), in one place.

Slurm cannot change a node's GPUs while a job runs on it, so a change on a busy node waits: it is *committed* as a
reservation that starts when the node's jobs are expected to have ended (jobs that end before it still start). Each
round then decides one :class:`Step`:

* no change committed: nothing (the plan changes no instance, or the verdict says no), change now (only hook jobs,
  or none, run), or commit, the reservation starting ``close_in_s`` from now;
* a change committed: abandon it (its demand is gone: the plan no longer changes instances, or the verdict says
  no), carry it out (the node's immovable jobs are gone), move it earlier (jobs ended early: the node is expected
  to empty more than ``min_move_s`` before the reservation starts), or wait (for the jobs, or for a reservation that
  is ending without its change).

The Slurm agent (:class:`flexmig.slurm.agent.SlurmAgent`) acts on the step with Slurm's commands, and the offline
model of a node (``bench/slurm_model.py``) calls this same function, so the model runs the agent's own decisions.

Pure: time is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["ENDING", "FOR_JOBS", "GONE_NO_GO", "GONE_NO_INSTANCES", "Committed", "Step", "StepKind", "next_step"]

StepKind = Literal["nothing", "change", "commit", "earlier", "abandon", "wait"]
"""What a round does: ``nothing``; ``change`` now; ``commit`` the change (its reservation starts ``start_in_s``
from now); move the reservation ``earlier`` (to ``start_in_s`` from now); ``abandon`` the committed change;
``wait``."""

GONE_NO_INSTANCES = "the plan no longer changes instances"
"""An ``abandon`` step's reason: the best layout is today's."""
GONE_NO_GO = "the verdict says no"
"""An ``abandon`` step's reason: staying is better now."""
ENDING = "the reservation is ending"
"""A ``wait`` step's reason: the reservation has started and ends within ``ending_s`` (Slurm removes it)."""
FOR_JOBS = "the node's jobs run"
"""A ``wait`` step's reason: the committed change waits for the node's immovable jobs to end."""


@dataclass(frozen=True, slots=True)
class Committed:
    """flexmig's reservation for a committed change: its window (seconds, the clock ``now_s`` is on), and whether
    Slurm reports it started (``ACTIVE``) whatever the window says, so that a clock a little apart from the
    controller's never moves a reservation that has begun."""

    start_s: float
    end_s: float
    started: bool = False

    def active(self, now_s: float) -> bool:
        """Started (Slurm says so, or its window holds ``now_s``)."""
        return self.started or self.start_s <= now_s < self.end_s


@dataclass(frozen=True, slots=True)
class Step:
    """One round's decision: its kind, where a reservation starts (``commit``, ``earlier``: seconds from now, never
    negative), and why (``abandon``, ``wait``)."""

    kind: StepKind
    start_in_s: float = 0.0
    reason: str = ""


def next_step(
    committed: Committed | None,
    *,
    changes: bool,
    go: bool,
    busy: bool,
    now_s: float,
    close_in_s: float,
    ending_s: float = 1.0,
    min_move_s: float = 2.0,
) -> Step:
    """This round's step for a layout change (the module docstring).

    ``committed``: flexmig's reservation (a change waits), or None; ``changes``: the plan creates or destroys an
    instance (:func:`flexmig.plan.reregistration.changes_instances`); ``go``: the verdict's; ``busy``: jobs that
    cannot checkpoint run on the node; ``close_in_s``: seconds until the node is expected to be empty of them
    (:func:`flexmig.plan.reregistration.close_in_s`), where a reservation starts; ``ending_s``: a started reservation
    this close to its end is left to end; ``min_move_s``: a reservation moves earlier only by more than this (so a
    round's jitter never moves it). ValueError naming the argument when a figure is not a finite number, a margin or
    ``close_in_s`` is negative, or the reservation ends before it starts.
    """
    _check(committed, now_s, close_in_s, ending_s, min_move_s)
    if committed is None:
        if not changes or not go:
            return Step("nothing")
        if not busy:
            return Step("change")
        return Step("commit", close_in_s)
    if not changes or not go:
        return Step("abandon", reason=GONE_NO_INSTANCES if not changes else GONE_NO_GO)
    if not busy:
        return Step("change")
    active = committed.active(now_s)
    if active and now_s >= committed.end_s - ending_s:
        return Step("wait", reason=ENDING)
    if not active and now_s + close_in_s < committed.start_s - min_move_s:
        return Step("earlier", close_in_s)
    return Step("wait", reason=FOR_JOBS)


def _check(committed: Committed | None, now_s: float, close_in_s: float, ending_s: float, min_move_s: float) -> None:
    """ValueError naming the first bad argument of :func:`next_step`."""
    figures = {"now_s": now_s, "close_in_s": close_in_s, "ending_s": ending_s, "min_move_s": min_move_s}
    if committed is not None:
        figures |= {"committed.start_s": committed.start_s, "committed.end_s": committed.end_s}
    for name, x in figures.items():
        if not math.isfinite(x):
            raise ValueError(f"next_step: {name} must be a finite number of seconds, not {x!r}")
    for name in ("close_in_s", "ending_s", "min_move_s"):
        if figures[name] < 0:
            raise ValueError(f"next_step: {name} must not be negative, not {figures[name]!r}")
    if committed is not None and committed.end_s < committed.start_s:
        raise ValueError(
            f"next_step: committed reservation ends ({committed.end_s!r}) before it starts ({committed.start_s!r})"
        )
