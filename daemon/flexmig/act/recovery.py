"""Recovery after a crash or a restart: what the executor does with the journal before it acts again.

At start-up the journal is reconciled with the node: ranks still running are adopted (in every mode), stale
generations of a moving job are killed, ranks of no journalled job are reported and left alone, jobs the current
``[jobs]`` policy refuses are named, and in mode ``act`` unfinished plans are finished or rolled back and jobs whose
ranks died while the daemon was away are settled. An unfinished action whose payload does not decode stops a start
in mode ``act`` rather than run half a plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psutil

from flexmig.act.encoding import ACTION_KINDS, payload_of
from flexmig.act.events import ActEvent
from flexmig.act.genuine import genuine
from flexmig.act.journal import JournalError
from flexmig.act.nodeview import InstanceView, NodeView
from flexmig.act.ranklogs import log_writer_generation
from flexmig.act.records import JobRecord
from flexmig.act.supervisor import mig_visible

if TYPE_CHECKING:
    from flexmig.act.executor import Executor

__all__ = ["check_unfinished", "reconcile", "unknown_ranks"]

log = logging.getLogger("flexmig.act.executor")  # recovery's lines keep the executor's logger name


async def reconcile(ex: Executor) -> dict[str, Any]:
    """At start-up: adopt running ranks, finish or roll back unfinished actions, settle dead jobs.

    Outside mode ``act`` only the adoption happens; unfinished actions wait for a start in ``act``.
    """
    summary: dict[str, Any] = {"adopted": {}, "killed_stale": {}, "plans": [], "settled": []}
    if ex.mode == "act":
        check_unfinished(ex)
    async with ex.action_lock:
        with contextlib.suppress(Exception):
            summary["pruned"] = await ex.offload(ex.devices.prune)
        for rec in ex.journal.jobs():
            if rec.state != "running":
                continue
            recorded = ex.journal.recorded_ranks(rec.uid, rec.generation)
            scanned = await asyncio.to_thread(ex.scanner.find, rec.uid)
            found = genuine(scanned, rec, ex.supervisor.cgroups, recorded)
            actions = [a for p in ex.journal.unfinished_plans() for a in ex.journal.actions(p)]
            moving = any(a.job == rec.name and a.state == "running" for a in actions)
            stale = [f for f in found if f.generation != rec.generation and not moving]
            for f in stale:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(f.pid, signal.SIGKILL)
            if stale:
                summary["killed_stale"][rec.name] = [f.pid for f in stale]
            adopted = await ex.supervisor.adopt(rec, found)
            summary["adopted"][rec.name] = [h.proc.pid for h in adopted]
            if adopted and not recorded:  # a journal of an earlier release: remember them from now on
                ex.record_ranks(rec)
        try:
            summary["unknown_ranks"] = unknown = await unknown_ranks(ex)
        except Exception as exc:  # a report: an NVML hiccup here must not stop the start
            log.warning("could not look for ranks of no journalled job: %s", exc)
            unknown = []
        for job, ranks in _by_job(unknown).items():
            log.warning(
                "%d rank(s) of job %s (FLEXMIG_JOB_ID %s) run on %s but are no rank of a running job in the journal %s "
                "(pids %s): left running, and their instances are left alone; stop them by hand, or "
                "restore the journal they belong to",
                len(ranks),
                ranks[0]["job"] or "?",
                job,
                ", ".join(r["target"] for r in ranks),
                ex.journal.path,
                ", ".join(str(r["pid"]) for r in ranks),
            )
        for rec in ex.journal.jobs():
            problem = ex.policy_problem(rec) if rec.state in ("running", "pending") else None
            if problem is not None:
                log.warning("%s; the current [jobs] policy refuses it, so it will not be launched again", problem)
        if ex.mode == "act":
            for plan_id in ex.journal.unfinished_plans():
                res = await ex.run_unfinished_plan(plan_id)
                summary["plans"].append(res.to_json())
            for rec in ex.journal.jobs():
                if rec.state == "running" and len(ex.supervisor.alive(rec.name)) < len(rec.slots):
                    await ex.settler.settle_locked(rec.name)
                    summary["settled"].append(rec.name)
    ex.events.emit(ActEvent(kind="reconciled", time_s=ex.wall(), detail=summary))
    return summary


async def unknown_ranks(ex: Executor, view: NodeView | None = None) -> list[dict[str, Any]]:
    """Processes with flexmig's job markers that no running rank accounts for: on this node's MIG instances (their
    ``CUDA_VISIBLE_DEVICES``, or NVML's process lists), ones whose job ID no job in the journal has (ranks a lost,
    emptied or replaced journal forgot); anywhere, ones of a journalled job that are not its ranks now (a job
    stopped, done or failed, or an older generation): a process that left its rank's process group and could not
    be stopped with it. Reported, never touched (their instances run processes of no registered job, so the
    actuator leaves those instances alone)."""
    view = view or await ex.view()
    devices = {mig_visible(i.uuid): i for i in view.instances if i.uuid} if ex.device_uuids_unique else {}
    on_gpu = {pid: i for i in view.instances for pid in (i.pids or ())}
    known = {rec.uid: rec for rec in ex.journal.jobs()}
    out = []
    marked = await asyncio.to_thread(ex.scanner.find_marked)
    out.extend(await asyncio.to_thread(_escaped, ex, known, {r.pid for r in marked}, on_gpu))
    for r in marked:
        inst = devices.get(r.device) or on_gpu.get(r.pid)
        rec = known.get(r.job_id)
        if rec is None and inst is None:
            continue
        if rec is not None and rec.state == "running" and r.generation == rec.generation:
            continue
        out.append(
            {
                "pid": r.pid,
                "job": r.job,
                "job_id": r.job_id,
                "generation": r.generation,
                "slot": r.slot,
                "user": r.user,
                "instance": r.device or (f"gpu{inst.gpu}:{inst.profile}@{inst.start}" if inst else ""),
                "target": inst.spec() if inst else (r.device or "no MIG device"),
            }
        )
    return out


def _escaped(
    ex: Executor, known: dict[str, JobRecord], marked: set[int], on_gpu: dict[int, InstanceView]
) -> list[dict[str, Any]]:
    """Processes in the cgroup of a journalled job (:mod:`flexmig.act.jobcgroups`) that are no rank of it nor a
    descendant of one, and carry no job marker (those the marker scan reports): what left a rank's process group
    with an emptied environment. The empty cgroups of jobs that no longer run are removed on the way."""
    cgroups = ex.supervisor.cgroups
    if cgroups is None:
        return []
    out = []
    for uid in cgroups.jobs():
        rec = known.get(uid)
        if rec is None:
            continue  # another daemon's (their cgroups share the parent when daemons share a cgroup)
        pids = cgroups.pids(uid)
        if not pids and rec.state != "running":
            with contextlib.suppress(OSError):
                cgroups.remove(uid)
            continue
        own = ex.supervisor.all_pids(rec.name) if rec.state == "running" else set()
        for pid in pids:
            if pid in own or pid in marked or log_writer_generation(pid) is not None:  # its log writers are its own
                continue
            try:
                user = psutil.Process(pid).username()
            except psutil.Error:
                continue
            inst = on_gpu.get(pid)
            out.append(
                {
                    "pid": pid,
                    "job": rec.name,
                    "job_id": uid,
                    "generation": -1,
                    "slot": -1,
                    "user": user,
                    "instance": f"gpu{inst.gpu}:{inst.profile}@{inst.start}" if inst else "",
                    "target": inst.spec() if inst else "no MIG device",
                }
            )
    return out


def check_unfinished(ex: Executor) -> None:
    """JournalError, one line per problem naming the journal and the action row, when an action of an
    unfinished plan has a payload that does not decode (the journal's own check covers the rest of each row):
    in mode ``act`` the start stops rather than run half a plan."""
    problems = []
    for plan_id in ex.journal.unfinished_plans():
        for row in ex.journal.actions(plan_id):
            if row.state in ("done", "failed", "cancelled", "skipped") or row.kind not in ACTION_KINDS:
                continue
            try:
                payload_of(row)
            except JournalError as exc:
                problems.append(f"{ex.journal.path}: actions row {row.id}: payload: {exc}")
    if problems:
        raise JournalError("\n".join(problems))


def _by_job(ranks: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:
        out.setdefault(str(r["job_id"]), []).append(r)
    return out
