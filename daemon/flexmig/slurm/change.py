"""One Slurm re-registration as a journalled action (``slurm_reregister``): close the node, checkpoint and requeue
the hook jobs, take the empty node out of Slurm, change its MIG instances, register it again, release, reopen.

The action starts only when the node is (about to be) empty: the waiting for running jobs to end happens before,
outside the journal, while flexmig's reservation keeps the node open to jobs that end in time
(:mod:`flexmig.slurm.agent`). So no step waits long, and a restart of flexmigd finishes the action in seconds. The
steps, each written to the journal before it runs and each safe to run again after a crash:

``close`` (flexmig's reservation ``flexmig-<node>`` starts now: no new job starts) → for each hook job J:
``baseline:J`` → ``signal:J`` (``scancel --signal=USR1 --batch``) → ``await_ack:J`` → ``hold:J`` (``scontrol
requeuehold``) → ``await_idle`` (bounded: jobs completing) → ``check`` (nobody else drained, downed or reserved the
node meanwhile) → ``drain`` (flexmig's own, on the empty node, so that nothing starts once its reservation is gone:
slurmctld refuses to delete a node in an active reservation) → ``stop_slurmd`` → ``unreserve`` → ``delete``
(``scontrol delete nodename``; a static node, ``[slurm] instance_nodes = static``: ``scontrol update
state=future``) → ``destroy:G@S``/``create:G@S`` (the plan's instance changes, through the
actuator's own NVML steps) → ``gres`` (gres.conf block and TaskProlog map from a fresh inventory) → ``register``
(slurmd restarted with the new ``Gres=``, until slurmctld lists the node with those GRES) → ``credential_gap`` →
``release:J`` (``scontrol release``, ``StartTime=now``) → ``resume`` → ``reopen`` → ``schedule`` unless ``resume``
resumed the node (Slurm's scheduler queued, which a dynamic node's registration alone does not do). An instance
node that leaves Slurm for good (``retire``, ``[slurm] node_per_instance``) ends after its instance is destroyed:
``retire`` (its gres.conf block and map removed) → ``credential_gap`` → ``release:J`` (a job moved off it to make room,
:mod:`flexmig.slurm.moving`) → ``reopen``.

Safety rules kept here:

* only jobs that opted in, and whose TaskProlog set the hook up (:mod:`flexmig.slurm.hookcheck`: the agent counts
  no other job as movable), are ever signalled; a job that does not acknowledge within the timeout cancels the
  change (code ``ACK_TIMEOUT``): the jobs already held are released and the node reopens; the agent never asks that
  job again while it runs;
* an administrator's state wins: a node drained, downed or reserved by anyone else (checked again right before the
  node is taken out of Slurm) cancels the change untouched;
* once slurmd is stopped the node is always registered again, with whatever instances NVML shows, even when an
  instance change failed half-way; jobs held for the change are always released, even when the node cannot be
  registered (a gres.conf flexmig may not write: the action fails naming it, and the next round tries again). So
  a crash at any step, once the journal finishes the action at the next start, leaves the node neither closed
  nor unregistered, and no instance unknown to Slurm.

An acknowledgement is trusted only if the file belongs to the job's user, lies in the job's checkpoint directory
(computed as the TaskProlog does), is newer than the one before the request, and names a non-empty regular file
inside that directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from flexmig.act.records import Slot
from flexmig.act.steps import StepFailed
from flexmig.errors import SlurmError
from flexmig.plan.types import CreateInstance, DestroyInstance, Plan
from flexmig.slurm.change_admin import admin_attributes, admin_hold
from flexmig.slurm.change_checkpoint import CheckpointSteps
from flexmig.slurm.change_types import ChangeSettings, MigSteps, StepRunner
from flexmig.slurm.client import SlurmClient
from flexmig.slurm.demand import SlurmRunning
from flexmig.slurm.gresconf import gres_string
from flexmig.slurm.node_brief import FULL_EVERY
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import flexmig_name
from flexmig.slurm.sitecheck import slurm_version
from flexmig.slurm.slurmd import SlurmdControl
from flexmig.slurm.supply import Supply

__all__ = ["KIND", "PLANNED_DELETE_SAFE_SINCE", "SlurmChange", "encode_change", "planned_delete_crashes"]

log = logging.getLogger(__name__)

KIND = "slurm_reregister"
"""The journal's action kind of a re-registration."""

REQUEUE_GAP_S = 1.5
"""How long after a requeued job left the node it may start there again. slurmd revokes the credential of a job it
killed, by the second: a job requeued and restarted on the node within the same second is refused ("Killing
non-startable batch JobId=N: Job credential revoked", verified on 22.05.8) and ends FAILED."""

PLANNED_DELETE_SAFE_SINCE = (22, 5, 9)
"""The first Slurm whose backfill scheduler survives the deletion of a node it planned on (SchedMD commit 7250aa4011,
bug 16165, "sched/backfill - fix segfault when removing a PLANNED node from system": 22.05.9; 23.02 and later skip
deleted nodes). Before it a dynamic node is deleted only after a backfill cycle that began after its drain."""


def planned_delete_crashes(version: str) -> bool:
    """True when Slurm ``version`` (``scontrol show config``'s ``SLURM_VERSION``, e.g. ``22.05.8``) may crash
    deleting a node its backfill scheduler planned on, or cannot be read (then flexmig waits, as it must on 22.05.8)."""
    found = slurm_version(version)
    return found is None or found < PLANNED_DELETE_SAFE_SINCE


def encode_change(
    node: str,
    plan: Plan,
    movable: Sequence[SlurmRunning],
    reason: str,
    drain_s: float,
    *,
    busy: bool = False,
    serves: Sequence[str] = (),
    retire: bool = False,
) -> tuple[str, str | None, dict[str, Any]]:
    """The journal's form of a re-registration carrying ``plan``'s instance changes (in plan order); ``busy``: the
    change had to wait for jobs (it counts for the batching of such changes); ``serves``: the pending jobs (request
    names) the change newly serves, which a restarted daemon's sibling GPU nodes leave to it for a while
    (:class:`flexmig.slurm.claims.Claims`); ``retire``: the node leaves Slurm for good after the changes, which
    destroy its only instance (``[slurm] node_per_instance``), and is not registered again."""
    changes: list[dict[str, Any]] = []
    for a in plan.actions:
        if isinstance(a, CreateInstance | DestroyInstance):
            op = "create" if isinstance(a, CreateInstance) else "destroy"
            changes.append({"op": op, "slot": Slot(a.gpu, a.start, a.profile.name).to_json()})
    jobs = [
        {"job_id": r.job.job_id, "user": r.job.user, "user_id": r.job.user_id, "restarts": r.job.restart_count}
        for r in movable
    ]
    return KIND, None, {
        "node": node, "changes": changes, "checkpoint": jobs, "reason": reason, "drain_s": drain_s, "busy": busy,
        "serves": list(serves), **({"retire": True} if retire else {}),
    }  # fmt: skip


def _drained_at(drained: dict[str, Any], payload: dict[str, Any]) -> float:
    """When the node was drained, at the latest: the ``drain`` step's time, or the caller's (a carving drains the
    nodes it retires together, ``drained_at``) when the node was drained already."""
    at = float(drained.get("at", 0.0))
    if "already" in drained and "drained_at" in payload:
        at = min(at, float(payload["drained_at"]))
    return at


class SlurmChange(CheckpointSteps):
    """Runs ``slurm_reregister`` actions for one node."""

    def __init__(
        self,
        client: SlurmClient,
        slurmd: SlurmdControl,
        supply: Supply,
        mig: MigSteps,
        settings: ChangeSettings,
        *,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.slurmd = slurmd
        self.supply = supply
        self.mig = mig
        self.settings = settings
        self.on_event = on_event or (lambda kind, detail: None)
        self.clock = clock
        self._polls = 0

    # ------------------------------------------------------------------------------------------- entry
    async def run(self, run: StepRunner, payload: dict[str, Any]) -> None:
        """Carry out one re-registration (or finish it after a crash)."""
        node = str(payload["node"])
        jobs = [dict(j) for j in payload.get("checkpoint", [])]
        changes = [(str(c["op"]), Slot.from_json(c["slot"])) for c in payload.get("changes", [])]
        held: list[int] = []
        try:
            await run.step("close", {"node": node, "s": self.settings.close_s}, lambda: self._close(node))
            for job in jobs:
                if await self._checkpoint(run, job):
                    held.append(int(job["job_id"]))
            idle = await run.step(
                "await_idle", {"timeout_s": self.settings.idle_timeout_s},
                lambda: self._await_idle(node, frozenset(int(j["job_id"]) for j in jobs)),
            )  # fmt: skip
            await run.step("check", {"node": node}, lambda: self._check(node))
            drained = await run.step("drain", {"node": node}, lambda: self._drain(node))
        except StepFailed as exc:
            await self._undo(run, node, jobs, bool(held))
            raise StepFailed(f"{exc}; the change is cancelled, the node reopened", outcome="cancelled",
                             code=exc.code) from exc  # fmt: skip
        seen = await self._leave_slurm(run, node, jobs, held=bool(held), drained_at=_drained_at(drained, payload))
        failure = await self._change_instances(run, changes)
        if payload.get("retire"):  # an instance node gone for good (node_per_instance): nothing to register
            await run.step("retire", {"node": node}, self._retire)
            await self._release_all(run, jobs, held=bool(held), since=float(idle.get("at", 0.0)))  # a move's job
            await run.step("reopen", {"node": node}, lambda: self._reopen(node))
            if failure is not None:
                raise StepFailed(f"{failure}; node {node} was deleted from Slurm", code=failure.code)
            return
        unregistered: StepFailed | None = None
        try:
            await run.step("gres", {}, self._gres)
            await run.step("register", {"timeout_s": self.settings.register_timeout_s}, lambda: self._register(node))
            attrs = dict(seen.get("attributes") or {})
            await run.step("attributes", {"node": node, **attrs}, lambda: self._restore_attributes(node, attrs))
        except StepFailed as exc:  # the held jobs are released all the same: they pend, or run elsewhere
            unregistered = exc
        await self._release_all(run, jobs, held=bool(held), since=float(idle.get("at", 0.0)))
        resumed = await run.step("resume", {"node": node}, lambda: self._resume(node))
        await run.step("reopen", {"node": node}, lambda: self._reopen(node))
        if unregistered is not None:
            raise StepFailed(
                f"{unregistered}; node {node} is not registered (the next round tries again), the jobs held for the "
                "change are released",
                code=unregistered.code,
            )
        if not resumed.get("resumed"):  # a resume is an update of the node: it queued the scheduler already
            await run.step("schedule", {"node": node}, lambda: self._schedule(node))
        if failure is not None:
            raise StepFailed(f"{failure}; the node was registered with the instances NVML shows", code=failure.code)

    async def _release_all(self, run: StepRunner, jobs: list[dict[str, Any]], *, held: bool, since: float) -> None:
        """Release the jobs the change requeued held, once the credential gap since ``since`` (wall time they were
        gone) has passed: they wait again and start where Slurm finds room (on another node after a move)."""
        if held:
            await run.step("credential_gap", {"s": REQUEUE_GAP_S}, lambda: self._credential_gap(since))
        for job in jobs:
            job_id = int(job["job_id"])
            await run.step(f"release:{job_id}", {"job_id": job_id}, lambda j=job_id: self._release(j))  # type: ignore[misc]

    async def _change_instances(self, run: StepRunner, changes: list[tuple[str, Slot]]) -> StepFailed | None:
        """The plan's instance changes, one step each, in order; the first that failed (the rest are not tried), or
        None."""
        failure: StepFailed | None = None
        for op, slot in changes:
            name = f"{op}:{slot.gpu}@{slot.start}"
            fn = (lambda s=slot: self.mig.create(s)) if op == "create" else (lambda s=slot: self.mig.destroy(s))
            try:
                await run.step(name, slot.to_json(), fn)
            except StepFailed as exc:
                failure = exc
                break
        return failure

    async def _leave_slurm(
        self, run: StepRunner, node: str, jobs: list[dict[str, Any]], *, held: bool, drained_at: float
    ) -> dict[str, Any]:
        """slurmd stopped, flexmig's reservation gone, the backfill scheduler past the node, the administrator's
        state looked at once more, then the node deleted from Slurm; what ``recheck`` saw (the attributes to set
        again). A hold found by ``recheck`` cancels the change before the delete: slurmd runs again as it was."""
        await run.step("stop_slurmd", {}, self._stop_slurmd)
        await run.step("unreserve", {"node": node}, lambda: self._reopen(node))
        try:
            # a static node's record stays, and 22.05.9 and later skip deleted nodes: nothing to trip on then
            if not self.settings.static and await self._deletion_may_crash():
                await run.step("backfill", {"since": drained_at}, lambda: self._await_backfill(node, drained_at))
            seen: dict[str, Any] = await run.step("recheck", {"node": node}, lambda: self._check(node))
        except StepFailed as exc:  # an administrator acted since the check: the node is still in Slurm, as it was
            await run.step("restore_slurmd", {"node": node}, lambda: self._restore_slurmd(node))
            await self._undo(run, node, jobs, held)
            raise StepFailed(
                f"{exc}; the change is cancelled before the node left Slurm: slurmd runs again with the GRES it had",
                outcome="cancelled",
                code=exc.code,
            ) from exc
        await run.step("delete", {"node": node}, lambda: self._delete(node))
        return seen

    async def _poll(self, node: str, ready: Callable[[SlurmNode | None], bool]) -> SlurmNode | None:
        """Node ``node`` for a wait's poll: Slurm's brief answer for that node alone while it says the wait goes on
        (``ready`` False), the full record once it says the wait may end, and every :data:`FULL_EVERY` polls
        (:mod:`flexmig.slurm.node_brief`: on a big cluster each poll otherwise packs every node)."""
        self._polls += 1
        if self._polls % FULL_EVERY:
            brief = await self.client.node_brief(node)
            if not ready(brief):
                return brief
        return await self.client.node(node)

    async def _look(self, node: str) -> SlurmNode | None:
        """Node ``node`` for a step that reads only whether it is there, drained and why: Slurm's brief answer for
        that node alone, or the full record when the brief one does not list it (a node in no partition, a FUTURE
        one, or none)."""
        brief = await self.client.node_brief(node)
        return brief if brief is not None else await self.client.node(node)

    # ------------------------------------------------------------------------------------------- phases
    async def _close(self, node: str) -> dict[str, Any]:
        """flexmig's reservation on ``node`` starts now (made, or moved to now), for ``close_s`` at most."""
        name = flexmig_name(node)
        try:
            found = await self._look(node)
            if found is None:
                return {"absent": True}
            mine = next((r for r in await self.client.reservations() if r.name == name), None)
            if mine is None:
                await self.client.create_reservation(name, node, 0, self.settings.close_s)
            elif not mine.active(time.time()):
                await self.client.move_reservation(name, 0, self.settings.close_s)
        except SlurmError as exc:
            raise StepFailed(str(exc), outcome="cancelled", code="SLURM") from exc
        return {"reservation": name, "made": mine is None}

    async def _check(self, node: str) -> dict[str, Any]:
        """Nobody else drained, downed or reserved the node since the change was decided."""
        try:
            found = await self.client.node(node)
            reservations = await self.client.reservations()
        except SlurmError as exc:
            raise StepFailed(str(exc), outcome="cancelled", code="SLURM") from exc
        why = admin_hold(found, reservations, node)
        if why is not None:
            raise StepFailed(why, outcome="cancelled", code="ADMIN")
        if found is None:
            return {"state": None}
        return {"state": found.state, "attributes": admin_attributes(found, self.slurmd.registered_conf())}

    async def _restore_slurmd(self, node: str) -> dict[str, Any]:
        """slurmd started again with the GRES it registered (the node was not deleted): the node answers as before,
        with whatever an administrator set on it meanwhile."""
        conf = self.slurmd.registered_conf() or ""
        gres = conf.rsplit("Gres=", 1)[1].split()[0] if "Gres=" in conf else gres_string(
            self.supply.records(await self.mig.inventory())
        )  # fmt: skip
        since = 0.0
        try:
            if not await self.slurmd.running():
                since = time.time() - 1.0  # the node answers once this slurmd registered (whole seconds)
                await self.slurmd.start(gres)
        except SlurmError as exc:
            raise StepFailed(str(exc), code="SLURMD") from exc
        start = self.clock()
        while self.clock() - start < self.settings.register_timeout_s:
            with contextlib.suppress(SlurmError):
                found = await self._poll(node, lambda n: n is not None and n.responding)
                if found is not None and found.responding and found.slurmd_start_s >= since:
                    return {"gres": gres, "waited_s": round(self.clock() - start, 3)}
            await asyncio.sleep(self.settings.poll_s)
        raise StepFailed(f"node {node} did not answer within {self.settings.register_timeout_s:g} s", code="REGISTER")

    async def _restore_attributes(self, node: str, before: dict[str, str]) -> dict[str, Any]:
        """Set again what an administrator had set on the node (``scontrol update``: features, weight, comment,
        extra) and its new registration lost: a dynamic node registers with ``[slurm] slurmd_conf`` only."""
        try:
            found = await self.client.node(node)
            if found is None or not before:
                return {"restored": {}}
            now = found.attributes()
            first = {k: v for k, v in before.items() if k != "activefeatures" and now.get(k) != v}
            if first:
                await self.client.update_node(node, first)
                found = await self.client.node(node)
            later = {}
            if found is not None and "activefeatures" in before and found.active_features != before["activefeatures"]:
                later = {"activefeatures": before["activefeatures"]}
                await self.client.update_node(node, later)
        except SlurmError as exc:
            raise StepFailed(f"node {node} registered, but what was set on it could not be set again: {exc}",
                             code="ATTRIBUTES") from exc  # fmt: skip
        return {"restored": {**first, **later}}

    async def _drain(self, node: str) -> dict[str, Any]:
        """flexmig's drain of the empty node (its reservation must go before the node can be deleted); ``at``: when
        it was drained, at the latest (the backfill scheduler is waited for from then on)."""
        try:
            found = await self._look(node)
            if found is None:
                return {"absent": True, "at": time.time()}
            if found.drained:
                return {"already": found.reason, "at": time.time()}
            await self.client.drain(node, "flexmig: re-registering with new MIG instances")
        except SlurmError as exc:
            raise StepFailed(str(exc), outcome="cancelled", code="SLURM") from exc
        return {"drained": True, "at": time.time()}

    async def _deletion_may_crash(self) -> bool:
        """True unless slurmctld says it is a Slurm whose backfill scheduler survives the deletion of a node it
        planned on (:data:`PLANNED_DELETE_SAFE_SINCE`); an unanswered question counts as may (the step then asks)."""
        try:
            cfg = await self.client.config()
        except SlurmError:
            return True
        return planned_delete_crashes(str(cfg.get("SLURM_VERSION", "")))

    async def _await_backfill(self, node: str, since: float) -> dict[str, Any]:
        """Until a cycle of the backfill scheduler began after ``since`` (the drain of ``node``), bounded.

        Slurm 22.05.8's backfill scheduler keeps the nodes it planned jobs on in a bitmap until its next cycle, which
        starts by dereferencing each of them: a node deleted in between crashes slurmctld (``bckfl: segfault ... in
        sched_backfill.so``, seen twice here, ``_handle_planned`` in ``backfill.c``). A cycle that began after the
        drain has cleared that bitmap of this node and will not plan on a drained node, so the delete is safe after
        it. Without the backfill scheduler there is nothing to wait for. The callers do not wait on Slurm 22.05.9
        and later (:meth:`_deletion_may_crash`: their backfill scheduler skips deleted nodes), nor for a static node
        (``instance_nodes = static``), which goes back to State=FUTURE: its record, which the bitmap points to, stays
        (``scontrol update state=future`` only marks it).
        """
        try:
            cfg = await self.client.config()
            if "backfill" not in cfg.get("SchedulerType", "sched/backfill"):
                return {"backfill": False}
            params = cfg.get("SchedulerParameters", "")
            interval = next(
                (int(w.split("=", 1)[1]) for w in params.split(",") if w.startswith("bf_interval=")
                 and w.split("=", 1)[1].isdigit()), 30,
            )  # fmt: skip
        except SlurmError as exc:
            raise StepFailed(str(exc), outcome="cancelled", code="SLURM") from exc
        # A cycle also runs, and clears the bitmap, when no job is pending (then sdiag does not show it): the drain
        # is news to the backfill scheduler, which looks at least every bf_interval, and a cycle under way at the
        # drain lasts at most bf_max_time (bf_interval by default).
        surely = since + 2.0 * interval + 2.0
        limit = max(30.0, 3.0 * interval + 10.0)
        start = self.clock()
        while True:
            with contextlib.suppress(SlurmError):
                if await self._poll(node, lambda n: n is None) is None:
                    return {"absent": True}
                began = await self.client.backfill_cycle_start()
                if began is not None and began >= since + 1.0:  # whole seconds
                    return {"cycle_began": began, "waited_s": round(self.clock() - start, 3)}
                if time.time() >= surely:
                    return {"quiet_s": round(time.time() - since, 3), "waited_s": round(self.clock() - start, 3)}
            if self.clock() - start >= limit:
                raise StepFailed(
                    f"no backfill cycle began within {limit:g} s of the drain; the node is not deleted while the "
                    "backfill scheduler may still hold it (Slurm 22.05 crashes then)",
                    outcome="cancelled",
                    code="BACKFILL",
                )
            await asyncio.sleep(self.settings.poll_s)

    async def _schedule(self, node: str) -> dict[str, Any]:
        """Have Slurm's scheduler run now, so that the jobs waiting for the node start within seconds.

        The registration of a dynamic node does not run it: slurmctld makes a node that ``slurmd -Z`` registers
        idle when it creates it, before it checks whether the node came into service, so it finds nothing new
        (``newly_up`` in ``_slurm_rpc_node_registration``; seen in 24.11.5's log). A job waiting for the node then
        waited for the next job to be submitted or to end, the backfill cycle (``bf_interval``, 30 s by default) or
        the full pass (``sched_interval``, 60 s). An update of a node does queue the scheduler, whatever it
        updates: the node's comment is set to what it is, which changes nothing. Not a failure of the change when
        Slurm refuses it: the node is registered, and the jobs start at Slurm's next pass."""
        try:
            found = await self.client.node(node)
            if found is None or not found.responding or found.drained:
                return {"scheduled": False}
            await self.client.update_node(node, {"comment": found.comment})
        except SlurmError as exc:
            log.warning("node %s is registered, but Slurm's scheduler could not be queued: %s", node, exc)
            return {"scheduled": False, "error": str(exc)}
        return {"scheduled": True}

    async def _reopen(self, node: str) -> dict[str, Any]:
        """flexmig's reservation on ``node`` is gone (deleted if it is there)."""
        try:
            return {"deleted": await self.client.delete_reservation(flexmig_name(node))}
        except SlurmError as exc:
            raise StepFailed(str(exc), code="SLURM") from exc

    async def _await_idle(self, node: str, moved: frozenset[int]) -> dict[str, Any]:
        """Until no job runs on the closed node: the jobs the change moves (``moved``: requeued, ended) and jobs
        ending (completing) are waited for, at most ``idle_timeout_s``. A change starts only on a node no other job
        runs on, so another job running on it started after the change was decided (in the seconds between
        Slurm's answer and the close) and may run for as long as its limit: StepFailed at once, not after the
        timeout with the node closed all along."""
        start = self.clock()
        deadline = start + self.settings.idle_timeout_s
        while True:
            try:
                found = await self._poll(node, lambda n: n is None or n.idle)
                jobs = await self.client.jobs()
            except SlurmError as exc:
                log.warning("waiting for node %s to drain: %s", node, exc)
                found, jobs = None, None
            if jobs is not None:
                busy = [j for j in jobs if j.active and node in j.nodes]
                if not busy and (found is None or found.idle):
                    return {"waited_s": round(self.clock() - start, 3), "at": time.time()}
                late = [str(j.job_id) for j in busy if j.state in ("RUNNING", "CONFIGURING") and j.job_id not in moved]
                if late:
                    raise StepFailed(
                        f"Slurm job(s) {', '.join(late)} started on node {node} after the change was decided for it",
                        outcome="cancelled",
                        code="STARTED",
                    )
            if self.clock() >= deadline:
                raise StepFailed(
                    f"node {node} still runs jobs {self.settings.idle_timeout_s:g} s after it was closed",
                    outcome="cancelled",
                    code="BUSY",
                )
            await asyncio.sleep(self.settings.poll_s)

    async def _stop_slurmd(self) -> dict[str, Any]:
        was = await self.slurmd.running()
        await self.slurmd.stop()
        return {"was_running": was}

    async def _delete(self, node: str) -> dict[str, Any]:
        try:
            return {"deleted": await self._unregister(node)}
        except SlurmError as exc:
            raise StepFailed(str(exc), code="SLURM") from exc

    async def _unregister(self, node: str) -> bool:
        """The node out of Slurm: deleted (a dynamic node) or back in State=FUTURE (a static one); False when
        slurmctld did not list it anyway."""
        if self.settings.static:
            return await self.client.future_node(node)
        return await self.client.delete_node(node)

    async def _gres(self) -> dict[str, Any]:
        inv = await self.mig.inventory()
        try:
            records = self.supply.write(inv)
        except (SlurmError, OSError) as exc:
            raise StepFailed(f"cannot write the node's GRES: {exc}", code="GRES") from exc
        return {"gres": gres_string(records), "records": len(records)}

    async def _retire(self) -> dict[str, Any]:
        """The deleted node's gres.conf block and GRES map removed (``node_per_instance``: its instance is gone)."""
        try:
            self.supply.retire()
        except (SlurmError, OSError) as exc:
            raise StepFailed(f"cannot remove the node's GRES: {exc}", code="GRES") from exc
        return {"retired": True}

    async def _register(self, node: str) -> dict[str, Any]:
        inv = await self.mig.inventory()
        records = self.supply.records(inv)
        gres = gres_string(records)
        want = {r.type: 0 for r in records}
        for r in records:
            want[r.type] += 1
        try:
            if await self.slurmd.running():
                found = await self.client.node(node)
                got = {k: v for k, v in found.gpu_counts().items() if v} if found is not None else None
                if got != want:  # a slurmd started before a crash, or by someone else, with other GRES
                    if found is not None and not found.drained:
                        await self.client.drain(node, "flexmig: re-registering with new MIG instances")
                    if not self.settings.static and await self._deletion_may_crash():
                        await self._await_backfill(node, time.time())  # then it is safe to delete (see there)
                    await self.slurmd.stop()
                    await self._unregister(node)
            if not await self.slurmd.running():
                await self.slurmd.start(gres)
        except SlurmError as exc:
            raise StepFailed(str(exc), code="SLURMD") from exc
        start = self.clock()
        while True:
            try:
                found = await self._poll(node, lambda n: n is not None and n.responding)
            except SlurmError as exc:
                log.warning("waiting for node %s to register: %s", node, exc)
                found = None
            if found is not None and found.responding:
                got = {k: v for k, v in found.gpu_counts().items() if v}
                if got == want:
                    return {"gres": gres, "waited_s": round(self.clock() - start, 3)}
                raise StepFailed(f"node {node} registered with gpu {got}, expected {want}", code="GRES_MISMATCH")
            if self.clock() - start >= self.settings.register_timeout_s:
                raise StepFailed(
                    f"node {node} did not register within {self.settings.register_timeout_s:g} s", code="REGISTER"
                )
            await asyncio.sleep(self.settings.poll_s)

    async def _credential_gap(self, since: float) -> dict[str, Any]:
        """Wait until ``REQUEUE_GAP_S`` have passed since ``since`` (wall time the requeued jobs were gone)."""
        wait = min(REQUEUE_GAP_S, max(0.0, since + REQUEUE_GAP_S - time.time()))
        await asyncio.sleep(wait)
        return {"waited_s": round(wait, 3)}

    async def _resume(self, node: str) -> dict[str, Any]:
        try:
            found = await self._look(node)
            if found is None or not found.drained or not found.reason.startswith("flexmig"):
                return {"drained": bool(found and found.drained)}
            await self.client.resume(node)
        except SlurmError as exc:
            raise StepFailed(str(exc), code="SLURM") from exc
        return {"resumed": True}

    async def _undo(self, run: StepRunner, node: str, jobs: list[dict[str, Any]], held: bool) -> None:
        """Release what this change held, undo flexmig's drain and reopen the node (journalled, so a crash here is
        finished too)."""
        if held:
            now = time.time()
            await run.step("undo_credential_gap", {"s": REQUEUE_GAP_S}, lambda: self._credential_gap(now))
        for job in jobs:
            job_id = int(job["job_id"])
            await run.step(f"undo_hold:{job_id}", {"job_id": job_id}, lambda j=job_id: self._release(j))  # type: ignore[misc]
        await run.step("undo_drain", {"node": node}, lambda: self._resume(node))
        await run.step("undo_close", {"node": node}, lambda: self._reopen(node))
