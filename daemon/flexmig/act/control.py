"""The local control API: JSON lines over a unix socket that only the daemon's owner (and root) may use.

One request per line, one answer per line::

    -> {"op": "jobs.migrate", "args": {"name": "train", "to": "2g.35gb"}}
    <- {"ok": true, "result": {...}}          or   {"ok": false, "error": "...", "type": "PlanRejectedError"}

The server runs the handlers it is given, by operation name; what the operations are (their names, arguments,
callers and handlers) is declared once, in :data:`flexmig.act.operation_table.OPERATIONS`, whose ``bind`` gives
the handlers (``jobs.*`` from :mod:`flexmig.act.operations`, the daemon's own from its actuator component), so one
socket serves every local client. Requests are size-limited and validated; a malformed one gets an error
answer and changes nothing. The socket file is created with its final permissions before anyone can connect
(bound under a temporary name, chmod-ed, then renamed into place), and each peer's uid is checked with
SO_PEERCRED as well.

:meth:`ControlServer.serve` runs inside the daemon's TaskGroup until cancelled; tests start it standalone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from flexmig.errors import ConfigError, FlexmigError, RequestError

__all__ = ["MAX_CONNECTIONS", "MAX_JSON_DEPTH", "MAX_REQUEST_BYTES", "ControlServer", "Handler", "RequestError"]

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
MAX_CONNECTIONS = 32
"""Control connections served at once; one more gets a ``BusyError`` answer and is closed (each idles at most
``idle_timeout_s``, 300 s)."""
MAX_JSON_DEPTH = 32
"""Objects and arrays nest at most this deep in a request (the request object itself is level 1): no operation
needs more, and a deeper one would only cost recursion in every layer that walks it."""
Handler = Callable[[Mapping[str, Any]], Awaitable[Any]]


class ControlServer:
    """Serves ``handlers`` on the unix socket ``path``."""

    def __init__(
        self,
        path: Path,
        handlers: Mapping[str, Handler],
        *,
        mode: int = 0o600,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        idle_timeout_s: float = 300.0,
        allowed_uids: frozenset[int] | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.path = path
        self.handlers = dict(handlers)
        self.mode = mode
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.allowed_uids = allowed_uids if allowed_uids is not None else frozenset({0, os.geteuid()})
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()

    def add(self, op: str, handler: Handler) -> None:
        """Register one more operation (tests stand in for the daemon's own with it)."""
        self.handlers[op] = handler

    # ------------------------------------------------------------------------------------------ lifecycle
    def _bind(self) -> socket.socket:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            st = self.path.lstat()
            if not stat.S_ISSOCK(st.st_mode):
                raise ConfigError(f"{self.path}: exists and is not a socket; refusing to replace it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(self.path))
            except OSError:
                self.path.unlink()  # stale socket of a daemon that died
            else:
                raise ConfigError(f"{self.path}: another process is serving this control socket")
            finally:
                probe.close()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(tmp))
            tmp.chmod(self.mode)
            tmp.replace(self.path)
            sock.listen(64)
        except OSError as exc:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise ConfigError(f"{self.path}: cannot serve the control socket: {exc.strerror or exc}") from exc
        sock.setblocking(False)
        return sock

    async def start(self) -> None:
        """Bind and start accepting (for tests and standalone use; the daemon uses :meth:`serve`)."""
        sock = self._bind()
        self._server = await asyncio.start_unix_server(self._client, sock=sock, limit=self.max_request_bytes + 1)

    async def close(self) -> None:
        """Stop accepting, end open connections, remove the socket file."""
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until cancelled (a task of the daemon's TaskGroup); ``ready`` is called once listening."""
        await self.start()
        try:
            if ready is not None:
                ready()
            await asyncio.Event().wait()
        finally:
            await self.close()

    # ------------------------------------------------------------------------------------------- clients
    def _peer_ok(self, writer: asyncio.StreamWriter) -> bool:
        sock = writer.get_extra_info("socket")
        if sock is None or not hasattr(socket, "SO_PEERCRED"):
            return True
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return False
        _pid, uid, _gid = struct.unpack("3i", creds)
        group_access = bool(self.mode & 0o060)
        return group_access or uid in self.allowed_uids

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        busy = len(self._conns) >= self.max_connections
        if task is not None and not busy:
            self._conns.add(task)
        try:
            if busy:  # the descriptors are the daemon's: the journal, NVML and the jobs need them more
                error = f"too many connections to the control socket ({self.max_connections}); try again"
                await self._send(writer, {"ok": False, "error": error, "type": "BusyError"})
                return
            if not self._peer_ok(writer):
                await self._send(writer, {"ok": False, "error": "permission denied", "type": "PermissionError"})
                return
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), self.idle_timeout_s)
                except (ValueError, asyncio.LimitOverrunError):
                    await self._send(
                        writer,
                        {
                            "ok": False,
                            "error": f"request longer than {self.max_request_bytes} bytes",
                            "type": "RequestError",
                        },
                    )
                    return
                except TimeoutError:
                    return
                if not line:
                    return
                answer = await self.dispatch(line)
                await self._send(writer, answer)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            # close() ended the connection (the daemon is stopping). Ending quietly: asyncio's stream callback
            # would log a cancelled connection task as an error with a traceback.
            return
        finally:
            if task is not None:
                self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, obj: Mapping[str, Any]) -> None:
        writer.write(json.dumps(obj, default=str).encode() + b"\n")
        await writer.drain()

    async def dispatch(self, line: bytes) -> dict[str, Any]:
        """Decode, validate and run one request line; always returns an answer, never raises."""
        try:
            op, args = self._parse(line)
            handler = self.handlers[op]
            result = await handler(args)
        except FlexmigError as exc:
            return {"ok": False, "error": str(exc), "type": type(exc).__name__}
        except Exception as exc:  # a bug in a handler must not take the socket down
            log.exception("control request failed")
            return {"ok": False, "error": f"internal error: {exc!r}", "type": "InternalError"}
        return {"ok": True, "result": result}

    def _parse(self, line: bytes) -> tuple[str, Mapping[str, Any]]:
        if len(line) > self.max_request_bytes:
            raise RequestError(f"request longer than {self.max_request_bytes} bytes")
        too_deep = RequestError(f"request nests deeper than {MAX_JSON_DEPTH} levels")
        try:
            req = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError(f"request is not JSON: {exc}") from None
        except RecursionError:  # deeper than the interpreter's recursion limit: far past ours
            raise too_deep from None
        if _depth(req) > MAX_JSON_DEPTH:
            raise too_deep
        if not isinstance(req, dict):
            raise RequestError("request must be a JSON object")
        unknown = set(req) - {"op", "args"}
        if unknown:
            raise RequestError(f"unknown request fields: {', '.join(sorted(unknown))}")
        op = req.get("op")
        if not isinstance(op, str) or op not in self.handlers:
            raise RequestError(f"unknown operation {op!r}; known: {', '.join(sorted(self.handlers))}")
        args = req.get("args", {})
        if not isinstance(args, dict):
            raise RequestError("'args' must be a JSON object")
        return op, args


def _depth(doc: Any) -> int:
    """How deep objects and arrays nest in ``doc`` (a scalar is 0); iterative, so any depth is safe to measure."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest
