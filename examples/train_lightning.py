#!/usr/bin/env python3
"""A PyTorch Lightning job that flexmig can migrate and re-split: one callback, and ``ckpt_path``.

A small regression model (a fixed random teacher, like ``train_ddp.py``) trains on the CPU, under DDP over gloo
when flexmig starts it on several instances. ``FlexmigCallback`` saves through Lightning's checkpointing when
flexmig asks, acknowledges, and ends the ranks; the next generation resumes from that checkpoint (loaded with
``weights_only=True``) at the next global step, on exactly the batches an uninterrupted run trains on
(``flexmig.dataloader``: the batches are defined per global step), under any world size.

Rank 0 appends JSON lines to ``--log``: ``start`` (the step it resumes after, world size, times) and ``step``
(the training loss at each optimizer step), each with its wall-clock time ``t``.

By hand: ``python examples/train_lightning.py --steps 30 --log /tmp/pl.log``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from flexmig_hook.lightning import FlexmigCallback


class Regression(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, features: int, lr: float) -> None:
        super().__init__()
        self.net = nn.Linear(features, 1)
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        self.log("loss", loss, sync_dist=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class JsonLog(pl.Callback):  # type: ignore[misc]
    """Rank 0's JSON-lines log (``start``, and ``step`` with the loss)."""

    def __init__(self, path: Path | None, times: dict[str, float], world: int, step_time: float) -> None:
        self.path, self.times, self.world, self.step_time = path, times, world, step_time

    def write(self, trainer: Any, **fields: Any) -> None:
        if self.path is not None and trainer.is_global_zero:
            with self.path.open("a") as f:
                f.write(json.dumps({**fields, "t": time.time()}) + "\n")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.write(trainer, event="start", step=trainer.global_step, world=self.world, **self.times)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.write(trainer, event="step", step=trainer.global_step, loss=float(outputs["loss"]))
        if self.step_time > 0:
            time.sleep(self.step_time)  # stands in for work


def main(argv: list[str] | None = None) -> int:
    t_imported = time.time()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=32, help="samples per global step, split over the ranks")
    p.add_argument("--log", type=Path, default=None)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (stands in for work)")
    args = p.parse_args(argv)

    g = torch.Generator().manual_seed(args.seed)
    teacher = torch.randn(args.features, 1, generator=g)
    x = torch.randn(8192, args.features, generator=g)
    data = torch.utils.data.TensorDataset(x, x @ teacher)
    torch.manual_seed(args.seed)
    model = Regression(args.features, lr=0.02)
    t_built = time.time()

    flexmig = FlexmigCallback()  # a standby rank waits here until flexmig hands over the checkpoint and the world
    times = {"t_imported": t_imported, "t_built": t_built, "t_world": time.time()}
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=args.steps,
        callbacks=[JsonLog(args.log, times, flexmig.hook.env.world_size, args.step_time), flexmig],  # log, then stop
        logger=False,
        enable_checkpointing=False,  # flexmig asks for the checkpoints it needs
        enable_progress_bar=False,
        enable_model_summary=False,
        **flexmig.trainer_settings(),
    )
    loader = flexmig.dataloader(data, args.global_batch, seed=args.seed)  # resumes at the checkpoint's step
    trainer.fit(model, loader, ckpt_path=flexmig.ckpt_path, weights_only=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
