#!/usr/bin/env python3
"""A small, real torch DDP training job that flexmig can migrate and re-split.

Linear regression on synthetic, deterministic data (a fixed random teacher), trained with SGD under
DistributedDataParallel over gloo (``FLEXMIG_DIST_BACKEND``; CPU works, and on a MIG node each rank sees its one
MIG device as ``cuda:0``).
It uses the checkpoint hook: on a checkpoint request every rank stops at the same step, rank 0 saves model,
optimizer, step and RNG atomically, acknowledges, and all ranks exit 0. On a restart with ``FLEXMIG_RESUME`` it
loads that checkpoint and continues at the next step, under any world size: the data stream is defined per global
step (``StepBatchSampler``), so the job trains on the same samples whatever the number of ranks.

It is written for fast moves: the expensive start-up (importing torch, building the model and the optimizer,
making the data) comes before ``hook.install()``, so with ``standby = true`` in its spec flexmig starts the next
generation while this one still trains, and ``install()`` returns only when flexmig hands it the checkpoint and the
new world; only then does it join the process group. After acknowledging, ``h.exit()`` ends the rank without the
interpreter's teardown.

Rank 0 appends one JSON object per line to ``--log`` (``start``, ``step`` with the loss on a fixed evaluation set,
``checkpoint``, ``done``), with the exact parameter values at start and at checkpoint so a test can compare them,
and wall-clock times (``t``; in ``start`` also when the imports were done, the model built, the world known and
the checkpoint loaded) so a benchmark can tell what a move cost the job.

Run it by hand (one process): ``python examples/train_ddp.py --steps 50 --log /tmp/train.log``.
Under flexmig: see ``examples/train_ddp.toml``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import flexmig_hook as hook
from flexmig_hook import torch as torch_hook


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--steps", type=int, default=1000, help="global steps to train in all (default 1000)")
    p.add_argument("--global-batch", type=int, default=32, help="samples per global step, split over ranks")
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (stands in for work)")
    p.add_argument("--log", type=Path, default=None, help="JSON-lines log written by rank 0")
    p.add_argument(
        "--teardown",
        action="store_true",
        help="after acknowledging, leave the process group and exit through the interpreter's teardown, as ranks "
        "did before Hook.exit (bench/migration.py's rival)",
    )
    return p.parse_args(argv)


def make_data(samples: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training and evaluation sets from a fixed teacher; identical on every rank and every run."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(features, 1, generator=g)
    x = torch.randn(samples, features, generator=g)
    y = x @ teacher + 0.01 * torch.randn(samples, 1, generator=g)
    x_eval = torch.randn(256, features, generator=g)
    y_eval = x_eval @ teacher
    return x, y, x_eval, y_eval


def params_of(model: nn.Module) -> list[float]:
    """Every parameter value, flattened, as Python floats (exact for float32)."""
    return [float(v) for p in model.parameters() for v in p.detach().reshape(-1).tolist()]


class Log:
    """Rank 0's JSON-lines log; other ranks write nothing."""

    def __init__(self, path: Path | None, rank: int) -> None:
        self.f = path.open("a", buffering=1) if path is not None and rank == 0 else None

    def write(self, **fields: Any) -> None:
        if self.f is not None:
            self.f.write(json.dumps(fields) + "\n")
            self.f.flush()


def main(argv: list[str] | None = None) -> int:
    t_imported = time.time()
    args = parse_args(argv)
    # Start-up that needs no world and no device: a standby rank does it before the move.
    torch.manual_seed(args.seed)
    x, y, x_eval, y_eval = make_data(args.samples, args.features, args.seed)
    net = nn.Linear(args.features, 1)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    t_built = time.time()

    h = hook.install()  # a standby rank waits here until flexmig hands over the checkpoint and the world
    t_world = time.time()
    world = h.env.world_size
    distributed = world > 1
    if distributed:
        # flexmig recommends the backend (gloo: no P2P between MIG instances); by hand, gloo too.
        dist.init_process_group(os.environ.get("FLEXMIG_DIST_BACKEND", "gloo"), timeout=timedelta(seconds=60))
    rank = dist.get_rank() if distributed else 0
    log = Log(args.log, rank)
    model: nn.Module = nn.parallel.DistributedDataParallel(net) if distributed else net

    start = 0
    if h.resume is not None:
        state = torch_hook.load_checkpoint(h.resume, model, opt)
        start = state.step + 1
    log.write(
        event="start",
        step=start,
        world=world,
        resume=str(h.resume) if h.resume else None,
        params=params_of(net),
        pid=os.getpid(),
        standby=h.from_standby,
        t_imported=t_imported,
        t_built=t_built,
        t_world=t_world,
        t=time.time(),
    )

    sampler = torch_hook.StepBatchSampler(
        args.samples,
        args.global_batch,
        rank=rank,
        world_size=world,
        seed=args.seed,
        start_step=start,
        steps=args.steps,
    )
    step = start
    for step, idx in enumerate(sampler, start=start):
        xb, yb = x[idx], y[idx]
        # Sum over this rank's share divided by the global batch, times the world size: after DDP averages the
        # gradients over ranks, the update equals the single-process update on the whole global batch.
        loss = ((model(xb) - yb) ** 2).sum() / args.global_batch * world
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            eval_loss = float(((net(x_eval) - y_eval) ** 2).mean())
        log.write(event="step", step=step, loss=eval_loss, world=world, t=time.time())
        if args.step_time > 0:
            time.sleep(args.step_time)
        if torch_hook.should_checkpoint(h):
            path = torch_hook.save_checkpoint(h, step, model, opt)
            log.write(event="checkpoint", step=step, path=str(path), params=params_of(net), t=time.time())
            h.acknowledge(step, path)
            if args.teardown:
                if distributed:
                    dist.destroy_process_group()
                return 0
            h.exit(0)  # the checkpoint is on disk and acknowledged: skip the interpreter's teardown
    log.write(event="done", step=step, t=time.time())
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
