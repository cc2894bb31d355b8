"""What a Slurm agent is built of, as its settings say: the node's slurmd control (:func:`make_slurmd`), its supply
side (:func:`make_supply`), and its re-registration (:func:`make_change`) on the executor's own NVML steps
(:class:`ExecutorMig`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flexmig.act.executor import Executor
from flexmig.act.records import Slot
from flexmig.nvml.types import Inventory
from flexmig.slurm.change import SlurmChange
from flexmig.slurm.change_types import ChangeSettings
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.settings import SlurmSettings
from flexmig.slurm.slurmd import HookSlurmd, SlurmdControl, SystemdSlurmd
from flexmig.slurm.supply import Supply

__all__ = ["ExecutorMig", "make_change", "make_slurmd", "make_supply"]


class ExecutorMig:
    """The executor's own idempotent NVML steps, as :class:`~flexmig.slurm.change_types.MigSteps`."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    async def destroy(self, slot: Slot) -> dict[str, Any]:
        """Destroy the idle instance at ``slot`` (absent is fine)."""
        return await self.executor._destroy_idle(slot)  # the executor's own idempotent step

    async def create(self, slot: Slot) -> dict[str, Any]:
        """Create ``slot``'s instance (an identical one already there is fine)."""
        return await self.executor._create_at(slot)

    async def inventory(self) -> Inventory:
        """A fresh inventory through the NVML worker."""
        return await self.executor.mig.inventory()


def make_slurmd(settings: SlurmSettings, node: str, commands: SlurmCommands) -> SlurmdControl:
    """The node's slurmd as ``[slurm] slurmd_control`` says: its systemd unit, or the site's hook command."""
    common: dict[str, Any] = {
        "node": node,
        "env_file": settings.slurmd_env,
        "pid_file": settings.slurmd_pid_file,
        "commands": commands,
        "extra": settings.slurmd_conf,
        "per_slice": settings.slurmd_conf_per_slice,
        "static": settings.static_nodes,
    }
    if settings.slurmd_control == "hook":
        return HookSlurmd(**common, hook=settings.slurmd_hook)
    return SystemdSlurmd(**common, unit=settings.slurmd_unit)


def make_supply(
    settings: SlurmSettings, node: str, *, simulated: bool, gpu: int | None, start: int | None, profile: str | None
) -> Supply:
    """The node's supply side (gres.conf block, GRES map, the hook's settings for the TaskProlog) as the settings
    say; ``gpu``, ``start``, ``profile``: the part of the host the node is (see
    :class:`flexmig.slurm.agent.SlurmAgent`)."""
    hook = {
        "checkpoint_dir": settings.checkpoint_dir,
        "signal": f"SIG{settings.checkpoint_signal}",
        "ack_wait_s": settings.ack_wait_s,
    }
    return Supply(
        node,
        settings.gres_conf,
        settings.gres_map,
        settings.dev_dir,
        settings.mig_minors,
        simulated=simulated,
        hook=hook,
        gpu=gpu,
        start=start,
        profile=profile,
    )


def make_change(
    settings: SlurmSettings,
    node: str,
    *,
    client: SlurmClient,
    slurmd: SlurmdControl,
    supply: Supply,
    executor: Executor,
    on_event: Callable[[str, dict[str, Any]], None] | None,
) -> SlurmChange:
    """The node's re-registration (:class:`~flexmig.slurm.change.SlurmChange`) as the settings say, on
    ``executor``'s NVML steps."""
    change = ChangeSettings(
        node,
        settings.checkpoint_dir,
        ack_timeout_s=settings.ack_timeout_s,
        close_s=settings.drain_timeout_s,
        register_timeout_s=settings.register_timeout_s,
        signal=settings.checkpoint_signal,
        static=settings.static_nodes,
    )
    return SlurmChange(client, slurmd, supply, ExecutorMig(executor), change, on_event=on_event)
