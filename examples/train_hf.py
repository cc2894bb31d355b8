#!/usr/bin/env python3
"""A Hugging Face ``Trainer`` job that flexmig can migrate and re-split: one callback, and ``resume_from_checkpoint``.

A 2-layer GPT-2 built from a config (nothing is downloaded; ``HF_HUB_OFFLINE=1`` is fine) learns a repeating token
pattern on the CPU, under DDP over gloo when flexmig starts it on several instances. ``FlexmigCallback`` saves
through the Trainer's own checkpointing when flexmig asks, acknowledges, and ends the ranks; the next generation
resumes from that checkpoint, under any world size.

Rank 0 appends JSON lines to ``--log``: ``start`` (the step it resumes after, world size, times) and ``step`` (the
Trainer's loss at each optimizer step), each with its wall-clock time ``t``.

By hand: ``python examples/train_hf.py --steps 30 --log /tmp/hf.log``. Under flexmig: a spec like
``examples/train_ddp.toml`` with this script in ``argv`` (docs/jobs.md, "Frameworks").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from flexmig_hook.transformers import FlexmigCallback


class Pattern(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Windows of one repeating random token pattern: a language model learns it within a few dozen steps."""

    def __init__(self, samples: int, length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pattern = torch.randint(0, vocab, (7,), generator=g)
        self.samples, self.length = samples, length

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.pattern.roll(i % 7).repeat(self.length // 7 + 1)[: self.length]
        return {"input_ids": ids, "labels": ids.clone()}


class JsonLog(TrainerCallback):  # type: ignore[misc]
    """Rank 0's JSON-lines log of the run (``start``, and ``step`` with the loss)."""

    def __init__(self, path: Path | None, times: dict[str, float], world: int, step_time: float = 0.0) -> None:
        self.path, self.times, self.world, self.step_time = path, times, world, step_time

    def write(self, state: Any, **fields: Any) -> None:
        if self.path is not None and state.is_world_process_zero:
            with self.path.open("a") as f:
                f.write(json.dumps({**fields, "t": time.time()}) + "\n")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.write(state, event="start", step=state.global_step, world=self.world, **self.times)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self.write(state, event="step", step=state.global_step, loss=float(logs["loss"]))

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.step_time > 0:
            time.sleep(self.step_time)  # stands in for work, so that a run lasts long enough to be moved


def main(argv: list[str] | None = None) -> int:
    t_imported = time.time()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=4, help="samples per rank and step")
    p.add_argument("--log", type=Path, default=None)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (stands in for work)")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    # bos/eos inside the tiny vocabulary (GPT-2's 50256 is not, and the config warns at every start)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    data = Pattern(4096, 32, config.vocab_size, args.seed)
    t_built = time.time()

    flexmig = FlexmigCallback()  # a standby rank waits here until flexmig hands over the checkpoint and the world
    times = {"t_imported": t_imported, "t_built": t_built, "t_world": time.time()}
    training = TrainingArguments(
        output_dir=flexmig.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",  # flexmig asks for the saves it needs
        report_to=[],
        use_cpu=True,
        ddp_backend=flexmig.backend,
        disable_tqdm=True,
        seed=args.seed,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=data,
        callbacks=[flexmig, JsonLog(args.log, times, flexmig.hook.env.world_size, args.step_time)],
    )
    trainer.train(resume_from_checkpoint=flexmig.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
