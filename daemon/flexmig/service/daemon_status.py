"""The running daemon's status document (``flexmig status``, the ``status`` control request): the latest sweep's
node and findings with the actuator's jobs, mode, actions in progress and recent, ranks of no job and job cgroups.
Served from memory and the journal, never from NVML."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flexmig.act.service import Actuator
from flexmig.metrics.findings import report_of
from flexmig.service.action_record import action_json
from flexmig.status import status_document
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["daemon_status"]


def daemon_status(
    snap: Snapshot,
    act: Actuator | None,
    *,
    mode: str,
    in_progress: int,
    unavailable: str | None,
    unknown_ranks: Sequence[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The status document of ``snap`` with ``act``'s jobs and recent actions (none while the actuator is not
    running: ``unavailable`` then says why)."""
    jobs: list[dict[str, Any]] = []
    recent: list[dict[str, Any]] = []
    if act is not None:
        jobs = [act.jobs.summary(rec) for rec in act.journal.jobs()]
        recent = [action_json(r) for r in act.journal.recent_actions(10)]
    doc = status_document(
        snap,
        report_of(snap),
        source="daemon",
        mode=mode,
        jobs=jobs,
        actions_in_progress=in_progress,
        recent_actions=recent,
    )
    if unavailable:
        doc["actuator_unavailable"] = unavailable
    if unknown_ranks is not None:
        doc["unknown_ranks"] = list(unknown_ranks)
    if act is not None:
        cgroups = act.supervisor.cgroups
        doc["job_cgroups"] = {
            "base": str(cgroups.base) if cgroups is not None else None,
            "off": act.job_cgroups_off if cgroups is None else "",
        }
    return doc
