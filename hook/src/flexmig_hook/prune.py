"""Keep a job's checkpoints to a bound: after each acknowledgement, the older ones of the same series go.

A job moved twice an hour writes 48 checkpoints a day, each as big as the model and its optimizer. The series is
told by the acknowledged checkpoint's own name: the run of digits in it that spells the acknowledged step is the
step, every other run of digits may differ (``rank0-step000000298.json`` is of one series with
``rank1-step000000120.json``; ``checkpoint-120``, ``step-000000120.ckpt``, ``step-120.dcp`` likewise). Entries of
the checkpoint's directory in that series with a smaller step are removed, but the ``keep - 1`` newest of them;
the acknowledged checkpoint itself, and any entry of a larger step, are never touched. Steps are counted, not
files: a series of one file per rank keeps every rank's file of the steps it keeps. Standard library only;
run by rank 0, as the job's user, after it acknowledged (:meth:`flexmig_hook.Hook.acknowledge`).
"""

from __future__ import annotations

import re
import shutil
import stat
from pathlib import Path

__all__ = ["prune_checkpoints", "series_pattern"]


def series_pattern(name: str, step: int) -> re.Pattern[str] | None:
    """A pattern matching the names of ``name``'s series, its step as the group ``step``; None when no run of digits
    in ``name`` spells ``step`` (the series cannot be told, so nothing is pruned)."""
    runs = list(re.finditer(r"\d+", name))
    steps = [m for m in runs if int(m.group()) == step]
    if not steps:
        return None
    mark = steps[-1]
    out, at = [], 0
    for m in runs:
        out.append(re.escape(name[at : m.start()]))
        out.append(r"(?P<step>\d+)" if m is mark else r"\d+")
        at = m.end()
    out.append(re.escape(name[at:]))
    return re.compile("".join(out))


def prune_checkpoints(acknowledged: Path, step: int, keep: int) -> list[Path]:
    """Remove the checkpoints of ``acknowledged``'s series older than the ``keep`` newest (the acknowledged one
    counts, and stays whatever ``keep`` says); returns what was removed. ``keep`` 0: remove nothing. A directory
    (Hugging Face's ``checkpoint-N``, ``torch.distributed.checkpoint``'s) goes with its contents; a symbolic link is
    removed, never followed. What cannot be removed is left (OSError is not raised: pruning only saves space)."""
    if keep <= 0:
        return []
    pattern = series_pattern(acknowledged.name, step)
    if pattern is None:
        return []
    older: list[tuple[int, str]] = []
    try:
        names = [p.name for p in acknowledged.parent.iterdir()]
    except OSError:
        return []
    for name in names:
        m = pattern.fullmatch(name)
        if m is not None and name != acknowledged.name and int(m.group("step")) < step:
            older.append((int(m.group("step")), name))
    kept = set(sorted({s for s, _ in older}, reverse=True)[: keep - 1])  # by step: one per rank may share one
    removed = []
    for _, name in sorted(n for n in older if n[0] not in kept):
        path = acknowledged.parent / name
        try:
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
