"""The Hugging Face callback quiets the Trainer's "missing keys" warning on a resume only where every key it names is
a tied weight (loading the one tensor loads both); any other missing key is still warned about."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from flexmig_hook import install  # noqa: E402
from flexmig_hook.transformers import FlexmigCallback  # noqa: E402


def test_only_tied_weights_missing_is_not_warned_about(tmp_path: Path) -> None:
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=1)
    )
    callback = FlexmigCallback(install({"FLEXMIG_CHECKPOINT_DIR": str(tmp_path)}, handler=False))
    logger = logging.getLogger("transformers.trainer")
    before = list(logger.filters)
    try:
        callback.on_init_end(None, None, None, model=model)  # type: ignore[arg-type]
        (added,) = [f for f in logger.filters if f not in before]
        head = "There were missing keys in the checkpoint model loaded: "
        tied = logging.LogRecord("t", logging.WARNING, "", 0, "%s", (head + "['lm_head.weight'].",), None)
        both = "['lm_head.weight', 'transformer.h.0.mlp.c_fc.weight']."
        real = logging.LogRecord("t", logging.WARNING, "", 0, head + both, None, None)
        other = logging.LogRecord("t", logging.WARNING, "", 0, "something else", None, None)
        assert isinstance(added, logging.Filter)
        assert added.filter(tied) is False
        assert added.filter(real) is True and added.filter(other) is True
    finally:
        for f in [f for f in logger.filters if f not in before]:
            logger.removeFilter(f)
