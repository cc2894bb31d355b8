"""``flexmig.hook.atomic``: :mod:`flexmig_hook.atomic` (crash-safe writes) under the daemon package's name."""

from __future__ import annotations

from flexmig_hook.atomic import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_writer,
    fsync_dir,
    fsync_tree,
)

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_writer",
    "fsync_dir",
    "fsync_tree",
]
