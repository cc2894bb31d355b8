"""``flexmig_hook.lightning``: a PyTorch Lightning ``Trainer`` that flexmig can migrate and re-split, in one line.

::

    from flexmig_hook.lightning import FlexmigCallback

    flexmig = FlexmigCallback()                      # a standby rank waits here for its world: build the model first
    trainer = L.Trainer(callbacks=[flexmig], **flexmig.trainer_settings(), max_steps=...)
    trainer.fit(model, data, ckpt_path=flexmig.ckpt_path)

    loader = flexmig.dataloader(dataset, global_batch=32, seed=1234)   # the data, resumable at any step
    trainer.fit(model, loader, ckpt_path=flexmig.ckpt_path, weights_only=True)

On a checkpoint request every rank stops after the same batch (the flag is all-reduced), the Trainer writes its
own checkpoint (``Trainer.save_checkpoint``: model, optimizers, schedulers, loops' progress, callbacks' state),
rank 0 flushes it to disk and acknowledges the global step with it, and every rank ends
(:meth:`flexmig_hook.Hook.exit`). The next generation resumes with ``ckpt_path`` at the next step, under whatever
world size it was given. :meth:`FlexmigCallback.trainer_settings` tells Lightning that flexmig started the
processes (torch elastic's variables) and which backend to use.

**The data resumes at the right batch.** A shuffled ``DataLoader`` is not resumable: Lightning starts its epoch
again from batch 0 after a mid-epoch checkpoint (and warns so), so some samples are trained twice and others never.
:meth:`FlexmigCallback.dataloader` gives a loader whose batches are defined per global step
(:class:`flexmig_hook.torch.StepBatchSampler`: one shuffled stream of epochs, each rank its share of every global
batch), starting at the step the checkpoint holds: a moved job trains on exactly the batches an uninterrupted one
would, at any world size. It is an endless iterable, so Lightning counts no epochs of its own (bound the run with
``max_steps``) and injects no ``DistributedSampler``. ``weights_only=True`` loads the checkpoint without unpickling
anything but tensors and plain containers (a Lightning checkpoint of a module without pickled hyperparameters holds
nothing else).

**SLURM auto-requeue.** Lightning's own requeue (``SLURMEnvironment(auto_requeue=True)``) also listens on SIGUSR1,
saves an ``hpc_ckpt`` and calls ``scontrol requeue``. Under flexmig the hook's handler is installed first, when
this callback is built, and Lightning installs its SIGUSR1 handler only where none exists, so flexmig's
checkpoint takes its place: flexmig's Slurm integration does the requeue itself (its TaskProlog makes
``acknowledge()`` wait for it) and moves the job between MIG instances instead of restarting it blindly.
Lightning's SIGTERM handling is left as it is.

Needs ``lightning`` (``pip install 'flexmig-hook[lightning]'``); imported only by this module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sized
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy

import flexmig_hook
from flexmig_hook.atomic import fsync_tree
from flexmig_hook.torch import StepBatchSampler, should_checkpoint

__all__ = ["FlexmigCallback", "StepBatches"]


class StepBatches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """This rank's batches of ``dataset``, global step after global step from ``sampler``'s start, each collated
    (``torch.utils.data.default_collate``). Load it with ``DataLoader(..., batch_size=None)`` and no workers: it is
    already batched, and workers would each replay the whole stream."""

    def __init__(self, dataset: Any, sampler: StepBatchSampler) -> None:
        self.dataset = dataset
        self.sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise RuntimeError("StepBatches must be loaded without worker processes (num_workers=0)")
        for indices in self.sampler:
            yield torch.utils.data.default_collate([self.dataset[i] for i in indices])


class FlexmigCallback(pl.Callback):
    """Checkpoints a Lightning ``Trainer`` on flexmig's request, through Lightning's checkpointing, and ends the
    ranks. Build it before the ``Trainer`` (it calls :func:`flexmig_hook.install`, which in a standby rank returns
    only once flexmig hands over the world). ``hook`` is for tests."""

    def __init__(self, hook: flexmig_hook.Hook | None = None) -> None:
        self.hook = hook if hook is not None else flexmig_hook.install()

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint flexmig says to resume from (``Trainer.fit(ckpt_path=...)``), or None."""
        return str(self.hook.resume) if self.hook.resume is not None else None

    def trainer_settings(self) -> dict[str, Any]:
        """``Trainer`` arguments for the world flexmig started: one process per node (MIG instance), the ranks from
        torch elastic's variables, DDP over the backend flexmig recommends (gloo on MIG). Empty for one rank."""
        world = self.hook.env.world_size
        if world <= 1:
            return {}
        os.environ.setdefault("GROUP_RANK", os.environ.get("RANK", "0"))  # one process per node: node rank = rank
        backend = os.environ.get("FLEXMIG_DIST_BACKEND", "gloo")
        return {
            "num_nodes": world,
            "devices": 1,
            "plugins": [TorchElasticEnvironment()],
            "strategy": DDPStrategy(process_group_backend=backend),
        }

    def dataloader(self, dataset: Sized, global_batch: int, *, seed: int = 0) -> torch.utils.data.DataLoader[Any]:
        """A training loader of ``dataset`` that resumes at the right batch: ``global_batch`` samples per global
        step over all ranks (this rank gets every world-size-th), shuffled per epoch with ``seed``, starting at the
        step flexmig resumes after (``FLEXMIG_RESUME_STEP``, which is ``trainer.global_step`` at the checkpoint;
        0 on a first start). Choose ``global_batch`` divisible by the world sizes the job may run at."""
        world = self.hook.env.world_size
        if global_batch < world:
            raise ValueError(f"global_batch {global_batch} is smaller than the world size {world}")
        sampler = StepBatchSampler(
            len(dataset),
            global_batch,
            rank=self.hook.rank,
            world_size=world,
            seed=seed,
            start_step=self.hook.env.resume_step or 0,
        )
        return torch.utils.data.DataLoader(StepBatches(dataset, sampler), batch_size=None)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After each batch: if any rank was asked to checkpoint, save, acknowledge and end every rank."""
        if not should_checkpoint(self.hook):
            return
        step = int(trainer.global_step)
        path = Path(self.hook.checkpoint_dir) / f"step-{step:09d}.ckpt"
        trainer.save_checkpoint(path)  # every rank calls it; rank 0 writes, the strategy waits for it
        if self.hook.rank == 0:
            fsync_tree(path)
            self.hook.acknowledge(step, path)
        trainer.strategy.barrier("flexmig-acknowledged")
        self.hook.exit(0)
