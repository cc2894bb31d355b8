"""Who sent a control request, and what that caller may make the daemon read.

With ``[control] socket_mode = 0o660`` the members of the socket's group may send requests, and ``jobs.submit``
names a file the daemon then reads as root. A spec file must be root's and writable by nobody else, but that still
fits ``/etc/shadow`` and every other root-owned secret: a member who names one had root read it, and got values of it
back in the answer's error text (``name: 'hunter2' is not a job name``). So a caller other than root (or the daemon's
own user) has a file read for them only when they could have opened it themselves: a child process takes their
credentials (user, group and supplementary groups, from ``SO_PEERCRED`` and the user database) and opens it; if it
cannot, the request is refused naming the path and why, with nothing of the file in the answer.

The caller of the request being served is a context variable, set by the control server for each connection
(asyncio runs a connection's handlers in its task, so each sees its own peer); requests from inside the daemon
(MQTT commands: none of their verbs takes a path) have no peer and are the daemon's own.
"""

from __future__ import annotations

import contextvars
import errno
import os
import pwd
import select
import signal
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CURRENT_PEER", "Peer", "refusal_for"]


@dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a control connection, as the kernel saw it when it connected."""

    pid: int
    uid: int
    gid: int


CURRENT_PEER: contextvars.ContextVar[Peer | None] = contextvars.ContextVar("flexmig_control_peer", default=None)
"""The peer of the control request being served; None for the daemon's own requests."""

_OPEN_AS_TIMEOUT_S = 10.0  # an open of a regular file on a hung NFS mount must not hold the request for ever


def refusal_for(path: Path, peer: Peer | None, what: str) -> str | None:
    """Why ``peer`` may not have the daemon read ``path`` (one line naming the path), or None when it may: the
    daemon's own requests, root's and the daemon's user's always may; anyone else only when a process with their
    credentials can open it for reading. Blocks (it forks): called off the event loop."""
    if peer is None or peer.uid in (0, os.geteuid()):
        return None
    try:
        name = pwd.getpwuid(peer.uid).pw_name
        groups = os.getgrouplist(name, peer.gid)
    except (KeyError, OSError):
        groups = [peer.gid]
    code = _open_as(path, peer.uid, peer.gid, groups)
    if code == 0:
        return None
    why = "not a regular file" if code == errno.EISDIR else (os.strerror(code) if code > 0 else "cannot be checked")
    return (
        f"{path}: refused: uid {peer.uid} cannot read this {what} itself ({why}); the daemon reads a {what} only "
        "where its sender could"
    )


def _open_as(path: Path, uid: int, gid: int, groups: list[int]) -> int:
    """0 when a process of ``uid``/``gid``/``groups`` can open ``path`` (a regular file) for reading, else an errno
    (``EISDIR`` for anything but a regular file; -1 when the check itself failed). Forks a child that drops to
    those credentials: the daemon itself never changes its own."""
    pid = os.fork()
    if pid == 0:  # the child: syscalls only, then _exit (never back into the daemon's code)
        code = 255
        try:
            os.setgroups(groups)
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):  # a FIFO or a device is never opened, as the caller or otherwise
                code = errno.EISDIR
            else:
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC))
                code = 0
        except OSError as exc:
            code = exc.errno if exc.errno and exc.errno < 255 else 254
        finally:
            os._exit(code)
    return _wait_code(pid)


def _wait_code(pid: int) -> int:
    """The exit status of child ``pid`` (the errno it found), waited for at most :data:`_OPEN_AS_TIMEOUT_S`."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    try:
        if pidfd >= 0 and not select.select([pidfd], [], [], _OPEN_AS_TIMEOUT_S)[0]:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    code = os.waitstatus_to_exitcode(status)
    if code in (254, 255) or code < 0:
        return -1
    return code
