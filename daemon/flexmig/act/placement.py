"""Where an operator's request puts a job: target instances for ``jobs submit``, ``migrate`` and ``resplit``.

The planner (``flexmig.plan``) decides moves of its own; a person who types ``flexmig jobs migrate`` wants the
job moved now, so this small, pure chooser picks the targets and :func:`move_plan` writes the Plan the executor
runs. Preference order: free instances that already exist, then new instances where they fit now, then (when
the job's own instances may make room) new instances overlapping them, created after the job has stopped.

When none of that finds room, :func:`make_room` asks the planner's own placement (:class:`flexmig.plan.scratch.Scratch`,
the flex rules ``flexmig plan`` applies) where the job's instances fit once idle instances in the way are
destroyed: an explicit request gets the same help the planner gives its own moves, and the same limits (an
instance a job holds, one that runs a process or whose processes NVML does not list, and a GPU that is lost are
never touched).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set

from flexmig.act.nodeview import InstanceView, NodeView
from flexmig.act.records import Slot
from flexmig.errors import PlanRejectedError
from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.layout import Layout
from flexmig.plan.geometry import Geometry, demand_weights
from flexmig.plan.scratch import Scratch
from flexmig.plan.shapes import Shape
from flexmig.plan.types import (
    Action,
    CreateInstance,
    DestroyInstance,
    Instance,
    MigrateJob,
    Plan,
    PlannerSettings,
    ResplitJob,
    StartJob,
)

__all__ = ["choose_targets", "make_room", "move_plan", "node_model", "start_plan"]

_OWN = "\x00own"  # the moving job's instances, on the scratch
_NEW = "\x00new"  # the instances being placed for it


def node_model(view: NodeView) -> GpuModel:
    """The model of the node's GPUs (the first known one; flexmig nodes hold one model)."""
    for gpu, model in view.models:
        if model is not None and gpu not in view.lost:
            return model
    raise PlanRejectedError("no usable MIG GPU of a known model on this node")


def choose_targets(
    view: NodeView,
    profile: str,
    count: int,
    *,
    held: Mapping[tuple[int, int], str],
    own: Sequence[Slot] = (),
    keep_own: bool = False,
) -> list[Slot]:
    """``count`` instances of ``profile`` for one job; PlanRejectedError says why there is no room.

    ``held``: instances other jobs hold. ``own``: the job's current instances; with ``keep_own`` those of the
    same profile are reused first (a re-split keeps what it has), otherwise they are avoided unless nothing
    else fits, in which case new instances may overlap them (created after the job stopped).
    """
    chosen: list[Slot] = []
    own_keys = {s.key for s in own}

    def take(s: Slot) -> bool:
        if s.key not in {c.key for c in chosen}:
            chosen.append(s)
        return len(chosen) >= count

    if keep_own:
        for s in own:
            if s.profile == profile and take(Slot(s.gpu, s.start, s.profile)):
                return chosen
    for inst in _idle(view, profile, held.keys() | own_keys):
        if take(Slot(inst.gpu, inst.start, profile)):
            return chosen

    def fill(without: frozenset[tuple[int, int]]) -> bool:
        for gpu in view.gpus():
            model = view.model(gpu)
            layout = view.layout(gpu, without=without)
            if gpu in view.lost or model is None or layout is None:
                continue
            try:
                prof = model.profile(profile)
            except KeyError:
                continue
            for c in chosen:
                if c.gpu == gpu and layout.at(c.start) is None:
                    layout = layout.place(prof, c.start)
            while starts := [s for s in layout.placements(prof) if (gpu, s) not in held]:
                layout = layout.place(prof, starts[0])
                if take(Slot(gpu, starts[0], profile)):
                    return True
        return False

    if fill(frozenset()):
        return chosen
    if own_keys and fill(frozenset(own_keys - {c.key for c in chosen})):
        return chosen
    raise PlanRejectedError(
        f"no room for {count} x {profile}: found {len(chosen)} (free instances and free memory slices included)"
    )


def _idle(view: NodeView, profile: str, taken: Set[tuple[int, int]]) -> Iterator[InstanceView]:
    """The instances of ``profile`` not in ``taken`` that run nothing, on GPUs not lost."""
    for inst in view.instances:
        free = inst.pids is not None and not inst.pids
        if free and inst.profile == profile and inst.key not in taken and inst.gpu not in view.lost:
            yield inst


def make_room(
    view: NodeView,
    profile: str,
    count: int,
    settings: PlannerSettings,
    *,
    held: Mapping[tuple[int, int], str],
    own: Sequence[Slot] = (),
) -> tuple[list[Slot], list[Slot]]:
    """``count`` instances of ``profile`` for one job, placed the planner's way, destroying idle instances in the
    way: the targets, and the instances to destroy first (in that order). PlanRejectedError when even that finds
    no room.

    ``held``: instances other jobs hold; ``own``: the job's current instances (kept, not destroyed: a move leaves
    them after its ranks have stopped). Idle means held by no job, running no process, with a MIG device whose
    processes NVML lists: what the planner may destroy (:func:`flexmig.service.planning.planning_state` blocks the
    rest). Among the placements that fit, the one that keeps the most capacity for ``profile`` wins.
    """
    model = node_model(view)
    geometry = Geometry(model)
    count_gpus = max(view.gpus(), default=-1) + 1
    layouts: list[Layout] = []
    blocked_gpus: set[int] = set()
    for gpu in range(count_gpus):
        layout = view.layout(gpu) if gpu in view.gpus() and gpu not in view.lost else None
        if layout is None or view.model(gpu) != model:
            blocked_gpus.add(gpu)
            layout = Layout.of(model, [])
        layouts.append(layout)
    own_keys = {s.key for s in own}
    holds: dict[str, list[Instance]] = {}
    blocked: set[tuple[int, int]] = set()
    for inst in view.instances:
        if inst.gpu in blocked_gpus:
            continue
        owner = _OWN if inst.key in own_keys else held.get(inst.key)
        if owner is not None:
            holds.setdefault(owner, []).append(Instance(inst.gpu, inst.start, model.profile(inst.profile)))
        elif inst.uuid is None or inst.pids is None or inst.pids:
            blocked.add(inst.key)
    scratch = Scratch(geometry, layouts, holds, settings, blocked=blocked, blocked_gpus=blocked_gpus)
    try:
        wanted = model.profile(profile)
    except KeyError as exc:
        raise PlanRejectedError(str(exc.args[0])) from None
    weights = demand_weights(geometry, {profile: float(count)})
    got = scratch.place_shape(_NEW, Shape(count, wanted), weights, scratch.usable_gpus(), "make room", exact=True)
    if got is None:
        raise PlanRejectedError(
            f"no room for {count} x {profile}, even with every idle instance destroyed (instances that jobs hold or "
            "that run processes are never touched)"
        )
    clear = [Slot(a.gpu, a.start, a.profile.name) for a in scratch.actions if isinstance(a, DestroyInstance)]
    return [Slot(i.gpu, i.start, i.profile.name) for i in got[0]], clear


def _clearing(model: GpuModel, clear: Sequence[Slot], reason: str, settings: PlannerSettings) -> list[Action]:
    """DestroyInstance of each idle instance in the way (before anything is created)."""
    return [
        DestroyInstance(s.gpu, s.start, model.profile(s.profile), f"{reason}: make room", settings.reconfigure_s)
        for s in clear
    ]


def _inst(model: GpuModel, s: Slot) -> Instance:
    return Instance(s.gpu, s.start, model.profile(s.profile))


def start_plan(
    view: NodeView,
    job: str,
    targets: Sequence[Slot],
    settings: PlannerSettings,
    reason: str = "submitted",
    *,
    clear: Sequence[Slot] = (),
) -> Plan:
    """Destroy the idle instances in the way (``clear``, from :func:`make_room`), create the targets that do not
    exist, then start ``job`` on them."""
    model = node_model(view)
    actions: list[Action] = _clearing(model, clear, reason, settings)
    gone = {s.key for s in clear}
    for t in targets:
        if view.instance(t.gpu, t.start) is None or t.key in gone:
            actions.append(CreateInstance(t.gpu, t.start, model.profile(t.profile), reason, settings.reconfigure_s))
    insts = tuple(_inst(model, t) for t in targets)
    actions.append(StartJob(job, insts, reason, settings.restart_s))
    return Plan(tuple(actions))


def _overlaps(model: GpuModel, a: Slot, b: Slot) -> bool:
    if a.gpu != b.gpu:
        return False
    pa: Profile = model.profile(a.profile)
    pb: Profile = model.profile(b.profile)
    return a.start < b.start + pb.memory_slices and b.start < a.start + pa.memory_slices


def move_plan(
    view: NodeView,
    job: str,
    src: Sequence[Slot],
    targets: Sequence[Slot],
    settings: PlannerSettings,
    *,
    resplit: bool,
    reason: str,
    clear: Sequence[Slot] = (),
) -> Plan:
    """Destroy the idle instances in the way (``clear``, from :func:`make_room`), create free-standing targets,
    move the job (migrate or re-split), then destroy the sources it left: all of them after a re-split, as many
    as it created targets after a migration.

    A migration keeps the node's layout: one onto free instances that exist swaps them with the ones it leaves,
    which stay as free instances (the next job of that profile starts at once, and the planner's own placement
    destroys an idle instance when it needs the room, at the cost it would pay anyway); one that created its targets
    destroys one source for each. Destroying every source instead thinned a node of seven 1g instances to one in
    three migrations of a 2-rank job, each later 2-rank start then paying two creates. A re-split changes the job's
    shape, so what it leaves is no swap: it is destroyed, and the planner lays the room out again.

    Targets that overlap the job's own sources are not created up front: the executor destroys those sources
    and creates the targets after the job has stopped (inside the move). Sources overlapped that way are gone
    by the end, so they get no DestroyInstance of their own.
    """
    model = node_model(view)
    src_keys = {s.key for s in src}
    actions: list[Action] = _clearing(model, clear, reason, settings)
    gone = {s.key for s in clear}
    inside: list[Slot] = []
    for t in targets:
        inst = view.instance(t.gpu, t.start)
        if inst is not None and inst.profile == t.profile and t.key not in gone:
            continue
        if any(_overlaps(model, t, s) for s in src):
            inside.append(t)
            continue
        actions.append(CreateInstance(t.gpu, t.start, model.profile(t.profile), reason, settings.reconfigure_s))
    from_i = tuple(_inst(model, s) for s in src)
    to_i = tuple(_inst(model, t) for t in targets)
    cost = settings.move_cost()
    if resplit:
        actions.append(ResplitJob(job, len(targets), model.profile(targets[0].profile), from_i, to_i, reason, cost))
    else:
        actions.append(MigrateJob(job, from_i, to_i, reason, cost))
    target_keys = {t.key for t in targets}
    created = sum(isinstance(a, CreateInstance) for a in actions)  # the targets made before the move
    for s in src:
        if s.key in target_keys or any(_overlaps(model, s, t) for t in inside):
            continue
        if s.key in src_keys and (resplit or created > 0):
            created -= 1
            actions.append(DestroyInstance(s.gpu, s.start, model.profile(s.profile), reason, settings.reconfigure_s))
    return Plan(tuple(actions))
