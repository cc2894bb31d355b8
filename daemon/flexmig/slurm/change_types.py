"""What a Slurm re-registration (:class:`flexmig.slurm.change.SlurmChange`) runs on: the executor's journalled step
runner (:class:`StepRunner`), the actuator's instance changes (:class:`MigSteps`), and one node's timeouts and hook
conventions (:class:`ChangeSettings`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from flexmig.act.records import Slot
from flexmig.nvml.types import Inventory

__all__ = ["ChangeSettings", "MigSteps", "StepRunner"]


class StepRunner(Protocol):
    """The executor's journalled step runner for one action (``flexmig.act``)."""

    resumed: bool

    async def step(
        self, name: str, args: dict[str, Any], fn: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Run ``fn`` as step ``name`` unless the journal says it is done; raise StepFailed if it failed before."""
        ...


class MigSteps(Protocol):
    """The actuator's idempotent instance changes (they check the node before acting)."""

    async def destroy(self, slot: Slot) -> dict[str, Any]:
        """Destroy the idle instance at ``slot`` if it is there."""
        ...

    async def create(self, slot: Slot) -> dict[str, Any]:
        """Create ``slot``'s instance unless an identical one is there."""
        ...

    async def inventory(self) -> Inventory:
        """A fresh NVML inventory."""
        ...


@dataclass(frozen=True, slots=True)
class ChangeSettings:
    """Timeouts and the hook's conventions of one node's re-registrations."""

    node: str
    checkpoint_dir: str
    ack_timeout_s: float = 120.0
    close_s: float = 900.0
    idle_timeout_s: float = 60.0
    register_timeout_s: float = 60.0
    poll_s: float = 0.25
    signal: str = "USR1"
    static: bool = False
    """The node is a static one of slurm.conf (``[slurm] instance_nodes = static``): it leaves Slurm by returning to
    State=FUTURE, not by ``scontrol delete``."""
