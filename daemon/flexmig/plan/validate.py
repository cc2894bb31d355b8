"""Replaying a plan onto the pure model, action by action, refusing the first one the hardware or a rule would refuse.

:func:`validate_plan` is what the planner's tests, the replay engine and the actuator (before it touches a GPU)
run. It checks, at every step:

* each create is a placement the GPU accepts *now* (no overlap, allowed start, instance and compute limits, in
  memory slices), each destroy names an instance that exists, with its profile, and that nobody holds;
* a job starts once, from the queue, on instances that exist and are free, in a shape its request allows;
* a migrated or re-split job is running, movable, not moved within the settling time, moved at most once, and
  lands on instances that exist and are free (or its own);
* nothing touches a blocked instance or GPU;
* at the end, every job that ran before still runs, on as many instances as it should, and no instance has
  two owners (no job lost or duplicated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flexmig.errors import PlanRejectedError
from flexmig.mig.layout import Layout
from flexmig.plan.shapes import Shape, shape_allowed
from flexmig.plan.types import (
    CreateInstance,
    DestroyInstance,
    Instance,
    JobRequest,
    MigrateJob,
    NodeState,
    Plan,
    PlannerSettings,
    ResplitJob,
    StartJob,
)

__all__ = ["Outcome", "check_state", "validate_plan"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The node after a plan: every GPU's layout and which instances each job holds."""

    layouts: tuple[Layout, ...]
    holds: Mapping[str, tuple[Instance, ...]]

    def free_instances(self) -> list[Instance]:
        """Instances that exist and no job holds."""
        held = {(i.gpu, i.start) for insts in self.holds.values() for i in insts}
        return [
            Instance(g, i.start, i.profile)
            for g, lay in enumerate(self.layouts)
            for i in lay.instances
            if (g, i.start) not in held
        ]


def check_state(state: NodeState) -> None:
    """Refuse a node state that cannot be real: unknown GPUs or instances, shared instances, duplicate names."""
    names: set[str] = set()
    held: dict[tuple[int, int], str] = {}
    for lay in state.layouts:
        if lay.model != state.model:
            raise PlanRejectedError(f"node state mixes {lay.model.key} with {state.model.key}")
        bad = lay.violations()
        if bad:
            raise PlanRejectedError(f"node state holds an invalid layout: {bad[0]}")
    for name in (*(j.name for j in state.running), *(r.name for r in state.pending)):
        if name in names:
            raise PlanRejectedError(f"job {name!r} appears twice in the node state")
        names.add(name)
    for run in state.running:
        if not run.instances:
            raise PlanRejectedError(f"running job {run.name!r} holds no instance")
        if len({i.profile for i in run.instances}) != 1:
            raise PlanRejectedError(f"running job {run.name!r} has ranks of different profiles")
        for inst in run.instances:
            _exists(state.layouts, inst, f"running job {run.name!r}")
            other = held.get(inst.key)
            if other is not None:
                raise PlanRejectedError(f"{inst.spec()} is held by both {other!r} and {run.name!r}")
            held[inst.key] = run.name


def _exists(layouts: tuple[Layout, ...] | list[Layout], inst: Instance, who: str) -> None:
    if not 0 <= inst.gpu < len(layouts):
        raise PlanRejectedError(f"{who}: GPU {inst.gpu} does not exist (node has {len(layouts)})")
    placed = layouts[inst.gpu].at(inst.start)
    if placed is None or placed.profile != inst.profile:
        raise PlanRejectedError(f"{who}: no {inst.profile.name} instance at {inst.spec()}")


def _shape_allowed(state: NodeState, request: JobRequest, instances: tuple[Instance, ...]) -> bool:
    if not instances or len({i.profile for i in instances}) != 1:
        return False
    return shape_allowed(state.model, request, Shape(len(instances), instances[0].profile))


_Refuse = Callable[[str], PlanRejectedError]
"""Makes the error that names the action being replayed and why it is refused."""


class _Replayed:
    """The node as a plan is replayed onto it, one action at a time; each method checks one kind of action and applies
    it, or raises what ``refuse`` makes of the reason."""

    def __init__(self, state: NodeState, settings: PlannerSettings | None) -> None:
        self.state = state
        self.settings = settings
        self.layouts = list(state.layouts)
        self.holds: dict[str, tuple[Instance, ...]] = {j.name: j.instances for j in state.running}
        self.owner: dict[tuple[int, int], str] = {i.key: j for j, insts in self.holds.items() for i in insts}
        self.running = {j.name: j for j in state.running}
        self.pending = {j.name: j for j in state.pending}
        self.started: set[str] = set()
        self.moved: set[str] = set()

    def reconfigure(self, action: DestroyInstance | CreateInstance, refuse: _Refuse) -> None:
        """A destroy of a free, unblocked instance that exists; a create at a placement the GPU accepts now."""
        layouts = self.layouts
        if not 0 <= action.gpu < len(layouts):
            raise refuse(f"GPU {action.gpu} does not exist")
        if action.gpu in self.state.blocked_gpus:
            raise refuse(f"GPU {action.gpu} is blocked")
        if isinstance(action, CreateInstance):
            why = layouts[action.gpu].why_not(action.profile, action.start)
            if why:
                raise refuse(f"cannot create {action.profile.name}@{action.start} on GPU {action.gpu}: {why}")
            layouts[action.gpu] = layouts[action.gpu].place(action.profile, action.start)
            return
        placed = layouts[action.gpu].at(action.start)
        if placed is None or placed.profile != action.profile:
            raise refuse(f"no {action.profile.name} at gpu{action.gpu}@{action.start} to destroy")
        if (action.gpu, action.start) in self.state.blocked:
            raise refuse(f"gpu{action.gpu}@{action.start} is blocked")
        if (action.gpu, action.start) in self.owner:
            raise refuse(f"gpu{action.gpu}@{action.start} is held by {self.owner[(action.gpu, action.start)]!r}")
        layouts[action.gpu] = layouts[action.gpu].remove(action.start)

    def start(self, action: StartJob, refuse: _Refuse) -> None:
        """A queued job starts once, on free instances that exist, in a shape its request allows."""
        request = self.pending.get(action.job)
        if request is None:
            raise refuse(f"{action.job!r} is not waiting in the queue")
        if action.job in self.started:
            raise refuse(f"{action.job!r} is started twice")
        _take(self.layouts, self.owner, self.state, action.job, action.instances, own=(), refuse=refuse)
        if not _shape_allowed(self.state, request, action.instances):
            raise refuse(f"{action.job!r} may not run on {len(action.instances)} such instance(s)")
        self.holds[action.job] = action.instances
        self.started.add(action.job)

    def move(self, action: MigrateJob | ResplitJob, refuse: _Refuse) -> None:
        """A running, movable, settled job moves once, from exactly what it holds, to a shape it may take."""
        job = self.running.get(action.job)
        if job is None:
            raise refuse(f"{action.job!r} is not running")
        if not job.movable:
            raise refuse(f"{action.job!r} may not be moved")
        if action.job in self.moved:
            raise refuse(f"{action.job!r} is moved twice in one plan")
        now, settings = self.state.now_s, self.settings
        if settings is not None and job.last_moved_s is not None and now - job.last_moved_s < settings.settling_s:
            raise refuse(f"{action.job!r} moved {now - job.last_moved_s:.0f}s ago, inside the settling time")
        if set(action.from_instances) != set(self.holds[action.job]):
            raise refuse(f"{action.job!r} does not hold exactly the instances it is moved from")
        if isinstance(action, MigrateJob):
            same = len(action.to_instances) == len(action.from_instances)
            if not same or {i.profile for i in action.to_instances} != {job.profile}:
                raise refuse(f"a migration keeps {action.job!r}'s ranks and profile; re-split to change them")
        else:
            to = action.to_instances
            if len(to) != action.ranks or any(i.profile != action.profile for i in to):
                raise refuse(f"re-split of {action.job!r} names {action.ranks}x{action.profile.name}")
            if not _shape_allowed(self.state, job.nominal, action.to_instances):
                raise refuse(f"{action.job!r} may not run as {action.ranks}x{action.profile.name}")
        own = action.from_instances
        _take(self.layouts, self.owner, self.state, action.job, action.to_instances, own=own, refuse=refuse)
        for inst in action.from_instances:
            self.owner.pop(inst.key, None)
        for inst in action.to_instances:
            self.owner[inst.key] = action.job
        self.holds[action.job] = action.to_instances
        self.moved.add(action.job)

    def finish(self) -> Outcome:
        """Every job that ran before still runs, and no instance has two owners."""
        for name in self.running:
            if not self.holds.get(name):
                raise PlanRejectedError(f"running job {name!r} holds no instance after the plan")
        seen: dict[tuple[int, int], str] = {}
        for name, insts in self.holds.items():
            for inst in insts:
                if inst.key in seen:
                    raise PlanRejectedError(f"{inst.spec()} ends up held by {seen[inst.key]!r} and {name!r}")
                seen[inst.key] = name
        return Outcome(tuple(self.layouts), dict(self.holds))


def validate_plan(
    state: NodeState, plan: Plan, settings: PlannerSettings | None = None, *, check: bool = True
) -> Outcome:
    """Replay ``plan`` on ``state``; the final node, or PlanRejectedError naming the first bad action and why.

    With ``settings`` the settling time is enforced too. ``check`` False skips :func:`check_state` for a state
    the caller built from a previous outcome.
    """
    if check:
        check_state(state)
    node = _Replayed(state, settings)
    for n, action in enumerate(plan.actions, 1):
        where = f"action {n} ({type(action).__name__})"

        def refuse(why: str, where: str = where) -> PlanRejectedError:
            return PlanRejectedError(f"{where}: {why}")

        if isinstance(action, DestroyInstance | CreateInstance):
            node.reconfigure(action, refuse)
        elif isinstance(action, StartJob):
            node.start(action, refuse)
        elif isinstance(action, MigrateJob | ResplitJob):
            node.move(action, refuse)
        else:  # pragma: no cover - the Action union is closed
            raise refuse("unknown action")
    return node.finish()


def _take(
    layouts: list[Layout],
    owner: dict[tuple[int, int], str],
    state: NodeState,
    job: str,
    instances: tuple[Instance, ...],
    *,
    own: tuple[Instance, ...],
    refuse: _Refuse,
) -> None:
    """Check ``instances`` exist, are free (or among ``own``) and unblocked, then give them to ``job``."""
    mine = {i.key for i in own}
    if len({i.key for i in instances}) != len(instances):
        raise refuse(f"{job!r} names one instance twice")
    for inst in instances:
        if inst.gpu in state.blocked_gpus or inst.key in state.blocked:
            raise refuse(f"{inst.spec()} is blocked")
        try:
            _exists(layouts, inst, repr(job))
        except PlanRejectedError as exc:
            raise refuse(str(exc)) from None
        holder = owner.get(inst.key)
        if holder is not None and inst.key not in mine:
            raise refuse(f"{inst.spec()} is held by {holder!r}")
    for inst in instances:
        owner[inst.key] = job
