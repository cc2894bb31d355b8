"""flexmig as Slurm's node agent, against a real Slurm 22.05 (munged, slurmctld, slurmd) on a simulated MIG node."""

from __future__ import annotations

import asyncio

import pytest

from slurm_rig import SlurmRig, skip_reason, until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def test_three_pending_1g_jobs_on_a_7g_node_run_each_on_its_own_mig_device() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            jobs = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(3)]
            for j in jobs:
                pending = await rig.wait_state(j, "PENDING")
                assert pending.reason in ("ReqNodeNotAvail", "Resources", "None", "Priority")
            rnd = await rig.agent.round("act")
            assert rnd.verdict is not None and rnd.verdict.go, rnd.verdict
            assert rnd.result is not None and rnd.result.ok, rnd.result.to_json()
            for j in jobs:
                await rig.wait_state(j, "RUNNING")
            seen = [await until(f"job {j} wrote its devices", lambda j=j: _visible(rig, j)) for j in jobs]
            assert all(v.startswith("MIG-") and "," not in v for v in seen), seen
            assert len(set(seen)) == 3, seen
            read = await rig.agent.read()
            assert read.in_sync, (read.registered_as, read.expected)
            assert read.registered_as.get("1g.18gb", 0) >= 3

    asyncio.run(scenario())


async def _visible(rig: SlurmRig, job: int) -> str:
    return rig.visible(job)
