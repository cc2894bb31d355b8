"""How the journal keeps an action: one typed payload per action kind, encoded to JSON and decoded from it here only.

The journal stores each action as ``(kind, job, payload)`` with a JSON payload. Everything that runs or reports
an action reads that payload through :func:`decode` (or :func:`payload_of` a journal row), never by looking keys
up itself, so the JSON shape of each kind is written down once, below. :func:`encode_action` turns a planner action
into this form; the control API's ``stop`` and the executor's own ``restart`` and undo actions are built from the
payload classes directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from flexmig.act.journal import ActionRow, JournalError
from flexmig.act.records import Slot
from flexmig.errors import PlanRejectedError
from flexmig.plan.types import Action, CreateInstance, DestroyInstance, Instance, MigrateJob, ResplitJob, StartJob

__all__ = [
    "ACTION_KINDS",
    "CreateInstancePayload",
    "DestroyInstancePayload",
    "EncodedAction",
    "MigratePayload",
    "Payload",
    "ResplitPayload",
    "RestartPayload",
    "StartPayload",
    "StopPayload",
    "decode",
    "encode",
    "encode_action",
    "is_undo",
    "payload_of",
    "reason_of",
    "slots_named",
]

EncodedAction = tuple[str, str | None, dict[str, Any]]
"""``(kind, job, JSON payload)``: what :meth:`flexmig.act.journal.Journal.begin_plan` stores per action."""


def _slots_json(slots: Sequence[Slot]) -> list[dict[str, Any]]:
    return [s.to_json() for s in slots]


@dataclass(frozen=True, slots=True)
class CreateInstancePayload:
    """Create the MIG instance at ``slot``."""

    KIND: ClassVar[str] = "create_instance"
    slot: Slot
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON payload."""
        return {"slot": self.slot.to_json(), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class DestroyInstancePayload:
    """Destroy the MIG instance at ``slot``; ``undo``: appended by the executor to remove an instance that its
    plan created and, having stopped early, never used."""

    KIND: ClassVar[str] = "destroy_instance"
    slot: Slot
    reason: str = ""
    undo: bool = False

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON payload (``undo`` only when set, as the journal has always had it)."""
        out: dict[str, Any] = {"slot": self.slot.to_json(), "reason": self.reason}
        if self.undo:
            out["undo"] = True
        return out


@dataclass(frozen=True, slots=True)
class StartPayload:
    """Start the action's job on the instances ``to``, one rank per instance."""

    KIND: ClassVar[str] = "start"
    to: tuple[Slot, ...]
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON payload."""
        return {"to": _slots_json(self.to), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class MigratePayload:
    """Move the action's job from the instances ``sources`` (where it runs) to ``to``, as many ranks."""

    KIND: ClassVar[str] = "migrate"
    sources: tuple[Slot, ...]
    to: tuple[Slot, ...]
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON payload."""
        return {"from": _slots_json(self.sources), "to": _slots_json(self.to), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ResplitPayload:
    """Restart the action's job from ``sources`` on ``to``: ``ranks`` ranks, a new world size."""

    KIND: ClassVar[str] = "resplit"
    sources: tuple[Slot, ...]
    to: tuple[Slot, ...]
    ranks: int
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON payload."""
        return {
            "from": _slots_json(self.sources),
            "to": _slots_json(self.to),
            "ranks": self.ranks,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class StopPayload:
    """Stop the action's job: after an acknowledged checkpoint, or at once (``force``)."""

    KIND: ClassVar[str] = "stop"
    force: bool = False
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON payload."""
        return {"force": self.force, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class RestartPayload:
    """Relaunch the action's job in place from its newest checkpoint (acknowledged after its move was cancelled)."""

    KIND: ClassVar[str] = "restart"
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The journal's JSON payload."""
        return {"reason": self.reason}


Payload = (
    CreateInstancePayload
    | DestroyInstancePayload
    | StartPayload
    | MigratePayload
    | ResplitPayload
    | StopPayload
    | RestartPayload
)
"""An action's payload, typed by its kind."""

ACTION_KINDS = frozenset(
    p.KIND
    for p in (
        CreateInstancePayload,
        DestroyInstancePayload,
        StartPayload,
        MigratePayload,
        ResplitPayload,
        StopPayload,
        RestartPayload,
    )
)
"""Every kind of action the executor runs."""


def encode(payload: Payload, job: str | None = None) -> EncodedAction:
    """``payload`` (for ``job``, on job actions) as the journal keeps it."""
    return payload.KIND, job, payload.to_json()


def _slots(value: Any) -> tuple[Slot, ...]:
    if not isinstance(value, list):
        raise TypeError(f"a list of instances, not {type(value).__name__}")
    return tuple(Slot.from_json(d) for d in value)


def decode(kind: str, payload: Mapping[str, Any]) -> Payload:
    """The typed payload of a journalled action; JournalError names the kind and what is wrong."""
    try:
        reason = str(payload.get("reason", ""))
        if kind == CreateInstancePayload.KIND:
            return CreateInstancePayload(Slot.from_json(payload["slot"]), reason)
        if kind == DestroyInstancePayload.KIND:
            return DestroyInstancePayload(Slot.from_json(payload["slot"]), reason, bool(payload.get("undo")))
        if kind == StartPayload.KIND:
            return StartPayload(_slots(payload["to"]), reason)
        if kind == MigratePayload.KIND:
            return MigratePayload(_slots(payload["from"]), _slots(payload["to"]), reason)
        if kind == ResplitPayload.KIND:
            return ResplitPayload(_slots(payload["from"]), _slots(payload["to"]), int(payload["ranks"]), reason)
        if kind == StopPayload.KIND:
            return StopPayload(bool(payload.get("force")), reason)
        if kind == RestartPayload.KIND:
            return RestartPayload(reason)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise JournalError(f"{kind} action: malformed payload ({exc!r})") from None
    raise JournalError(f"unknown action kind {kind!r}")


def payload_of(row: ActionRow) -> Payload:
    """The typed payload of journal row ``row``; JournalError names the action."""
    try:
        return decode(row.kind, row.payload)
    except JournalError as exc:
        raise JournalError(f"action {row.id}: {exc}") from None


def reason_of(row: ActionRow) -> str:
    """Why the action was planned, for events and listings (empty, never an error, when the payload is broken).

    An action of a kind whose runner was given to the executor (``Executor(runners=...)``) gives its payload's
    ``reason`` string.
    """
    with contextlib.suppress(JournalError):
        return payload_of(row).reason
    reason = row.payload.get("reason") if row.kind not in ACTION_KINDS else None
    return reason if isinstance(reason, str) else ""


def is_undo(row: ActionRow) -> bool:
    """True for the destroy actions the executor appends to undo a stopped plan's unused instances."""
    with contextlib.suppress(JournalError):
        p = payload_of(row)
        return isinstance(p, DestroyInstancePayload) and p.undo
    return False


def slots_named(payload: Payload) -> tuple[Slot, ...]:
    """Every instance the action names: the one it creates or destroys, or a job's sources and targets."""
    if isinstance(payload, CreateInstancePayload | DestroyInstancePayload):
        return (payload.slot,)
    if isinstance(payload, StartPayload):
        return payload.to
    if isinstance(payload, MigratePayload | ResplitPayload):
        return payload.sources + payload.to
    return ()


def _slot(i: Instance) -> Slot:
    return Slot(i.gpu, i.start, i.profile.name)


def encode_action(a: Action) -> EncodedAction:
    """A plan action as the journal keeps it: (kind, job, JSON payload)."""
    if isinstance(a, CreateInstance):
        return encode(CreateInstancePayload(Slot(a.gpu, a.start, a.profile.name), a.reason))
    if isinstance(a, DestroyInstance):
        return encode(DestroyInstancePayload(Slot(a.gpu, a.start, a.profile.name), a.reason))
    if isinstance(a, StartJob):
        return encode(StartPayload(tuple(_slot(i) for i in a.instances), a.reason), a.job)
    if isinstance(a, MigrateJob):
        sources, to = tuple(_slot(i) for i in a.from_instances), tuple(_slot(i) for i in a.to_instances)
        return encode(MigratePayload(sources, to, a.reason), a.job)
    if isinstance(a, ResplitJob):
        sources, to = tuple(_slot(i) for i in a.from_instances), tuple(_slot(i) for i in a.to_instances)
        return encode(ResplitPayload(sources, to, a.ranks, a.reason), a.job)
    raise PlanRejectedError(f"unknown action {a!r}")
