"""``flexmig.hook.torch``: :mod:`flexmig_hook.torch` (the torch side of the hook) under the daemon package's name.

Importing it imports torch."""

from __future__ import annotations

from flexmig_hook.torch import (
    CHECKPOINT_FORMAT,
    CheckpointState,
    StepBatchSampler,
    global_batch_indices,
    load_checkpoint,
    rank_share,
    save_checkpoint,
    should_checkpoint,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointState",
    "StepBatchSampler",
    "global_batch_indices",
    "load_checkpoint",
    "rank_share",
    "save_checkpoint",
    "should_checkpoint",
]
