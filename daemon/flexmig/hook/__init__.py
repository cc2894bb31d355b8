"""``flexmig.hook``: the checkpoint hook, as the daemon's package names it.

The hook is its own distribution, ``flexmig-hook`` (module :mod:`flexmig_hook`, standard library only), so that a
training environment can install it without the daemon's dependencies. This module re-exports it unchanged (the
very same objects), so jobs and daemon code that ``from flexmig import hook`` keep working where flexmig is
installed; new jobs write ``import flexmig_hook as hook``, which works with either install.
"""

from __future__ import annotations

from flexmig_hook import (
    Ack,
    AckError,
    HandoverError,
    Hook,
    HookEnv,
    atomic_write_bytes,
    atomic_write_json,
    atomic_writer,
    fsync_dir,
    fsync_tree,
    install,
    parse_signal,
    read_ack,
)

__all__ = [
    "Ack",
    "AckError",
    "HandoverError",
    "Hook",
    "HookEnv",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_writer",
    "fsync_dir",
    "fsync_tree",
    "install",
    "parse_signal",
    "read_ack",
]
