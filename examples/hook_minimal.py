#!/usr/bin/env python3
"""The checkpoint hook in a few lines, standard library only: a counter that survives moves between instances.

Each step adds the step number to a running total (its "model"). On a checkpoint request it writes
``{"step": N, "total": T}`` atomically, acknowledges, and exits 0; started with ``FLEXMIG_RESUME`` it continues at
step N + 1 with the saved total, so after any number of moves ``total == sum(range(step + 1))``.

Rank 0 appends JSON lines to ``--log``: ``start`` (pid, world size, generation, resumed step), ``step`` every
``--log-every`` steps, ``checkpoint`` and ``done``, each with its wall-clock time ``t``. After acknowledging it ends
with ``h.exit()`` (no interpreter teardown); with ``standby = true`` in its spec it waits as a standby rank in
``hook.install()`` until flexmig hands it the checkpoint and its world.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import flexmig_hook as hook  # pip install flexmig-hook (or ./hook): no other dependency


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--log", type=Path, default=None)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--teardown", action="store_true", help="exit through the interpreter's teardown (for comparison)")
    args = p.parse_args(argv)

    t_imported = time.time()
    h = hook.install()  # a standby rank waits here for its handover
    t_world = time.time()
    step, total = 0, 0
    if h.resume is not None:
        saved = json.loads(h.resume.read_text())
        step, total = saved["step"] + 1, saved["total"]
    logf = args.log.open("a", buffering=1) if args.log is not None and h.rank == 0 else None

    def log(**fields: object) -> None:
        if logf is not None:
            logf.write(json.dumps(fields) + "\n")

    log(
        event="start",
        step=step,
        total=total,
        pid=os.getpid(),
        world=h.env.world_size,
        generation=os.environ.get("FLEXMIG_GENERATION"),
        resume=str(h.resume) if h.resume else None,
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        standby=h.from_standby,
        t_imported=t_imported,
        t_world=t_world,
        t=time.time(),
    )
    while step < args.steps:
        total += step
        if step % args.log_every == 0:
            log(event="step", step=step, total=total, t=time.time())
        if h.should_checkpoint():
            path = h.checkpoint_dir / f"rank{h.rank}-step{step:09d}.json"
            hook.atomic_write_json(path, {"step": step, "total": total})
            log(event="checkpoint", step=step, total=total, path=str(path), t=time.time())
            h.acknowledge(step, path)
            if args.teardown:
                return 0
            h.exit(0)  # checkpoint written and acknowledged: end without the interpreter's teardown
        step += 1
        time.sleep(args.step_time)
    log(event="done", step=step - 1, total=total, t=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
