"""``flexmig_hook.torch``: the torch side of the checkpoint hook.

Three things every movable torch job needs:

* :func:`should_checkpoint` makes all ranks agree on the step at which they stop (the signal reaches ranks at
  slightly different moments; one rank stopping a step early would leave the others hanging in an all-reduce);
* :func:`save_checkpoint` / :func:`load_checkpoint` store model, optimizer, step and RNG states in one file that
  rank 0 writes atomically, and restore them under any world size;
* :class:`StepBatchSampler` re-shards data for a new world size: the sample order is one global stream that
  depends only on the seed and the step, and each rank takes a fixed share of each global batch. After a move
  from 2 to 4 ranks, step ``k + 1`` sees exactly the samples it would have seen without the move.

Import cost is torch's (which the job has; ``flexmig-hook`` itself requires nothing); the plain
:mod:`flexmig_hook` stays stdlib-only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from flexmig_hook import Hook
from flexmig_hook.atomic import atomic_writer

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

CHECKPOINT_FORMAT = "flexmig.torch/1"


def _distributed() -> bool:
    return bool(dist.is_available() and dist.is_initialized())


def should_checkpoint(hook: Hook) -> bool:
    """True on every rank when any rank was asked to checkpoint; a collective when torch.distributed is up.

    Call it at the same point of every step on every rank. Costs one all-reduce of one integer.
    """
    local = 1 if hook.should_checkpoint() else 0
    if not _distributed():
        return bool(local)
    flag = torch.tensor([local], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel (its state dict keys carry no ``module.`` prefix)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What :func:`load_checkpoint` restored besides the tensors: the step saved and the job's extras."""

    step: int
    world_size: int
    extra: Mapping[str, Any] = field(default_factory=dict)


def checkpoint_path(directory: Path, step: int) -> Path:
    """The file name :func:`save_checkpoint` uses for ``step``."""
    return directory / f"step-{step:09d}.pt"


def save_checkpoint(
    hook: Hook,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    extra: Mapping[str, Any] | None = None,
    directory: Path | None = None,
) -> Path:
    """Save the state after ``step`` completed; every rank calls it (it gathers RNG states), rank 0 writes.

    Returns the checkpoint's path on every rank. The file is complete when this returns on rank 0 (temp file,
    fsync, rename), so the acknowledgement can follow at once. Ends with a barrier so no rank exits while rank 0
    still needs it.
    """
    rank = dist.get_rank() if _distributed() else 0
    world = dist.get_world_size() if _distributed() else 1
    rngs: list[Any] = [None] * world
    if _distributed():
        dist.all_gather_object(rngs, _rng_state())
    else:
        rngs[0] = _rng_state()
    out_dir = hook.checkpoint_dir if directory is None else directory
    path = checkpoint_path(out_dir, step)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": int(step),
            "world_size": world,
            "model": _unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "rng": rngs,
            "extra": dict(extra or {}),
        }
        with atomic_writer(path) as f:
            torch.save(state, f)
    if _distributed():
        dist.barrier()
    return path


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> CheckpointState:
    """Restore model, optimizer and this rank's RNG from ``path``; works under a world size other than the saver's.

    With the same world size each rank gets its own RNG state back; with another, every rank takes rank 0's and
    re-seeds from it with its rank, so ranks stay decorrelated. Loads with ``weights_only=True`` (no pickled code
    runs from a checkpoint file).
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a {CHECKPOINT_FORMAT} checkpoint")
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    rank = dist.get_rank() if _distributed() else 0
    world = dist.get_world_size() if _distributed() else 1
    rngs = state.get("rng") or []
    saved_world = int(state.get("world_size", len(rngs) or 1))
    if rngs:
        mine = rngs[rank] if saved_world == world and rank < len(rngs) else rngs[0]
        torch.set_rng_state(mine["torch"])
        py = mine["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        if saved_world != world:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()) + rank)
            random.seed(random.getrandbits(32) + rank)
    return CheckpointState(step=int(state["step"]), world_size=saved_world, extra=dict(state.get("extra") or {}))


def global_batch_indices(num_samples: int, global_batch: int, step: int, seed: int = 0) -> list[int]:
    """The sample indices of global batch ``step``: a window of one endless stream of per-epoch permutations.

    Depends only on (num_samples, global_batch, step, seed), never on the world size. Epoch ``e`` is a shuffle
    of ``range(num_samples)`` seeded with ``(seed, e)``; a batch may straddle two epochs.
    """
    if num_samples <= 0 or global_batch <= 0 or step < 0:
        raise ValueError("num_samples and global_batch must be positive and step non-negative")
    first = step * global_batch
    out: list[int] = []
    perms: dict[int, list[int]] = {}
    for pos in range(first, first + global_batch):
        epoch, offset = divmod(pos, num_samples)
        if epoch not in perms:
            perm = list(range(num_samples))
            random.Random(f"{seed}:{epoch}").shuffle(perm)  # noqa: S311 - data order, not secrets
            perms[epoch] = perm
        out.append(perms[epoch][offset])
    return out


def rank_share(batch: list[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s part of a global batch: every ``world_size``-th sample from position ``rank``.

    The shares of all ranks partition the batch; sizes differ by at most one (choose a global batch divisible by
    the world sizes you use to keep gradients exactly equal to the single-process ones).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    return batch[rank::world_size]


class StepBatchSampler:
    """A batch sampler (``DataLoader(batch_sampler=...)``) that yields this rank's indices step after step.

    Unlike ``DistributedSampler``, the order is defined per global step, so a job resumed at ``start_step`` under
    another world size continues the same sample stream.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        *,
        rank: int,
        world_size: int,
        seed: int = 0,
        start_step: int = 0,
        steps: int | None = None,
    ) -> None:
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.start_step = start_step
        self.steps = steps

    def indices(self, step: int) -> list[int]:
        """This rank's sample indices at global step ``step``."""
        batch = global_batch_indices(self.num_samples, self.global_batch, step, self.seed)
        return rank_share(batch, self.rank, self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while self.steps is None or step < self.steps:
            yield self.indices(step)
            step += 1

    def __len__(self) -> int:
        if self.steps is None:
            raise TypeError("an endless StepBatchSampler has no length")
        return max(0, self.steps - self.start_step)
