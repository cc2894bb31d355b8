"""``flexmig_hook.transformers``: a Hugging Face ``Trainer`` that flexmig can migrate and re-split, in one line.

::

    from flexmig_hook.transformers import FlexmigCallback

    flexmig = FlexmigCallback()                      # a standby rank waits here for its world: build the model first
    args = TrainingArguments(output_dir=flexmig.output_dir, use_cpu=..., ddp_backend=flexmig.backend, ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[flexmig])
    trainer.train(resume_from_checkpoint=flexmig.resume_from_checkpoint)

On a checkpoint request every rank stops at the same optimizer step (the flag is all-reduced), the Trainer saves
``checkpoint-N`` through its own ``_save_checkpoint`` (model, optimizer, scheduler, RNG states, trainer state),
rank 0 flushes every file of it to disk and acknowledges step ``N`` with that directory, and every rank ends
(:meth:`flexmig_hook.Hook.exit`). The next generation resumes with ``resume_from_checkpoint`` at step ``N + 1``
under whatever world size it was given: the Trainer restores the optimizer and the step, and its data loader skips
the batches already seen (with another world size, the batches are those of the new world).

Needs ``transformers`` (``pip install 'flexmig-hook[transformers]'``); imported only by this module.
"""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import flexmig_hook
from flexmig_hook.atomic import fsync_tree
from flexmig_hook.torch import should_checkpoint

__all__ = ["FlexmigCallback"]


_MISSING = "There were missing keys in the checkpoint model loaded: "


def _tied_names(model: torch.nn.Module) -> frozenset[str]:
    """The names of ``model``'s parameters that are the very tensor of another of its parameters (tied weights)."""
    by_tensor: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(name)
    return frozenset(n for names in by_tensor.values() if len(names) > 1 for n in names)


class _TiedKeysFilter(logging.Filter):
    """Drops the Trainer's "missing keys" warning when every key it names is a tied weight."""

    def __init__(self, tied: frozenset[str]) -> None:
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_MISSING):
            return True
        try:
            missing = ast.literal_eval(message[len(_MISSING) :].rstrip("."))
        except (ValueError, SyntaxError):
            return True
        return not (isinstance(missing, list) and missing and set(map(str, missing)) <= self.tied)


class FlexmigCallback(TrainerCallback):
    """Checkpoints a ``Trainer`` on flexmig's request, through the Trainer's own save, and ends the ranks.

    Build it before ``TrainingArguments`` (it calls :func:`flexmig_hook.install`, which in a standby rank returns
    only once flexmig hands over the world that ``TrainingArguments`` reads). ``hook`` is for tests.
    """

    def __init__(self, hook: flexmig_hook.Hook | None = None) -> None:
        self.hook = hook if hook is not None else flexmig_hook.install()
        self._saving = False

    @property
    def output_dir(self) -> str:
        """Where the Trainer must save (its ``output_dir``): flexmig's checkpoint directory."""
        return str(self.hook.checkpoint_dir)

    @property
    def resume_from_checkpoint(self) -> str | None:
        """The checkpoint flexmig says to resume from (``Trainer.train(resume_from_checkpoint=...)``), or None."""
        return str(self.hook.resume) if self.hook.resume is not None else None

    @property
    def backend(self) -> str | None:
        """The collective backend flexmig recommends (``TrainingArguments(ddp_backend=...)``; gloo on MIG), or None
        for a single rank (the Trainer then starts no process group)."""
        if self.hook.env.world_size <= 1:
            return None
        return os.environ.get("FLEXMIG_DIST_BACKEND", "gloo")

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Once the Trainer has its model: quiet its warning about missing keys when resuming, where the keys
        missing are only tied weights (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``: the checkpoint
        holds it once, and loading it loads both). Any other missing key is still warned about."""
        model = kwargs.get("model")
        if model is not None:
            logging.getLogger("transformers.trainer").addFilter(_TiedKeysFilter(_tied_names(model)))
        return control

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Refuse an ``output_dir`` outside flexmig's checkpoint directory (flexmig accepts no checkpoint there)."""
        if self.hook.job is not None:
            out, root = Path(str(args.output_dir)).resolve(), self.hook.checkpoint_dir.resolve()
            if out != root and root not in out.parents:
                raise ValueError(f"TrainingArguments.output_dir {out} must lie inside FLEXMIG_CHECKPOINT_DIR {root}")
        return control

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """At each optimizer step: if any rank was asked to checkpoint, have the Trainer save now."""
        if should_checkpoint(self.hook):
            self._saving = True
            control.should_save = True
        return control

    def on_save(  # noqa: RET503 - the last line ends the process
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """After the Trainer's save that flexmig asked for: flush it to disk, acknowledge it, end every rank."""
        if not self._saving:
            return control
        ckpt = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            dist.barrier()  # every rank's files (its RNG state) are written
        if self.hook.rank == 0:
            fsync_tree(ckpt)
            self.hook.acknowledge(state.global_step, ckpt)
        if distributed:
            dist.barrier()  # no rank ends while rank 0 still needs the group
        self.hook.exit(0)
