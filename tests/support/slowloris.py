"""A slowloris client, run as its own process (not a test module): it holds many half-open HTTP connections.

``python tests/support/slowloris.py --port P --connections N --seconds S --stats FILE`` opens N connections to
127.0.0.1:P, sends each a request line and one header but never the blank line that ends a request head, then
every ``--every`` seconds sends each one more header line, reopening every connection the server closed. It raises
its own file-descriptor limit to the hard limit to hold that many. At the end it writes one JSON object to FILE:

``held_min``/``held_max`` (connections open on its side at each cycle's end), ``cycles``, ``reopened`` (connections
the server had closed and it opened again), ``connect_failures`` (connects refused or timed out).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import resource
import select
import socket
import time
from pathlib import Path

HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n"


def _connect(port: int, timeout_s: float) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(HEAD)
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s


def _closed_by_server(socks: list[socket.socket | None]) -> set[int]:
    """Indexes of the connections the server closed, reset or answered (an error page ends the request too)."""
    poller = select.poll()  # select() cannot watch descriptors above 1023
    for s in socks:
        if s is not None:
            poller.register(s, select.POLLIN | select.POLLPRI)
    by_fd = {s.fileno(): i for i, s in enumerate(socks) if s is not None}
    return {by_fd[fd] for fd, _ in poller.poll(0)}


def _trickle(s: socket.socket) -> bool:
    """Send one more header line; False when the connection is gone."""
    try:
        s.send(b"X-Keep: a\r\n")
    except OSError as exc:
        return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
    return True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--stats", type=Path, required=True)
    args = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks: list[socket.socket | None] = [None] * args.connections
    held: list[int] = []
    reopened = failures = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        cycle_end = time.monotonic() + args.every
        closed = _closed_by_server(socks)
        for i in range(len(socks)):
            conn = socks[i]
            if conn is not None and (i in closed or not _trickle(conn)):
                with contextlib.suppress(OSError):
                    conn.close()
                socks[i] = conn = None
                reopened += 1
            if conn is None:
                socks[i] = _connect(args.port, 0.5)
                failures += socks[i] is None
        held.append(sum(s is not None for s in socks))
        time.sleep(max(0.0, cycle_end - time.monotonic()))
    for s in socks:
        if s is not None:
            s.close()
    stats = {
        "held_min": min(held),
        "held_max": max(held),
        "cycles": len(held),
        "reopened": reopened,
        "connect_failures": failures,
    }
    args.stats.write_text(json.dumps(stats))


if __name__ == "__main__":
    main()
