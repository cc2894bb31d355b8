"""``flexmig.hook``: the checkpoint hook, as the daemon's package names it.

The hook is its own distribution, ``flexmig-hook`` (module :mod:`flexmig_hook`, standard library only), so that a
training environment can install it without the daemon's dependencies. This module re-exports it unchanged (the
very same objects), so jobs and daemon code that ``from flexmig import hook`` keep working where flexmig is
installed; new jobs write ``import flexmig_hook as hook``, which works with either install. The daemon's own
modules import the hook only through this module (``tests/repo/test_layers.py``), so what the daemon takes from
the hook's distribution is listed here, once: the protocol's records, the bounded JSON reader the daemon reads
its own files with too, and the signals a job spec may name.
"""

from __future__ import annotations

import flexmig_hook
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
from flexmig_hook.boundedjson import JsonBoundsError
from flexmig_hook.boundedjson import loads as bounded_loads
from flexmig_hook.protocol import ALLOWED_SIGNALS, FirstStep, first_step_path, read_first_step

#: The hook distribution's package file (``flexmig_hook/__init__.py``; None for a namespace package):
#: ``flexmig sim exec`` puts the directory above it on a job's path, beside flexmig's.
PACKAGE_FILE: str | None = flexmig_hook.__file__

__all__ = [
    "ALLOWED_SIGNALS",
    "PACKAGE_FILE",
    "Ack",
    "AckError",
    "FirstStep",
    "HandoverError",
    "Hook",
    "HookEnv",
    "JsonBoundsError",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_writer",
    "bounded_loads",
    "first_step_path",
    "fsync_dir",
    "fsync_tree",
    "install",
    "parse_signal",
    "read_ack",
    "read_first_step",
]
