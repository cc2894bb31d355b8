"""The values the planner reads and writes: jobs, requests, node state, settings, actions and plans.

These types are the contract between ``plan/`` (which builds plans), ``act/`` (which executes them) and
``replay/`` (which replays traces through the same planner). They are frozen values; nothing here does I/O
or reads a clock.

Identity rules:

* a MIG instance is ``(gpu index, start memory slice)``: the start is unique on a GPU because placements never
  overlap. GPU-instance IDs belong to the driver and never appear in a plan;
* a job is its ``name``, unique on the node.

Semantics of a plan (checked by :func:`flexmig.plan.validate.validate_plan`): the actions run in order, one at a
time. ``CreateInstance``/``DestroyInstance`` change one GPU's layout; a destroyed instance must hold no job. A
job starts, migrates or re-splits onto instances that exist at that point and that no job holds; the instances it
leaves stay (free) until a later ``DestroyInstance`` removes them. So every intermediate layout is one the
hardware accepts (each instance at one of its profile's allowed starts, none overlapping), and a job is never
on two sets of instances at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.layout import Layout

__all__ = [
    "DISCIPLINES",
    "Action",
    "CreateInstance",
    "DestroyInstance",
    "Discipline",
    "Instance",
    "JobRequest",
    "MigrateJob",
    "NodeState",
    "Plan",
    "PlannerSettings",
    "RankNeed",
    "ResplitJob",
    "RunningJob",
    "StartJob",
]


# --------------------------------------------------------------------------------------------- instances
@dataclass(frozen=True, slots=True, order=True)
class Instance:
    """A MIG GPU instance as the planner names it: GPU ``gpu``, first memory slice ``start``, of ``profile``.

    One rank of one job runs per instance (CUDA shows one MIG device per process).
    """

    gpu: int
    start: int
    profile: Profile

    @property
    def key(self) -> tuple[int, int]:
        """``(gpu, start)``: what identifies the instance on the node."""
        return (self.gpu, self.start)

    def spec(self) -> str:
        """``gpu3:3g.71gb@4``, for reasons and logs."""
        return f"gpu{self.gpu}:{self.profile.name}@{self.start}"


# ------------------------------------------------------------------------------------------------- jobs
@dataclass(frozen=True, slots=True)
class RankNeed:
    """What one rank of a job needs: a profile by name, or memory and compute to cover.

    With ``profile`` set, the rank gets exactly that profile. Otherwise the planner picks the smallest plain
    profile of the node's model with at least ``compute_slices`` compute slices and ``memory_mib`` memory
    (:func:`flexmig.plan.shapes.profile_for_need`, by the rule of :func:`flexmig.mig.need.fitting_profile`). A job
    spec's ``[need]`` (:class:`flexmig.jobspec.spec.NeedSpec`, memory in GiB) becomes one of these in
    :func:`flexmig.act.planview.job_request`.
    """

    profile: str | None = None
    memory_mib: int = 0
    compute_slices: int = 0


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job waiting to start (or waiting to resume after a checkpoint).

    ``ranks`` is the nominal number of ranks, each needing ``need``. A job is *elastic* when
    ``min_ranks < max_ranks``: it may then run as any number ``n`` of ranks in that range, all of one profile
    ``P``, provided ``n * P.compute_slices`` covers the nominal compute (``ranks`` times the nominal profile's
    compute slices) and ``P`` holds ``rank_memory_mib``. Such a spread runs at
    ``PlannerSettings.spread_efficiency`` of the speed its slices would give as one instance.

    A job is *malleable* when ``malleable`` is set: it may also run *below* its nominal compute (fewer ranks
    than ``ranks``, down to ``min_ranks``, or, for a one-rank job, one rank of a smaller profile), at a speed
    proportional to the compute it holds, and is re-split up when room frees (:mod:`flexmig.plan.grow`). A job
    spec is malleable when ``ranks.min`` is below ``ranks.start`` (:func:`flexmig.act.planview.job_request`).

    ``expected_runtime_s`` is the run time at the nominal shape, if known (the planner uses it to weigh moves);
    ``submitted_s`` orders the queue (FIFO, with backfilling). ``movable`` and ``move_cost_s`` are what the job's
    :class:`RunningJob` should carry once it runs (whoever starts it copies them; the replay does).
    """

    name: str
    need: RankNeed
    ranks: int = 1
    min_ranks: int = 1
    max_ranks: int = 1
    rank_memory_mib: int = 0
    submitted_s: float = 0.0
    expected_runtime_s: float | None = None
    movable: bool = True
    move_cost_s: float | None = None
    malleable: bool = False
    standby: bool = False
    """Its moves start the next generation before the checkpoint (``[hook] standby``): they cost
    ``PlannerSettings.standby_restart_s`` to restart, not ``restart_s``."""

    @property
    def elastic(self) -> bool:
        """True when the job may run with another number of ranks than ``ranks``."""
        return self.min_ranks < self.max_ranks


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds instances now: one rank per instance of ``instances``.

    ``nominal`` is the request it was started from (its shape, elasticity and cost). ``movable`` False means the
    planner never migrates, re-splits or disturbs it (no checkpoint hook, or an operator pinned it).
    ``move_cost_s`` overrides the settings' checkpoint + restart estimate for this job. ``last_moved_s`` is when
    it last started, migrated or re-split (the settling time counts from there). ``remaining_s`` is the expected
    run time left at its current shape, if known.
    """

    name: str
    instances: tuple[Instance, ...]
    nominal: JobRequest
    movable: bool = True
    move_cost_s: float | None = None
    last_moved_s: float | None = None
    remaining_s: float | None = None

    @property
    def profile(self) -> Profile:
        """The profile of the job's ranks (all ranks of a job share one profile)."""
        return self.instances[0].profile

    @property
    def ranks(self) -> int:
        """How many ranks (instances) it runs on now."""
        return len(self.instances)


@dataclass(frozen=True, slots=True)
class NodeState:
    """Everything the planner sees of one node at time ``now_s``.

    ``layouts[i]`` is GPU ``i``'s layout (every instance that exists, free or held). ``running`` jobs hold
    instances of those layouts; ``pending`` is the queue in arrival order. ``blocked`` are instances the planner
    must neither destroy nor use (for instance: they run processes of no registered job, as detect/ or the
    actuator found); ``blocked_gpus`` are GPUs it must not touch at all (lost, or held by someone else).
    """

    model: GpuModel
    layouts: tuple[Layout, ...]
    running: tuple[RunningJob, ...] = ()
    pending: tuple[JobRequest, ...] = ()
    now_s: float = 0.0
    blocked: frozenset[tuple[int, int]] = frozenset()
    blocked_gpus: frozenset[int] = frozenset()


# --------------------------------------------------------------------------------------------- settings
Discipline = Literal["easy", "greedy"]
"""The queue discipline (:mod:`flexmig.plan.queue`): EASY backfilling, or greedy backfilling without a reservation."""
DISCIPLINES: tuple[Discipline, ...] = ("easy", "greedy")


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """Action costs and planning rules: the one set of planner defaults, which ``flexmigd``'s ``[planner]`` table
    and ``python -m flexmig.actuatord`` start from. Costs are estimates in seconds.

    Defaults and why:

    * ``checkpoint_s`` 1: from the checkpoint request to the job's ranks having exited, as ``bench/migration.py``
      measures it for the torch DDP example (2 ranks, gloo): the acknowledgement comes in 40-70 ms; ranks that end
      with ``Hook.exit`` are gone 0.1 s later, ranks that leave through the interpreter's teardown 1.1 s later;
    * ``restart_s`` 5: from the acknowledgement to the job's first step after resuming when the new ranks start
      cold (process start, ``import torch``, model, optimizer, process group): 4.9 s for the same example on a
      lightly loaded 2-core machine, 10 s under heavy load (the daemon's own part is 0.05-0.15 s);
    * ``standby_restart_s`` 0.5: the same for a job with standby ranks (``[hook] standby``), whose next generation
      did its start-up before the request: 0.3-0.55 s for the same example, under heavy load;
    * ``reconfigure_s`` 5: one GPU-instance create or destroy on hardware ("order of seconds" in public sources;
      the simulator cannot measure it);
    * ``spread_efficiency`` 0.9: a job spread over several instances (one rank per instance, collectives over
      host shared memory, as MIG instances have no P2P or NVLink between them) runs at 90% of the speed its
      compute slices would give in one instance;
    * ``settling_s`` 300: a job moved (started, migrated, re-split) is not moved again for five minutes;
    * ``gain_margin`` 0.1: a move happens only when its expected gain is at least (1 + ``gain_margin``) times its
      cost (:attr:`gain_ratio`), here 1.1 times;
    * ``resplit``/``migrate``/``repartition_busy``: switch the three mechanisms off, e.g. for comparisons
      (``repartition_busy`` off: instances are created only on GPUs where no job runs);
    * ``discipline`` ``"easy"``: the queue's head gets a reservation that backfilled jobs may not delay (EASY
      backfilling, what ``flexmigd`` does); ``"greedy"``: no reservation, every job that fits starts
      (:mod:`flexmig.plan.queue`);
    * ``malleable``: malleable jobs (:attr:`JobRequest.malleable`) may start or keep running below their nominal
      compute and are grown back when room frees; off, every job runs at its nominal compute or more;
    * ``max_moves`` 8: moves (migrations and re-splits) in one plan, to bound disruption;
    * ``unknown_wait_s`` 1800: how long a blocked job is assumed to wait when the running jobs' remaining times
      are unknown (the gain a move that unblocks it is weighed by).

    Trace replay models larger jobs and uses its own costs (``flexmig.replay.costs.REPLAY_SETTINGS``).
    """

    checkpoint_s: float = 1.0
    restart_s: float = 5.0
    standby_restart_s: float = 0.5
    reconfigure_s: float = 5.0
    spread_efficiency: float = 0.9
    settling_s: float = 300.0
    gain_margin: float = 0.1
    resplit: bool = True
    migrate: bool = True
    repartition_busy: bool = True
    malleable: bool = True
    discipline: Discipline = "easy"
    max_moves: int = 8
    unknown_wait_s: float = 1800.0

    @property
    def gain_ratio(self) -> float:
        """How many times its cost a move must gain: ``1 + gain_margin`` (the one place the margin is converted)."""
        return 1.0 + self.gain_margin

    def move_cost(self, override_s: float | None = None, *, standby: bool = False) -> float:
        """Downtime of moving one job: checkpoint plus restart (a standby restart for a job with standby ranks),
        or the job's own figure."""
        if override_s is not None:
            return override_s
        return self.checkpoint_s + (self.standby_restart_s if standby else self.restart_s)


# ---------------------------------------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class DestroyInstance:
    """Destroy the (free) GPU instance at ``gpu``/``start`` (with its compute instances)."""

    gpu: int
    start: int
    profile: Profile
    reason: str
    cost_s: float


@dataclass(frozen=True, slots=True)
class CreateInstance:
    """Create a GPU instance of ``profile`` at ``gpu``/``start``, with one compute instance spanning it."""

    gpu: int
    start: int
    profile: Profile
    reason: str
    cost_s: float


@dataclass(frozen=True, slots=True)
class StartJob:
    """Launch (or resume from its checkpoint) ``job`` with one rank per instance of ``instances``."""

    job: str
    instances: tuple[Instance, ...]
    reason: str
    cost_s: float


@dataclass(frozen=True, slots=True)
class MigrateJob:
    """Checkpoint ``job``, stop its ranks on ``from_instances``, relaunch the same ranks on ``to_instances``."""

    job: str
    from_instances: tuple[Instance, ...]
    to_instances: tuple[Instance, ...]
    reason: str
    cost_s: float


@dataclass(frozen=True, slots=True)
class ResplitJob:
    """Checkpoint ``job`` and relaunch it as ``ranks`` ranks of ``profile`` on ``to_instances`` (new world size)."""

    job: str
    ranks: int
    profile: Profile
    from_instances: tuple[Instance, ...]
    to_instances: tuple[Instance, ...]
    reason: str
    cost_s: float


Action = DestroyInstance | CreateInstance | StartJob | MigrateJob | ResplitJob


@dataclass(frozen=True, slots=True)
class Plan:
    """An ordered tuple of actions, built at ``now_s``; empty when nothing is worth doing."""

    actions: tuple[Action, ...] = ()
    now_s: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def cost_s(self) -> float:
        """Sum of the actions' estimated costs (an upper bound on the time the plan takes run serially)."""
        return sum(a.cost_s for a in self.actions)

    def __len__(self) -> int:
        return len(self.actions)

    def __bool__(self) -> bool:
        return bool(self.actions)
