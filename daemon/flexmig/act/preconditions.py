"""What must hold before an action starts, checked on one view of the node: pure functions, no I/O.

Each check raises :class:`~flexmig.act.steps.Refused` naming the first rule that fails; then nothing was done.
The rules that keep jobs safe live here: a job's targets exist, no other job holds them, and no instance that an
action would use or destroy runs a process of no registered job. :func:`layout_changes` decides, also purely,
which of a moving job's instances must go and which targets must be created.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from flexmig.act.nodeview import NodeView
from flexmig.act.records import JobRecord, Slot
from flexmig.act.steps import Refused
from flexmig.mig.catalogue import MODELS

__all__ = [
    "check_destroy",
    "check_movable",
    "check_move_targets",
    "check_start_targets",
    "check_startable",
    "layout_changes",
    "overlap",
]

Held = Mapping[tuple[int, int], str]
"""Instances held by running jobs: ``(gpu, start) -> job``."""


def overlap(a: Slot, b: Slot) -> bool:
    """True when the two instances share a memory slice of one GPU."""
    if a.gpu != b.gpu:
        return False
    sa, sb = _size(a.profile), _size(b.profile)
    return a.start < b.start + sb and b.start < a.start + sa


def _size(profile: str) -> int:
    for m in MODELS:
        for p in m.profiles:
            if p.name == profile:
                return p.memory_slices
    return 8  # unknown profile: assume it may overlap anything on its GPU


def check_destroy(slot: Slot, held: Held) -> None:
    """A standalone destroy never takes an instance from a running job."""
    holder = held.get(slot.key)
    if holder is not None:
        raise Refused(f"{slot.spec()} is held by job {holder}")


def check_startable(rec: JobRecord) -> None:
    """A job starts only when it is not running."""
    if rec.state == "running":
        raise Refused(f"job {rec.name} is already running")


def check_start_targets(rec: JobRecord, dst: Sequence[Slot], view: NodeView, held: Held) -> None:
    """A job starts only on targets that exist, that no other job holds (``held`` leaves the job itself out),
    and that run no process."""
    for d in dst:
        if d.gpu in view.lost:
            raise Refused(f"GPU {d.gpu} is lost")
        inst = view.instance(d.gpu, d.start)
        if inst is None or inst.profile != d.profile:
            raise Refused(f"target {d.spec()} does not exist")
        if d.key in held:
            raise Refused(f"target {d.spec()} is held by job {held[d.key]}")
        if inst.pids is None or inst.pids:
            raise Refused(f"target {d.spec()} runs processes of no registered job: {sorted(inst.pids or [])}")


def check_movable(rec: JobRecord, src: Sequence[Slot], dst: Sequence[Slot], *, alive: int) -> None:
    """A job moves only while running with all its ranks (``alive`` of them run), from where it runs, to at least
    one target."""
    if rec.state != "running":
        raise Refused(f"job {rec.name} is {rec.state}, not running")
    if {s.key for s in rec.slots} != {s.key for s in src}:
        have = ", ".join(s.spec() for s in rec.slots)
        raise Refused(f"job {rec.name} runs on {have}, not on the plan's source instances")
    if alive != len(rec.slots):
        raise Refused(f"job {rec.name} does not have all its ranks running")
    if not dst:
        raise Refused("no target instances")


def check_move_targets(
    rec: JobRecord, src: Sequence[Slot], dst: Sequence[Slot], view: NodeView, held: Held, *, mine: Collection[int]
) -> None:
    """A job moves only to targets that fit once its own overlapping sources are gone and that no other job holds
    (``held`` leaves the job itself out), and only when no process but its own (``mine``) runs on its sources or
    on the targets it already has."""
    for s in src:
        inst = view.instance(s.gpu, s.start)
        if inst is None:
            raise Refused(f"source {s.spec()} does not exist")
        foreign = set(inst.pids or ()) - set(mine)
        if inst.pids is None or foreign:
            raise Refused(f"{inst.spec()} runs processes of no registered job: {sorted(foreign)}")
    own = frozenset(s.key for s in src)
    missing: list[Slot] = []
    for d in dst:
        if d.gpu in view.lost:
            raise Refused(f"GPU {d.gpu} is lost")
        if d.key in held:
            raise Refused(f"target {d.spec()} is held by job {held[d.key]}")
        inst = view.instance(d.gpu, d.start)
        if inst is not None and inst.profile == d.profile:
            if inst.pids is None or set(inst.pids) - (set(mine) if d.key in own else set()):
                raise Refused(f"target {d.spec()} runs processes of no registered job")
            continue
        if inst is not None and inst.key not in own:
            raise Refused(f"target {d.spec()} is occupied by {inst.spec()}")
        missing.append(d)
    # The missing targets must fit once the job's own overlapping sources are gone.
    for gpu in {d.gpu for d in missing}:
        gone = frozenset(s.key for s in src if any(overlap(s, d) for d in missing))
        layout = view.layout(gpu, without=gone)
        model = view.model(gpu)
        if layout is None or model is None:
            raise Refused(f"GPU {gpu}: unknown model or layout")
        for d in (d for d in missing if d.gpu == gpu):
            try:
                prof = model.profile(d.profile)
            except KeyError as exc:
                raise Refused(str(exc.args[0])) from None
            why = layout.why_not(prof, d.start)
            if why:
                raise Refused(f"cannot create {d.spec()}: {why}")
            layout = layout.place(prof, d.start)


def layout_changes(view: NodeView, src: Sequence[Slot], dst: Sequence[Slot]) -> tuple[list[Slot], list[Slot]]:
    """(the sources to destroy, the targets to create) for a move from ``src`` to ``dst``: the targets missing
    from ``view`` (or there with another profile), and the sources that overlap one of them."""
    missing = [d for d in dst if (i := view.instance(d.gpu, d.start)) is None or i.profile != d.profile]
    destroy = [s for s in src if any(overlap(s, d) for d in missing)]
    return destroy, missing
