"""The metrics HTTP server: ``/metrics`` for Prometheus, bounded so that no client can take the daemon down.

prometheus_client's own server starts a thread per connection and waits forever for a request's head: a thousand
half-open connections (slowloris) exhaust the daemon's file descriptors and grow its memory by a thread stack
each. This server runs one asyncio event loop on a thread of its own (the daemon's loop never sees a metrics
connection) and holds these limits:

* **connections**: at most ``max_connections`` open at once (64, and never more than the descriptors left after
  a reserve of 256 for the journal, the outbox, the control socket, NVML and the jobs' launches, counted from
  ``RLIMIT_NOFILE`` at start). A connection beyond the cap evicts the oldest one that has sent part of a request
  head and is still sending it (that is what a slowloris holds; a scraper sends its head at once), or, when there
  is none, the oldest one that has sent nothing yet. A connection just accepted, whose client has not had its
  turn to send, is thus not pushed out by a flood of reconnecting slow clients. When every open connection is past
  its head, the new one is closed unanswered. Both are counted (:class:`ServerStats`);
* **time**: the request head must be complete within ``header_timeout_s`` (10 s) of the connection, however
  slowly it trickles in; the answer must be taken within ``write_timeout_s`` (30 s); then the connection is cut;
* **size**: a request head over 8 KiB gets ``431``, a malformed one ``400``; one request per connection
  (``Connection: close``), so no connection idles.

What is answered is a WSGI application: flexmigd's :class:`~flexmig.metrics.scrape.Exposition` (rendered once per
snapshot, shared by every scraper), or, for a plain registry, prometheus_client's own
(:func:`prometheus_client.make_wsgi_app`); the content negotiation (text or OpenMetrics), gzip, ``name[]`` filters
and the status codes are the library's in both. A scrape runs on this server's thread: it reads the published
snapshot only (never NVML).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from flexmig.errors import FlexmigError

__all__ = [
    "FD_RESERVE",
    "MAX_CONNECTIONS",
    "MAX_HEAD_BYTES",
    "MetricsServer",
    "ServerStats",
    "WsgiApp",
    "connection_cap",
]

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
FD_RESERVE = 256
"""Descriptors the metrics server leaves to the rest of the daemon, beyond those open when it starts."""
MAX_HEAD_BYTES = 8 * 1024
_BACKLOG = 4096
"""The kernel's queue of connections not yet accepted: they cost the daemon no descriptor, so it may be long (the
kernel caps it at ``net.core.somaxconn``), and a flood that fills it does not make a scraper's connect wait for a
SYN retransmission."""
_ACCEPT_BATCH = 16
_MARGIN = 64  # connections evicted or timed out whose descriptors are not closed yet
_ACCEPT_PAUSE_S = 0.5
_START_S = 10.0


def connection_cap(wanted: int = MAX_CONNECTIONS, reserve: int = FD_RESERVE) -> int:
    """How many connections the server may hold: ``wanted``, or fewer when the descriptor limit is low.

    What is left of ``RLIMIT_NOFILE`` (soft) after the descriptors open now and ``reserve``, less a margin for
    connections being cut, and at least 4.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        open_now = sum(1 for _ in Path("/proc/self/fd").iterdir())
    except OSError:
        open_now = 64
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(4, min(wanted, soft - open_now - reserve - _MARGIN))


@dataclass
class ServerStats:
    """What the server did since start (read by the daemon's metrics; written on the server's thread)."""

    limit: int = 0
    open: int = 0
    served: int = 0
    evicted: int = 0
    """Connections closed unanswered to make room: they were still sending their request head at the cap."""
    refused: int = 0
    """Connections closed unanswered at the cap because every open one was past its head."""
    timed_out: int = 0
    """Connections cut because their head or the reading of the answer took too long."""
    accept_errors: int = 0
    """accept() failures (no descriptor or memory left), each followed by a pause of accepting."""


class _Connection(asyncio.Protocol):
    """One client: read the head (bounded in size and time), answer once, close."""

    def __init__(self, server: _Serving) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.in_head = True
        self.timer: asyncio.TimerHandle | None = None
        self.since = time.monotonic()
        self.killed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.killed:  # evicted while its transport was being made
            transport.abort()
            return
        self.timer = self.server.loop.call_later(
            max(0.0, self.since + self.server.header_timeout_s - time.monotonic()), self.expire
        )

    def data_received(self, data: bytes) -> None:
        if not self.in_head:
            return  # one request per connection: anything after the head is ignored
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            self.server.partial_head(self)
            if len(self.buffer) > MAX_HEAD_BYTES:
                self.answer("431 Request Header Fields Too Large", [], b"request head too large\n")
            return
        if end > MAX_HEAD_BYTES:
            self.answer("431 Request Header Fields Too Large", [], b"request head too large\n")
            return
        self.respond(bytes(self.buffer[:end]))

    def respond(self, head: bytes) -> None:
        """Parse the head and answer with prometheus_client's WSGI application."""
        try:
            environ = _environ(head)
        except ValueError as exc:
            self.answer("400 Bad Request", [], f"bad request: {exc}\n".encode())
            return
        status: list[str] = []
        headers: list[tuple[str, str]] = []

        def start_response(s: str, h: list[tuple[str, str]], _exc_info: Any = None) -> Callable[[bytes], None]:
            status.append(s)
            headers.extend(h)
            return lambda _data: None

        try:
            body = b"".join(self.server.app(environ, start_response))
        except Exception:  # a collector bug: the scraper gets a 500 and the log a traceback, the server goes on
            log.exception("metrics: a scrape failed")
            self.answer("500 Internal Server Error", [], b"scrape failed; see the daemon's log\n")
            return
        self.server.stats.served += 1
        if environ["REQUEST_METHOD"] == "HEAD":
            body = b""
        self.answer(status[0] if status else "200 OK", headers, body)

    def answer(self, status: str, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        """Send one response and close (the write is bounded by ``write_timeout_s``)."""
        transport = self.transport
        if transport is None or not self.in_head:
            return
        self.in_head = False
        self.server.past_head(self)
        if self.timer is not None:
            self.timer.cancel()
        lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        transport.write("\r\n".join(lines).encode("latin-1") + body)
        transport.close()  # after the buffer is flushed
        self.timer = self.server.loop.call_later(self.server.write_timeout_s, self.expire)

    def expire(self) -> None:
        """The head did not come within ``header_timeout_s``, or the answer was not taken in ``write_timeout_s``."""
        self.server.stats.timed_out += 1
        self.kill()

    def kill(self) -> None:
        """Cut the connection now (eviction, time-out, server stop)."""
        self.killed = True
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.server.forget(self)
        self.transport = None


def _environ(head: bytes) -> dict[str, Any]:
    """The WSGI environ of a request head; ValueError when it is not HTTP/1.x."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # latin-1 decodes anything; kept for the type checker's sake
        raise ValueError("undecodable head") from exc
    request_line, *header_lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise ValueError(f"not an HTTP/1.x request line: {request_line[:80]!r}")
    method, target, protocol = parts
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method.upper(),
        "PATH_INFO": unquote(path),
        "QUERY_STRING": query,
        "SERVER_PROTOCOL": protocol,
        "SERVER_NAME": "flexmigd",
        "SERVER_PORT": "0",
        "SCRIPT_NAME": "",
        "wsgi.url_scheme": "http",
    }
    if len(header_lines) > 100:
        raise ValueError("more than 100 header lines")
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError(f"malformed header line {line[:80]!r}")
        key = name.strip().upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            environ[key] = value.strip()
        else:
            environ[f"HTTP_{key}"] = value.strip()
    return environ


class _Serving:
    """The state of one running server, on its own event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        app: Any,
        stats: ServerStats,
        *,
        limit: int,
        header_timeout_s: float,
        write_timeout_s: float,
    ) -> None:
        self.loop = loop
        self.app = app
        self.stats = stats
        self.limit = limit
        self.header_timeout_s = header_timeout_s
        self.write_timeout_s = write_timeout_s
        self.stopping = False
        self.starting: set[asyncio.Task[Any]] = set()
        self.open: dict[_Connection, None] = {}  # oldest first
        self.in_head: dict[_Connection, None] = {}  # the open ones still sending their head, oldest first
        self.partial: dict[_Connection, None] = {}  # those of them that have sent part of it, oldest first

    def on_readable(self, listener: socket.socket) -> None:
        """Accept what the kernel queued, a few at a time: each one is admitted (or closed) before the next is
        taken, so the server never holds more than its cap plus one, and between two batches the loop reads the
        heads that arrived (a scraper's is complete at once, before a flood can push it out)."""
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors or memory despite the reserve: wait, do not spin
                self.stats.accept_errors += 1
                if self.stats.accept_errors == 1 or self.stats.accept_errors % 1000 == 0:
                    log.error("metrics: cannot accept a connection (%s); %d such errors", exc, self.stats.accept_errors)
                self.loop.remove_reader(listener.fileno())
                self.loop.call_later(_ACCEPT_PAUSE_S, self.loop.add_reader, listener.fileno(), self.on_readable,
                                     listener)  # fmt: skip
                return
            conn = _Connection(self)
            if not self.admit(conn):
                sock.close()
                continue
            sock.setblocking(False)
            task = self.loop.create_task(self.loop.connect_accepted_socket(lambda c=conn: c, sock=sock))  # type: ignore[misc]
            self.starting.add(task)
            task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[Any]) -> None:
        self.starting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("metrics: a connection failed before it started: %s", task.exception())

    def admit(self, conn: _Connection) -> bool:
        """Take ``conn`` in, evicting the oldest connection still in its head at the cap; False: refuse it."""
        if self.stopping:
            return False
        if len(self.open) >= self.limit:
            victim = next(iter(self.partial), None) or next(iter(self.in_head), None)
            if victim is None:
                self.stats.refused += 1
                return False
            self.stats.evicted += 1
            self.forget(victim)
            victim.kill()
        self.open[conn] = None
        self.in_head[conn] = None
        self.stats.open = len(self.open)
        return True

    def partial_head(self, conn: _Connection) -> None:
        """``conn`` has sent part of its head and not the end of it: it is evicted before silent ones."""
        if conn in self.in_head and conn not in self.partial:
            self.partial[conn] = None

    def past_head(self, conn: _Connection) -> None:
        self.in_head.pop(conn, None)
        self.partial.pop(conn, None)

    def forget(self, conn: _Connection) -> None:
        """``conn`` is closed (or about to be): it no longer counts."""
        self.open.pop(conn, None)
        self.in_head.pop(conn, None)
        self.partial.pop(conn, None)
        self.stats.open = len(self.open)

    def close_all(self) -> None:
        for conn in list(self.open):
            conn.kill()


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
"""A WSGI application: what the server answers a request with."""


class MetricsServer:
    """Serves ``app`` (a WSGI application, or a registry prometheus_client's application answers for) on
    ``host:port`` from a thread of its own, within the limits of the module doc."""

    def __init__(
        self,
        app: CollectorRegistry | WsgiApp,
        host: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        header_timeout_s: float = 10.0,
        write_timeout_s: float = 30.0,
    ) -> None:
        self._app: WsgiApp = make_wsgi_app(app) if isinstance(app, CollectorRegistry) else app
        self._host = host
        self._port = port
        self._wanted = max_connections
        self._header_timeout_s = header_timeout_s
        self._write_timeout_s = write_timeout_s
        self.stats = ServerStats()
        self._sock: socket.socket | None = None
        self._bound: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None

    def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound (host, port), which tells a caller that asked for port 0."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            sock = socket.create_server((self._host, self._port), family=family, backlog=_BACKLOG)
        except OSError as exc:
            hint = ""
            if exc.errno == errno.EADDRINUSE:
                # dcgm-exporter's default port is 9400 too, so on a GPU node this is the usual collision.
                hint = (
                    " (another program listens there; dcgm-exporter also defaults to port 9400): "
                    "choose another address with --metrics-addr HOST:PORT or [prometheus] listen"
                )
            raise FlexmigError(
                f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror or exc}{hint}"
            ) from exc
        sock.setblocking(False)
        self._sock, self._bound = sock, int(sock.getsockname()[1])
        self.stats.limit = connection_cap(self._wanted)
        ready = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(sock, ready, failed), name="metrics-http", daemon=True)
        self._thread.start()
        if not ready.wait(_START_S) or failed:
            self.stop()
            why = failed[0] if failed else f"not serving within {_START_S:g} s"
            raise FlexmigError(f"cannot serve metrics on {self._host}:{self._port}: {why}")
        return self._host, self._bound

    @property
    def port(self) -> int | None:
        """The bound port, once started."""
        return self._bound

    def _run(self, sock: socket.socket, ready: threading.Event, failed: list[BaseException]) -> None:
        try:
            asyncio.run(self._serve(sock, ready))
        except BaseException as exc:
            failed.append(exc)
            log.exception("metrics server stopped by an error")
            ready.set()

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        state = _Serving(
            loop,
            self._app,
            self.stats,
            limit=self.stats.limit,
            header_timeout_s=self._header_timeout_s,
            write_timeout_s=self._write_timeout_s,
        )
        loop.add_reader(sock.fileno(), state.on_readable, sock)
        self._loop, self._stopped = loop, asyncio.Event()
        ready.set()
        try:
            await self._stopped.wait()
        finally:
            state.stopping = True
            loop.remove_reader(sock.fileno())
            await asyncio.sleep(0.02)  # connections accepted just before get their transports, to be cut below
            state.close_all()
            for task in list(state.starting):
                task.cancel()
            sock.close()

    def stop(self) -> None:
        """Stop serving, cut open connections, close the socket; safe to call twice."""
        loop, stopped, thread = self._loop, self._stopped, self._thread
        self._loop = self._stopped = self._thread = None
        if loop is not None and stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopped.set)
        if thread is not None:
            thread.join(timeout=5)
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
