"""The job ``flexmig demo`` runs: a toy training loop that implements the checkpoint hook, standard library only.

Run as ``python -m flexmig.cli.demo_job --steps N --step-time S`` (one process per rank, as flexmigd launches
it). Each step "trains" on this rank's shard of the step's samples: a running sum stands for the model and a
loss falls with the step. On a checkpoint request it saves ``{"step", "model"}`` atomically, acknowledges and
exits 0; resumed (``FLEXMIG_RESUME``) it continues at the saved step + 1, with another world size after a
re-split (the shards are cut per step, so no sample is lost or seen twice). Rank 0 prints one line per
``--report-every`` steps to its log, and the job exits 0 after ``--steps`` steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from flexmig import hook

__all__ = ["main", "shard"]

_SAMPLES_PER_STEP = 64


def shard(step: int, rank: int, world: int) -> range:
    """The sample indices rank ``rank`` of ``world`` trains on at global step ``step``."""
    first = step * _SAMPLES_PER_STEP
    return range(first + rank, first + _SAMPLES_PER_STEP, world)


def main(argv: Sequence[str] | None = None) -> int:
    """Train until ``--steps``, or until the daemon asks for a checkpoint; returns the exit status."""
    p = argparse.ArgumentParser(prog="flexmig-demo-job", description="flexmig's demo job (toy training loop)")
    p.add_argument("--steps", type=int, default=600, help="steps to train (default %(default)s)")
    p.add_argument("--step-time", type=float, default=0.1, help="seconds per step (default %(default)s)")
    p.add_argument("--report-every", type=int, default=50, help="rank 0 prints a line every N steps")
    args = p.parse_args(argv)

    h = hook.install()
    rank, world = h.rank, h.env.world_size
    step, model = 0, 0
    if h.resume is not None:
        saved = json.loads(h.resume.read_text())
        step, model = int(saved["step"]) + 1, int(saved["model"])
    if rank == 0:
        how = f"resumed at step {step}" if h.resume is not None else "started"
        print(f"{how}, {world} rank(s), step {step}/{args.steps}", flush=True)
    while step < args.steps:
        model += sum(shard(step, rank, world)) * world  # every rank adds its shard, scaled as an all-reduce would
        time.sleep(args.step_time)
        if rank == 0 and step % args.report_every == 0:
            print(f"step {step}/{args.steps} loss {1.0 / (1.0 + 0.02 * step):.4f}", flush=True)
        if h.should_checkpoint():
            path = h.checkpoint_dir / f"rank{rank}-step{step:07d}.json"
            hook.atomic_write_json(path, {"step": step, "model": model})
            h.acknowledge(step, path)
            if rank == 0:
                print(f"checkpoint at step {step}: {path.name}; exiting for the move", flush=True)
            return 0
        step += 1
    if rank == 0:
        print(f"done: {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
