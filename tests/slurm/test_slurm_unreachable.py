"""A Slurm that is down or answers garbage changes nothing: one clear error, the node's instances untouched."""

from __future__ import annotations

import asyncio

import pytest

from flexmig.errors import SlurmError
from flexmig.slurm.testbed import stop_pid
from support.slurm import SlurmRig, skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def _layout(rig: SlurmRig) -> list[tuple[int, int, str]]:
    return sorted(
        (g.index, gi.start, gi.profile_name or "") for g in rig.nvml.inventory().gpus for gi in g.gpu_instances
    )


def test_slurmctld_down_is_one_error_naming_the_command_and_nothing_changes() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0", settings={"command_timeout_s": 3.0}) as rig:
            rig.sleeper("--gres=gpu:1g.18gb:1")
            before = _layout(rig)
            actions = len(rig.act.journal.recent_actions())
            pid = int((rig.paths.run / "slurmctld.pid").read_text())
            await asyncio.to_thread(stop_pid, pid)
            with pytest.raises(SlurmError) as err:
                await rig.agent.round("act")
            text = str(err.value)
            assert "squeue" in text and ("3 s" in text or "slurmctld" in text or "error" in text), text
            assert _layout(rig) == before
            assert len(rig.act.journal.recent_actions()) == actions

    asyncio.run(scenario())


def test_garbage_from_squeue_is_one_error_naming_it_and_nothing_changes() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            # The real squeue, its answer cut short (a Slurm of another version, a full disk, a broken pipe).
            bin_dir = rig.base / "bin"
            bin_dir.mkdir()
            for name in ("sinfo", "scontrol", "scancel", "slurmd"):
                (bin_dir / name).symlink_to(rig.testbed.commands.path(name))
            squeue = rig.testbed.commands.path("squeue")
            (bin_dir / "squeue").write_text(f'#!/bin/sh\n{squeue} "$@" | head -c 300\n')
            (bin_dir / "squeue").chmod(0o755)
            rig.sleeper("--gres=gpu:1g.18gb:1")
            before = _layout(rig)
            actions = len(rig.act.journal.recent_actions())
            rig.agent.client.commands = rig.agent.client.commands.__class__(bin_dir, rig.paths.slurm_conf, 10.0)
            with pytest.raises(SlurmError) as err:
                await rig.agent.round("act")
            assert "squeue --json: answer is not JSON" in str(err.value), err.value
            assert _layout(rig) == before
            assert len(rig.act.journal.recent_actions()) == actions

    asyncio.run(scenario())
