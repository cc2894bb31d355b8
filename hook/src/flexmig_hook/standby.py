"""A standby rank's side of the handover: say "ready", then wait for the new world.

A job that opts in (``standby = true`` in its spec's ``[hook]`` table) gets its next generation started on the
move's target instances before the current one is asked to checkpoint. Such a rank runs the script's start-up
(imports, model, optimizer, data) and then reaches :func:`flexmig_hook.install`, which calls
:func:`wait_for_handover`: it writes :data:`~flexmig_hook.protocol.READY_LINE` on the channel the daemon gave it
(``FLEXMIG_STANDBY_FD``, one end of a Unix socket pair) and blocks until the daemon writes the handover, one JSON
line with the new world (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``...) and the acknowledged
checkpoint (``FLEXMIG_RESUME``). The channel is private to the daemon and this process: no file, no port, nothing
another user can reach. When the daemon closes it instead (the move was cancelled, or the daemon went away and
a restarted one relaunches the rank afresh), the rank has nothing to do and ends.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import NoReturn

from flexmig_hook.protocol import HANDOVER_MAX_BYTES, READY_LINE, HandoverError, decode_handover

__all__ = ["STANDBY_ABANDONED_STATUS", "abandon", "wait_for_handover"]

#: The exit status of a standby rank whose channel closed before a handover: it did nothing and holds nothing.
STANDBY_ABANDONED_STATUS = 0


def wait_for_handover(fd: int) -> dict[str, str] | None:
    """Announce readiness on channel ``fd`` and block until the handover; its variables, or None when the daemon
    closed the channel first. HandoverError when the daemon wrote something that is not a handover."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise HandoverError(f"FLEXMIG_STANDBY_FD={fd} is not a socket: {exc.strerror}") from None
    with sock:
        sock.setblocking(True)
        try:
            sock.sendall(READY_LINE)
        except OSError:  # the daemon's end is gone
            return None
        buf = bytearray()
        while b"\n" not in buf:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
            if len(buf) > HANDOVER_MAX_BYTES + 1:
                raise HandoverError(f"handover larger than {HANDOVER_MAX_BYTES} bytes")
        line = bytes(buf).split(b"\n", 1)[0]
        return decode_handover(line)


def abandon() -> NoReturn:
    """End a standby rank whose move will not happen: one line on stderr, then exit without the interpreter's
    teardown (nothing was trained, nothing needs saving)."""
    with contextlib.suppress(Exception):
        sys.stderr.write("flexmig standby: the daemon closed the channel before a handover; nothing to do\n")
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(STANDBY_ABANDONED_STATUS)
