"""Reaping what a child subreaper adopts, and only that.

tests/conftest.py makes the pytest process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a process whose
parent exits (a rank whose actuator a test killed, a daemon that double-forked) becomes its child. The kernel
keeps such a child as a zombie once it exits until its new parent waits for it, and nothing in the test run knows
of it: :func:`reap_adopted_orphans` waits for those. Children that an object of this process started and will wait
for itself (a ``subprocess.Popen``, which asyncio keeps one of per process too, or a multiprocessing process) are
left alone: reaping one would take its exit status from its owner (``Popen.wait`` then reports 0).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing.popen_fork
import os
import subprocess

import psutil

__all__ = ["reap_adopted_orphans", "waited_for"]


def _subclasses(cls: type) -> list[type]:
    subs: list[type] = cls.__subclasses__()
    return [cls, *(s for sub in subs for s in _subclasses(sub))]


def waited_for() -> set[int]:
    """Pids of children that an object of this process started and has not reaped yet."""
    kinds = (*_subclasses(subprocess.Popen), *_subclasses(multiprocessing.popen_fork.Popen))
    pids = set()
    for obj in gc.get_referrers(*kinds):  # an instance refers to its class
        pid = getattr(obj, "pid", None)
        if isinstance(obj, kinds) and getattr(obj, "returncode", 0) is None and isinstance(pid, int):
            pids.add(pid)
    return pids


def reap_adopted_orphans() -> list[int]:
    """Reap the zombie children that no object of this process will wait for; returns their pids. Cheap while there
    are none: the owners are looked up only when a zombie is there."""
    try:
        zombies = [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []
    if not zombies:
        return []
    owned = waited_for()
    reaped = []
    for pid in zombies:
        if pid not in owned:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
    return reaped
