"""Events: what flexmig tells the fleet when something changes on the node.

Every event is a JSON object with an envelope (``schema_version``, a unique ``id``, ``time`` in UTC, ``node``,
``kind``) and a ``payload`` whose shape depends on the kind; ``schemas/event.v1.schema.json`` in the repository is
the JSON Schema of both. Events are published on ``<prefix>/<node>/events/<kind>`` at QoS 1, which delivers at
least once: consumers de-duplicate by ``id`` (see :class:`Deduplicator`).
"""

from __future__ import annotations

import enum
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flexmig.detect import (
    EndedFinding,
    Finding,
    FragmentationFinding,
    InstanceChange,
    OversizedFinding,
    Report,
    UnderuseFinding,
)
from flexmig.hook.boundedjson import JsonBoundsError
from flexmig.hook.boundedjson import loads as bounded_loads

_MAX_EVENT_BYTES = 8 * 1024 * 1024  # an event read back (the outbox, the wire) is JSON of at most this
_MAX_EVENT_DEPTH = 32

__all__ = [
    "NODE_NAME",
    "SCHEMA_VERSION",
    "Deduplicator",
    "Event",
    "EventFactory",
    "EventKind",
    "events_from_report",
    "format_time",
]

SCHEMA_VERSION = 1
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""A node name: one MQTT topic level, no wildcards, no slash."""


class EventKind(enum.StrEnum):
    """The kinds of events; each is also the last level of its topic."""

    INSTANCE_CREATED = "instance_created"
    INSTANCE_DESTROYED = "instance_destroyed"
    UNDERUSE_STARTED = "underuse_started"
    UNDERUSE_ENDED = "underuse_ended"
    FRAGMENTATION_ABOVE = "fragmentation_above"
    FRAGMENTATION_BELOW = "fragmentation_below"
    GPU_LOST = "gpu_lost"
    ACTION_STARTED = "action_started"
    ACTION_COMPLETED = "action_completed"
    ACTION_FAILED = "action_failed"
    ACTION_CANCELLED = "action_cancelled"
    ACTION_SKIPPED = "action_skipped"
    JOB_STARTED = "job_started"
    JOB_EXITED = "job_exited"
    JOB_FAILED = "job_failed"
    RECONCILED = "reconciled"
    PLAN_PROPOSED = "plan_proposed"
    SLURM_UNREACHABLE = "slurm_unreachable"
    SLURM_REACHABLE = "slurm_reachable"
    SLURM_PLAN = "slurm_plan"
    SLURM_JOB_SIGNALLED = "slurm_job_signalled"
    SLURM_JOB_REQUEUED = "slurm_job_requeued"
    SLURM_JOB_RELEASED = "slurm_job_released"
    SLURM_NODE = "slurm_node"
    SLURM_CARVING = "slurm_carving"


def format_time(at: float) -> str:
    """Unix seconds as RFC 3339 UTC with milliseconds (``2025-01-02T03:04:05.678Z``)."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True, slots=True)
class Event:
    """One event. ``at`` is Unix seconds; ``payload`` holds JSON values only."""

    id: str
    at: float
    node: str
    kind: EventKind
    payload: Mapping[str, Any]
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The JSON object published on the wire."""
        return {
            "schema_version": self.schema_version,
            "id": self.id,
            "time": format_time(self.at),
            "node": self.node,
            "kind": self.kind.value,
            "payload": dict(self.payload),
        }

    def to_json(self) -> str:
        """Compact JSON; NaN and infinities are refused (they are not JSON)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, data: bytes | str) -> Event:
        """Parse an event from the wire; ValueError says which field is wrong (messages come from the network)."""
        try:
            obj = bounded_loads(data, max_bytes=_MAX_EVENT_BYTES, max_depth=_MAX_EVENT_DEPTH)
        except JsonBoundsError as exc:
            raise ValueError(str(exc) if str(exc).startswith("not JSON") else f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        for key, typ in (("id", str), ("time", str), ("node", str), ("kind", str), ("payload", dict)):
            if not isinstance(obj.get(key), typ):
                raise ValueError(f"field {key!r} missing or not a {typ.__name__}")
        version = obj.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError("field 'schema_version' missing or not an integer")
        try:
            kind = EventKind(obj["kind"])
        except ValueError:
            raise ValueError(f"unknown kind {obj['kind']!r}") from None
        try:
            at = _parse_time(obj["time"])
        except ValueError:
            raise ValueError(f"field 'time' is not an RFC 3339 time: {obj['time']!r}") from None
        return cls(obj["id"], at, obj["node"], kind, obj["payload"], version)


class EventFactory:
    """Makes events for one node: fresh IDs (UUID4 unless injected) and the time from an injectable clock."""

    def __init__(
        self,
        node: str,
        *,
        clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        if not NODE_NAME.fullmatch(node):
            raise ValueError(f"node name {node!r} is not one MQTT topic level ([A-Za-z0-9][A-Za-z0-9._-]{{0,62}})")
        self.node = node
        self._clock = clock
        self._new_id = new_id

    def make(self, kind: EventKind, payload: Mapping[str, Any], at: float | None = None) -> Event:
        """An event of ``kind`` now (or at ``at``)."""
        return Event(self._new_id(), self._clock() if at is None else at, self.node, kind, dict(payload))

    def gpu_lost(self, gpu: int, uuid_: str | None, at: float | None = None) -> Event:
        """NVML reported the GPU as lost (``GPU_IS_LOST``); nothing on it can be trusted until it is back."""
        reason = f"NVML reports GPU {gpu} as lost (GPU_IS_LOST); its instances and jobs are in an unknown state"
        return self.make(EventKind.GPU_LOST, {"gpu": gpu, "uuid": uuid_, "reason": reason}, at)


def _instance(change: InstanceChange, uuids: Mapping[tuple[int, int], str]) -> dict[str, Any]:
    """The instance as the change saw it: its own UUID first, else the one ``uuids`` had at its place (for a
    destroyed instance, the previous sweep's mapping: the current one names whatever replaced it)."""
    return {
        "gpu": change.gpu,
        "start": change.start,
        "profile": change.profile,
        "uuid": change.uuid or uuids.get((change.gpu, change.start)),
    }


def _finding_started(f: Finding, uuids: Mapping[tuple[int, int], str]) -> tuple[EventKind, dict[str, Any]]:
    if isinstance(f, UnderuseFinding):
        return EventKind.UNDERUSE_STARTED, {
            "finding": f.level,
            "gpu": f.gpu,
            "start": f.start,
            "profile": f.profile,
            "uuid": f.uuid or uuids.get((f.gpu, f.start)),
            "since": format_time(f.since),
            "activity": f.activity,
            "memory_ratio": f.memory_ratio,
            "processes": f.processes,
            "reason": f.reason,
        }
    if isinstance(f, OversizedFinding):
        return EventKind.UNDERUSE_STARTED, {
            "finding": "oversized",
            "gpu": f.gpu,
            "start": f.start,
            "profile": f.profile,
            "uuid": f.uuid or uuids.get((f.gpu, f.start)),
            "since": format_time(f.since),
            "activity": f.activity,
            "memory_used_bytes": f.memory_used_bytes,
            "suggested_profile": f.suggested,
            "reason": f.reason,
        }
    return EventKind.FRAGMENTATION_ABOVE, _fragmentation(f)


def _fragmentation(f: FragmentationFinding) -> dict[str, Any]:
    return {
        "gpu": f.gpu,
        "model": f.model,
        "layout": f.layout,
        "since": format_time(f.since),
        "score": round(f.score, 6),
        "threshold": f.threshold,
        "free_compute_slices": f.free_compute_slices,
        "stranded_compute_slices": f.stranded_compute_slices,
        "recoverable_compute_slices": f.recoverable_compute_slices,
        "recoverable_profile": f.recoverable_profile,
        "unfit_profiles": list(f.unfit),
        "reason": f.reason,
    }


def _finding_ended(e: EndedFinding, uuids: Mapping[tuple[int, int], str]) -> tuple[EventKind, dict[str, Any]]:
    f = e.finding
    common = {"since": format_time(f.since), "duration_s": round(e.duration_s, 3), "reason": e.reason}
    if isinstance(f, FragmentationFinding):
        return EventKind.FRAGMENTATION_BELOW, {"gpu": f.gpu, "model": f.model, **common}
    level = "oversized" if isinstance(f, OversizedFinding) else f.level
    where = {"gpu": f.gpu, "start": f.start, "profile": f.profile, "uuid": f.uuid or uuids.get((f.gpu, f.start))}
    return EventKind.UNDERUSE_ENDED, {"finding": level, **where, **common}


def events_from_report(
    report: Report,
    factory: EventFactory,
    *,
    instance_uuids: Mapping[tuple[int, int], str] | None = None,
    gpu_uuids: Mapping[int, str] | None = None,
    previous_uuids: Mapping[tuple[int, int], str] | None = None,
) -> list[Event]:
    """The events of one detection sweep, stamped with the sweep's time: lost GPUs, destroyed then created
    instances, ended then started findings (so a consumer replaying them in order ends up in the right state).

    Each instance event describes the instance as it was: the UUID detection saw it with, else (a report made
    without UUIDs) ``previous_uuids`` (the previous sweep's (GPU, start) -> MIG device UUID) for a destroyed
    instance and ``instance_uuids`` (this sweep's) for a created one and for findings; ``gpu_uuids`` maps GPU
    index to UUID.
    """
    uuids = instance_uuids or {}
    before = previous_uuids or {}
    at = report.now
    out = [factory.gpu_lost(g, (gpu_uuids or {}).get(g), at) for g in report.lost]
    out += [factory.make(EventKind.INSTANCE_DESTROYED, _instance(c, before), at) for c in report.destroyed]
    out += [factory.make(EventKind.INSTANCE_CREATED, _instance(c, uuids), at) for c in report.created]
    for e in report.ended:
        kind, payload = _finding_ended(e, uuids)
        out.append(factory.make(kind, payload, at))
    for f in report.started:
        kind, payload = _finding_started(f, uuids)
        out.append(factory.make(kind, payload, at))
    return out


class Deduplicator:
    """Remembers the last ``capacity`` event IDs, so QoS 1 redeliveries are shown once."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def first_time(self, event_id: str) -> bool:
        """True the first time ``event_id`` is seen (within the last ``capacity`` IDs)."""
        if event_id in self._seen:
            self._seen.move_to_end(event_id)
            return False
        self._seen[event_id] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True
