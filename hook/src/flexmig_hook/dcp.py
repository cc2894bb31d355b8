"""``flexmig_hook.dcp``: checkpoints of sharded models (FSDP, DTensor) through ``torch.distributed.checkpoint``.

A sharded model's state lives in pieces on every rank; ``torch.distributed.checkpoint`` (DCP) saves each rank's
pieces with a plan of the whole, and loads them back into *whatever sharding the loading ranks have*: a job saved
by 2 ranks loads on 3 or on 1. That is what a re-split needs, so an FSDP job becomes movable with::

    from flexmig_hook import dcp as flexmig_dcp

    h = hook.install()                                   # a standby rank waits here for its world
    dist.init_process_group(...); model = fully_shard(model, mesh=...); optimizer = ...
    step = flexmig_dcp.load_model(h.resume, model, optimizer) + 1 if h.resume else 0
    ...
    if flexmig_torch.should_checkpoint(h):
        path = flexmig_dcp.save_model(h, step, model, optimizer)     # every rank calls it
        h.acknowledge(step, path)
        h.exit(0)

:func:`save_model` writes into a temporary directory, flushes every file to disk, and renames it to
``step-N.dcp`` (rank 0, once every rank has written), so an acknowledged checkpoint is always complete.
``get_state_dict``/``set_state_dict`` (``torch.distributed.checkpoint.state_dict``) turn FSDP's and plain
modules' states into DCP's form and back, optimizer included. :func:`save` and :func:`load` take any state dict.

Imports torch (which a torch job has); ``flexmig-hook`` itself requires nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from flexmig_hook import Hook
from flexmig_hook.atomic import fsync_dir, fsync_tree

__all__ = ["checkpoint_path", "load", "load_model", "save", "save_model"]


def _distributed() -> bool:
    return bool(dist.is_available() and dist.is_initialized())


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def checkpoint_path(directory: Path, step: int) -> Path:
    """The directory :func:`save` writes for ``step``."""
    return directory / f"step-{step:09d}.dcp"


def save(hook: Hook, step: int, state_dict: Mapping[str, Any], *, directory: Path | None = None) -> Path:
    """Save ``state_dict`` (sharded or not) as the checkpoint of ``step``; every rank calls it, with its pieces.

    Returns the checkpoint directory on every rank, complete and on disk (each file fsynced, then renamed into
    place by rank 0) once this returns, so the acknowledgement may follow at once.
    """
    out_dir = hook.checkpoint_dir if directory is None else directory
    final = checkpoint_path(out_dir, step)
    tmp = out_dir / f".{final.name}.tmp"
    rank = dist.get_rank() if _distributed() else 0
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
    _barrier()
    dcp_save(dict(state_dict), checkpoint_id=str(tmp))
    _barrier()
    if rank == 0:
        fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.replace(final)
        fsync_dir(out_dir)
    _barrier()
    return final


def load(path: str | Path, state_dict: dict[str, Any]) -> None:
    """Load the checkpoint at ``path`` into ``state_dict`` in place, resharded to this world's sharding."""
    dcp_load(state_dict, checkpoint_id=str(path))


def save_model(
    hook: Hook,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    extra: Mapping[str, Any] | None = None,
    directory: Path | None = None,
) -> Path:
    """Save a (sharded) model, its optimizer and ``step`` through DCP; every rank calls it. See :func:`save`."""
    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": msd, "step": torch.tensor(step)}
    if extra:
        state["extra"] = dict(extra)
    if optimizer is not None:
        state["optimizer"] = osd
    return save(hook, step, state, directory=directory)


def load_model(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Restore a (sharded) model and its optimizer from :func:`save_model`'s checkpoint, under this world's
    sharding, whatever the saver's; returns the step it holds."""
    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": msd, "step": torch.tensor(0)}
    if optimizer is not None:
        state["optimizer"] = osd
    load(path, state)
    if optimizer is not None:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={})
    return int(state["step"])
