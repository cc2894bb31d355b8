#!/usr/bin/env python3
"""A sharded (FSDP) torch job that flexmig can migrate and re-split to another world size.

An MLP learns a fixed random teacher (synthetic, deterministic data, as in ``train_ddp.py``), its parameters and
optimizer state sharded over the ranks with FSDP2 (``fully_shard``; on the CPU over gloo here, on a MIG node over
the backend flexmig names). Checkpoints go through ``torch.distributed.checkpoint`` (``flexmig_hook.dcp``): each
rank saves its shards, and a job saved by 2 ranks loads on 3 or on 1, resharded. The data stream is defined per
global step (``StepBatchSampler``), so it is the same whatever the world size.

Rank 0 appends JSON lines to ``--log``: ``start`` (step, world size, times), ``step`` (the loss on a fixed
evaluation set) and ``checkpoint``, each with its wall-clock time ``t``.

By hand (one process): ``python examples/train_fsdp.py --steps 30 --log /tmp/fsdp.log``.
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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import flexmig_hook as hook
from flexmig_hook import dcp as flexmig_dcp
from flexmig_hook import torch as torch_hook


def main(argv: list[str] | None = None) -> int:
    t_imported = time.time()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=24, help="samples per global step (divisible by 1, 2, 3, 4)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--log", type=Path, default=None)
    args = p.parse_args(argv)

    g = torch.Generator().manual_seed(args.seed)
    teacher = torch.randn(args.features, 1, generator=g)
    x = torch.randn(4096, args.features, generator=g)
    y = torch.tanh(x @ teacher)
    x_eval = torch.randn(256, args.features, generator=g)
    y_eval = torch.tanh(x_eval @ teacher)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(args.features, 64), nn.Tanh(), nn.Linear(64, 1))
    t_built = time.time()

    h = hook.install()  # a standby rank waits here until flexmig hands over the checkpoint and the world
    t_world = time.time()
    world = h.env.world_size
    if world > 1:
        dist.init_process_group(os.environ.get("FLEXMIG_DIST_BACKEND", "gloo"), timeout=timedelta(seconds=60))
    rank = dist.get_rank() if world > 1 else 0
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = flexmig_dcp.load_model(h.resume, model, opt) + 1 if h.resume is not None else 0

    def log(**fields: Any) -> None:
        if args.log is not None and rank == 0:
            with args.log.open("a") as f:
                f.write(json.dumps({**fields, "t": time.time()}) + "\n")

    log(event="start", step=start, world=world, resume=str(h.resume) if h.resume else None, standby=h.from_standby,
        t_imported=t_imported, t_built=t_built, t_world=t_world)  # fmt: skip
    sampler = torch_hook.StepBatchSampler(
        len(x), args.global_batch, rank=rank, world_size=world, seed=args.seed, start_step=start, steps=args.steps
    )
    for step, idx in enumerate(sampler, start=start):
        loss = ((model(x[idx]) - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            eval_loss = float(((model(x_eval) - y_eval) ** 2).mean())
        log(event="step", step=step, loss=eval_loss, world=world)
        if args.step_time > 0:
            time.sleep(args.step_time)
        if torch_hook.should_checkpoint(h):
            path = flexmig_dcp.save_model(h, step, model, opt)
            log(event="checkpoint", step=step, path=str(path))
            h.acknowledge(step, path)
            h.exit(0)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
