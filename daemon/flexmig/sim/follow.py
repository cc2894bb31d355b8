"""Another process's view of a simulated node: the node a daemon keeps in its state file, read and followed.

A daemon on a simulated node (``flexmigd --sim SPEC --sim-state FILE``, ``flexmig demo``) writes the node's state
to its file after every change (:mod:`flexmig.sim.persist`: GPU and compute instances, processes with their memory,
each MIG device's activity). :func:`follow` installs under pynvml, in this process, a library that answers from that
file, so any NVML program here (nvitop, gpustat, a script, ``flexmig sim nvidia-smi``) sees the daemon's node: the
same GPUs, UUIDs, instances and processes, and its changes as they happen.

* **Live.** Before each NVML call (at most every :data:`RECHECK_S`) the file is looked at again; when the daemon
  replaced it, the node is rebuilt from it. Handles stay valid across a rebuild (they name instances by their
  lifetime serials, which the file keeps), and GPM counters carry over, so a metric spanning a rebuild is right.
* **Safe to read while the daemon writes.** The daemon writes a temporary file and renames it over the old one,
  so a reader opens either the old file or the new one, whole. The file is opened without following a symlink, must
  be a regular file of at most :data:`MAX_STATE_BYTES`, and a file that cannot be read or parsed keeps the last
  good node (the error is kept in :attr:`FollowedNode.problem`), so a reader never crashes on it.
* **Read-only.** The node belongs to the daemon that keeps the file. Calls that would change it (MIG mode,
  creating or destroying GPU and compute instances) answer ``NO_PERMISSION``, as a real driver answers a user who
  may not change the GPUs; nothing here ever writes the file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import SimError
from flexmig.sim.entrypoints import MUTATING_PREFIXES
from flexmig.sim.faults import FaultTable
from flexmig.sim.library import SimLibrary
from flexmig.sim.persist import state_from_dict
from flexmig.sim.state import SimNodeState

__all__ = ["MAX_STATE_BYTES", "RECHECK_S", "FollowedNode", "follow", "read_state_file"]

#: The largest state file a follower reads (a 64-GPU node with every MIG device busy is well below it).
MAX_STATE_BYTES = 8 << 20
#: How often, at most, a follower looks at the file again.
RECHECK_S = 0.1
# A file modified this recently may have changed again within the same time stamp: compare its content.
_SAME_TICK_S = 1.0


def _read_bytes(path: Path) -> tuple[bytes, tuple[int, int, int]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        why = "it is a symlink" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise SimError(f"cannot read simulator state file {path}: {why}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SimError(f"simulator state file {path} is not a regular file")
        if st.st_size > MAX_STATE_BYTES:
            raise SimError(f"simulator state file {path} holds {st.st_size} bytes (at most {MAX_STATE_BYTES})")
        return f.read(MAX_STATE_BYTES + 1), (st.st_dev, st.st_ino, st.st_mtime_ns)


def _parse(data: bytes, path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SimError(f"simulator state file {path} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SimError(f"simulator state file {path} must hold a JSON object (the simulated node)")
    return raw


def read_state_file(path: Path) -> tuple[dict[str, Any], tuple[int, int, int]]:
    """The state file's JSON and its identity (device, inode, modification time); SimError naming the file if it
    is a symlink, not a regular file, too large, or not JSON."""
    data, identity = _read_bytes(path)
    return _parse(data, path), identity


@dataclass(slots=True)
class FollowedNode:
    """What a follower knows of the node it follows: the file, and why its last look failed (None: it did not)."""

    path: Path
    problem: str | None = None


class FollowingLibrary(SimLibrary):
    """A :class:`SimLibrary` over a node rebuilt from a daemon's state file whenever the daemon replaces it."""

    def __init__(
        self,
        state: SimNodeState,
        data: bytes,
        identity: tuple[int, int, int],
        followed: FollowedNode,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(state, FaultTable())
        self.followed = followed
        self._data = data
        self._identity = identity
        self._now = clock
        self._checked = clock()
        self._reload_lock = threading.Lock()

    def _intercept(self, name: str, args: tuple[Any, ...]) -> int | None:
        if name.startswith(MUTATING_PREFIXES):  # the node is the daemon's
            return int(N.NVML_ERROR_NO_PERMISSION)
        self.refresh()
        return super()._intercept(name, args)

    def refresh(self, *, force: bool = False) -> bool:
        """Rebuild the node if the daemon replaced its file since the last look; True if it did.

        A replaced file usually has another inode or modification time; but file systems keep times in coarse ticks
        and reuse inodes, so a file changed within the last :data:`_SAME_TICK_S` is compared by content too.
        """
        now = self._now()
        if not force and now - self._checked < RECHECK_S:
            return False
        self._checked = now
        path = self.followed.path
        try:
            st = path.lstat()
        except OSError as exc:
            self.followed.problem = f"cannot read simulator state file {path}: {exc.strerror or exc}"
            return False
        same = (st.st_dev, st.st_ino, st.st_mtime_ns) == self._identity
        if same and not force and time.time() - st.st_mtime > _SAME_TICK_S:
            return False
        with self._reload_lock:
            try:
                data, identity = _read_bytes(path)
                if data == self._data:  # unchanged, or back to the node shown
                    self._identity = identity
                    self.followed.problem = None
                    return False
                fresh = state_from_dict(_parse(data, path), path, self._state.clock)
            except SimError as exc:
                self.followed.problem = str(exc)
                return False
            if not self._adopt(fresh):
                return False
            self._identity, self._data = identity, data
            self.followed.problem = None
        return True

    def _adopt(self, fresh: SimNodeState) -> bool:
        """Put ``fresh`` in place of the current node, keeping what is this process's own: the lock, the init count,
        and the GPM counters of GPUs and GPU instances that still exist (so a metric spanning the rebuild holds)."""
        old = self._state
        if fresh.model is not old.model or len(fresh.gpus) != len(old.gpus):
            self.followed.problem = (
                f"simulator state file {self.followed.path} now holds another node ({fresh.model.key}x"
                f"{len(fresh.gpus)}); still showing the {old.model.key}x{len(old.gpus)} node it held"
            )
            return False
        now = fresh.clock()
        for before, after in zip(old.gpus, fresh.gpus, strict=True):
            before.counters.advance(now)
            after.counters = before.counters
            for gi in after.gis.values():
                kept = old.gis_by_serial.get(gi.serial)
                if kept is not None:
                    kept.counters.advance(now)
                    gi.counters = kept.counters
            fresh.refresh_rates(after)
        fresh.lock = old.lock
        fresh.init_count = old.init_count
        fresh.privileged = old.privileged
        self._state = fresh
        self._synced = -1
        return True


def follow(
    path: Path,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> FollowedNode:
    """Install under pynvml a read-only, live view of the simulated node a daemon keeps in the state file ``path``
    (replacing any simulator installed here); SimError naming the file when it cannot be read now."""
    data, identity = _read_bytes(path)
    state = state_from_dict(_parse(data, path), path, clock)
    followed = FollowedNode(path)
    library = FollowingLibrary(state, data, identity, followed, clock)
    with N.libLoadLock:
        previous = N.nvmlLib
        library.previous = previous.previous if isinstance(previous, SimLibrary) else previous
        N.nvmlLib = library
        N._nvmlGetFunctionPointer_cache.clear()
        N._nvmlLib_refcount = 0
    return followed
