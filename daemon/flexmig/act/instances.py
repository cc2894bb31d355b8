"""The executor's MIG instance steps: a fresh view of the node, destroying an idle instance, creating one, and a
move's layout change (which instances to destroy and create, decided once and journalled).

Each step is idempotent given what NVML shows (an instance already gone, or already there with the expected
profile, is success), so a step re-run after a crash is safe. Used by :class:`flexmig.act.executor.Executor`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from flexmig.act.devices import DeviceProcessTable
from flexmig.act.journal import Journal
from flexmig.act.migops import MigOps, Offload
from flexmig.act.nodeview import NodeView
from flexmig.act.preconditions import layout_changes
from flexmig.act.records import Slot
from flexmig.act.steps import ActionRun, StepFailed
from flexmig.act.supervisor import Supervisor
from flexmig.errors import LayoutError, NvmlCallError

__all__ = ["Instances"]


class Instances:
    """The MIG instance steps of one executor, on its NVML operations and its journal's running jobs."""

    def __init__(
        self, *, mig: MigOps, devices: DeviceProcessTable, offload: Offload, journal: Journal, supervisor: Supervisor
    ) -> None:
        self.mig = mig
        self.devices = devices
        self.offload = offload
        self.journal = journal
        self.supervisor = supervisor

    async def view(self) -> NodeView:
        """A fresh view of the node (after dropping exited processes from a simulated process table)."""
        with contextlib.suppress(Exception):
            await self.offload(self.devices.prune)
        return NodeView.of(await self.mig.inventory())

    def held(self, exclude: str | None = None) -> dict[tuple[int, int], str]:
        """Instances held by running jobs: ``(gpu, start) -> job``."""
        out: dict[tuple[int, int], str] = {}
        for rec in self.journal.jobs_in("running"):
            if rec.name != exclude:
                for s in rec.slots:
                    out[s.key] = rec.name
        return out

    async def destroy_idle(self, slot: Slot) -> dict[str, Any]:
        """Destroy the instance at ``slot`` if it exists, has the expected profile and runs no process."""
        view = await self.view()
        if slot.gpu in view.lost:
            raise StepFailed(f"GPU {slot.gpu} is lost (GPU_IS_LOST)", code="GPU_IS_LOST")
        inst = view.instance(slot.gpu, slot.start)
        if inst is None:
            return {"absent": True}
        if inst.profile != slot.profile:
            raise StepFailed(f"{inst.spec()} is not the expected {slot.profile}; not destroyed")
        if inst.pids is None and inst.uuid is not None:
            raise StepFailed(f"NVML does not list the processes of {inst.spec()}; not destroyed")
        if inst.pids:  # a GI without compute instance (no MIG device) runs nothing and may go
            owner = {p: r.name for r in self.journal.jobs() for p in self.supervisor.pids(r.name)}
            who = ", ".join(f"{p} ({owner.get(p, 'no registered job')})" for p in sorted(inst.pids))
            raise StepFailed(f"{inst.spec()} still runs processes {who}; not destroyed", code="IN_USE")
        try:
            await self.mig.destroy(slot.gpu, inst.gi_id)
        except NvmlCallError as exc:
            raise StepFailed(str(exc), code=exc.name) from exc
        return {"gi_id": inst.gi_id}

    async def create_at(self, slot: Slot) -> dict[str, Any]:
        """Create ``slot``'s instance unless an identical one already sits there; returns its UUID."""
        view = await self.view()
        if slot.gpu in view.lost:
            raise StepFailed(f"GPU {slot.gpu} is lost (GPU_IS_LOST)", code="GPU_IS_LOST")
        inst = view.instance(slot.gpu, slot.start)
        if inst is not None:
            if inst.profile == slot.profile and inst.uuid:
                return {"uuid": inst.uuid, "gi_id": inst.gi_id}
            if inst.profile != slot.profile or inst.uuid is not None:
                raise StepFailed(f"memory slice {slot.start} of GPU {slot.gpu} is held by {inst.spec()}")
            # A GPU instance without its compute instance: a destroy that failed half-way (NVML destroys the
            # compute instances first). Nothing can run on it; remove it and create the pair afresh.
            try:
                await self.mig.destroy(slot.gpu, inst.gi_id)
            except NvmlCallError as exc:
                raise StepFailed(str(exc), code=exc.name) from exc
        try:
            dev = await self.mig.create(slot.gpu, slot.profile, slot.start)
        except (NvmlCallError, LayoutError) as exc:
            raise StepFailed(str(exc), code=getattr(exc, "name", None)) from exc
        return {"uuid": dev.uuid, "gi_id": dev.gpu_instance_id}

    async def with_uuids(self, slots: Sequence[Slot]) -> list[Slot]:
        """``slots`` with the UUIDs of the instances there now; StepFailed if one is missing."""
        return self.uuids_in(await self.view(), slots)

    @staticmethod
    def uuids_in(view: NodeView, slots: Sequence[Slot]) -> list[Slot]:
        """``slots`` with their UUIDs in ``view``; StepFailed if one is missing."""
        out = []
        for s in slots:
            inst = view.instance(s.gpu, s.start)
            if inst is None or inst.profile != s.profile or not inst.uuid:
                raise StepFailed(f"instance {s.spec()} does not exist (any more)")
            out.append(Slot(s.gpu, s.start, s.profile, inst.uuid))
        return out

    async def reconfigure(self, run: ActionRun, src: Sequence[Slot], dst: Sequence[Slot]) -> list[Slot]:
        """Destroy the job's sources that overlap missing targets, create the missing targets; returns targets."""

        seen: list[NodeView] = []

        async def decide() -> dict[str, Any]:
            seen.append(await self.view())
            destroy, create = layout_changes(seen[0], src, dst)
            return {"destroy": [s.to_json() for s in destroy], "create": [d.to_json() for d in create]}

        res = await run.step("layout", {}, decide)
        if seen and not res["destroy"] and not res["create"]:
            return self.uuids_in(seen[0], dst)  # nothing changed since that view: one NVML inventory, not two
        for s in (Slot.from_json(d) for d in res["destroy"]):
            await run.step(f"destroy:{s.gpu}@{s.start}", s.to_json(), lambda s=s: self.destroy_idle(s))  # type: ignore[misc]
        for d in (Slot.from_json(x) for x in res["create"]):
            await run.step(f"create:{d.gpu}@{d.start}", d.to_json(), lambda d=d: self.create_at(d))  # type: ignore[misc]
        return await self.with_uuids(dst)
