"""The local control API: JSON lines over a unix socket that only the daemon's owner (and root) may use.

One request per line, one answer per line::

    -> {"op": "jobs.migrate", "args": {"name": "train", "to": "2g.35gb"}, "deadline_s": 899}
    <- {"begun": true}                        (only to a request with a deadline_s, once it begins)
    <- {"ok": true, "result": {...}}          or   {"ok": false, "error": "...", "type": "PlanRejectedError"}

``deadline_s`` is how long the client waits for the request to begin (:mod:`flexmig.act.deadline`): a request
that could not begin by then (it waited behind the action in flight) is dropped with a ``RequestExpiredError``
answer and nothing done; one that began is carried to its end, and the ``begun`` line tells the client to wait for
it. The daemon caps the deadline at ``max_wait_s`` (``control.max_wait_s``), which is also the deadline of a
request that states none (an older client, an MQTT command).

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
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexmig.act.deadline import Deadline, within
from flexmig.act.peers import CURRENT_PEER, Peer
from flexmig.errors import ConfigError, FlexmigError, RequestError, RequestExpiredError
from flexmig.hook.boundedjson import JsonBoundsError
from flexmig.hook.boundedjson import loads as bounded_loads

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_DEADLINE_S",
    "MAX_JSON_DEPTH",
    "MAX_PER_UID",
    "MAX_REQUEST_BYTES",
    "ControlServer",
    "Handler",
    "RequestError",
]

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
MAX_CONNECTIONS = 32
"""Control connections served at once; one more gets a ``BusyError`` answer and is closed, unless an idle one
(waiting for its next request) of a user other than root and the daemon's can make room: the longest idle of those
is closed for it."""
MAX_PER_UID = 8
"""Connections one user other than root and the daemon's own may hold at once (a group member of a ``0660``
socket); the ninth closes that user's longest idle one, or is refused when none is idle."""
RESERVED_CONNECTIONS = 4
"""Of :data:`MAX_CONNECTIONS`, those only root and the daemon's user may take: the operator's CLI always gets in."""
FIRST_REQUEST_S = 10.0
"""A connection must send its first request within this (the CLI sends it at once); one that does not is closed."""
MAX_JSON_DEPTH = 32
"""Objects and arrays nest at most this deep in a request (the request object itself is level 1): no operation
needs more, and a deeper one would only cost recursion in every layer that walks it."""
MAX_DEADLINE_S = 86400.0
"""The longest ``deadline_s`` a request may state (a day; the daemon's ``max_wait_s`` caps it further)."""
Handler = Callable[[Mapping[str, Any]], Awaitable[Any]]


@dataclass(slots=True)
class _Conn:
    """An open control connection: whose, and since when it waits for its next request (None: one is running)."""

    task: asyncio.Task[None]
    uid: int
    privileged: bool
    idle_since: float | None


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
        max_per_uid: int = MAX_PER_UID,
        first_request_s: float = FIRST_REQUEST_S,
        max_wait_s: float = 900.0,
        on_dropped: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.handlers = dict(handlers)
        self.mode = mode
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.max_per_uid = max_per_uid
        self.first_request_s = first_request_s
        self.max_wait_s = max_wait_s
        """Longest a request may wait to begin (``control.max_wait_s``): the cap of its ``deadline_s``, and the
        deadline of a request that states none."""
        self.on_dropped = on_dropped
        """Told ``(op, why)`` of every request dropped at its deadline (the actuator emits ``request_dropped``)."""
        self.clock = clock
        self.allowed_uids = allowed_uids if allowed_uids is not None else frozenset({0, os.geteuid()})
        self._server: asyncio.AbstractServer | None = None
        self._conns: dict[asyncio.Task[None], _Conn] = {}

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
    def _peer(self, writer: asyncio.StreamWriter) -> Peer | None:
        """The connecting process as the kernel saw it (SO_PEERCRED); None when that cannot be read (refused). A
        socket without SO_PEERCRED (another OS, a test's stand-in) is taken as the daemon's own user."""
        sock = writer.get_extra_info("socket")
        if sock is None or not hasattr(socket, "SO_PEERCRED"):
            return Peer(0, os.geteuid(), os.getegid())
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
        return Peer(*struct.unpack("3i", creds))

    def _allowed(self, peer: Peer) -> bool:
        return bool(self.mode & 0o060) or peer.uid in self.allowed_uids

    def _admit(self, task: asyncio.Task[None], peer: Peer) -> bool:
        """Take the connection on if there is room, closing idle ones of others to make it (see
        :data:`MAX_PER_UID`, :data:`RESERVED_CONNECTIONS`); False when it must be refused as busy."""
        privileged = peer.uid in self.allowed_uids
        if not privileged:
            mine = [c for c in self._conns.values() if c.uid == peer.uid]
            if len(mine) >= self.max_per_uid and not self._evict(mine):
                return False
        limit = self.max_connections if privileged else max(1, self.max_connections - RESERVED_CONNECTIONS)
        while len(self._conns) >= limit:
            if not self._evict([c for c in self._conns.values() if not c.privileged]):  # root's are never cut
                return False
        self._conns[task] = _Conn(task, peer.uid, privileged, self.clock())
        return True

    def _evict(self, among: list[_Conn]) -> bool:
        """Close the longest idle connection of ``among`` (one waiting for its next request); False when none is
        idle (every one is running a request, which is never cut)."""
        idle = [c for c in among if c.idle_since is not None]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.idle_since or 0.0)
        del self._conns[victim.task]
        victim.task.cancel()
        return True

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = self._peer(writer)
        try:
            if peer is None or not self._allowed(peer):
                await self._send(writer, {"ok": False, "error": "permission denied", "type": "PermissionError"})
                return
            if not self._admit(task, peer):  # the descriptors are the daemon's: the journal, NVML, the jobs
                error = f"too many connections to the control socket ({self.max_connections}); try again"
                if peer.uid not in self.allowed_uids:
                    error += f" (at most {self.max_per_uid} a user, {RESERVED_CONNECTIONS} kept for root)"
                await self._send(writer, {"ok": False, "error": error, "type": "BusyError"})
                return
            CURRENT_PEER.set(peer)  # this task's context: the handlers of its requests see who asked
            conn = self._conns[task]
            timeout_s = min(self.first_request_s, self.idle_timeout_s)
            while True:
                conn.idle_since = self.clock()
                try:
                    async with asyncio.timeout(timeout_s):  # wait_for may swallow a cancellation
                        line = await reader.readline()
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
                conn.idle_since = None  # a request in flight is never evicted
                timeout_s = self.idle_timeout_s

                def began() -> None:  # the request is past its deadline's check: its client waits for the end
                    writer.write(b'{"begun": true}\n')

                answer = await self.dispatch(line, began=began)
                await self._send(writer, answer)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            # close() ended the connection (the daemon is stopping), or it was evicted while idle. Ending quietly:
            # asyncio's stream callback would log a cancelled connection task as an error with a traceback.
            return
        finally:
            self._conns.pop(task, None)
            writer.close()
            # A cancelled connection ends here too: a cancellation that meets the close is the end it asked for.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, obj: Mapping[str, Any]) -> None:
        writer.write(json.dumps(obj, default=str).encode() + b"\n")
        await writer.drain()

    async def dispatch(self, line: bytes, *, began: Callable[[], None] | None = None) -> dict[str, Any]:
        """Decode, validate and run one request line under its deadline; always returns an answer, never raises.

        ``began`` is called once the request begins (:mod:`flexmig.act.deadline`), if it stated a ``deadline_s``
        (a client that does understands the ``begun`` line).
        """
        received = self.clock()
        op = "request"
        try:
            op, args, deadline_s = self._parse(line)
            handler = self.handlers[op]
            wait_s = self.max_wait_s if deadline_s is None else min(deadline_s, self.max_wait_s)
            deadline = Deadline(op, wait_s, received, began if deadline_s is not None else None, self.clock)
            result = await self._run(handler, args, deadline)
        except RequestExpiredError as exc:
            log.warning("control request %s", exc)
            if self.on_dropped is not None:
                self.on_dropped(op, str(exc))
            return {"ok": False, "error": str(exc), "type": type(exc).__name__}
        except FlexmigError as exc:
            return {"ok": False, "error": str(exc), "type": type(exc).__name__}
        except Exception as exc:  # a bug in a handler must not take the socket down
            log.exception("control request failed")
            return {"ok": False, "error": f"internal error: {exc!r}", "type": "InternalError"}
        return {"ok": True, "result": result}

    async def _run(self, handler: Handler, args: Mapping[str, Any], deadline: Deadline) -> Any:
        """``handler(args)`` under ``deadline``: cancelled at it unless it has begun by then (RequestExpiredError)."""
        left = deadline.wait_s - (self.clock() - deadline.received)
        try:
            async with asyncio.timeout(max(0.0, left)) as timer:
                deadline.disarm = lambda: timer.reschedule(None)
                with within(deadline):
                    return await handler(args)
        except TimeoutError:
            if timer.expired() and not deadline.begun:
                raise deadline.expired() from None
            raise

    def _parse(self, line: bytes) -> tuple[str, Mapping[str, Any], float | None]:
        if len(line) > self.max_request_bytes:
            raise RequestError(f"request longer than {self.max_request_bytes} bytes")
        try:  # bounded: a 5,000-digit number or 100,000 brackets are an error answer, never a traceback
            req = bounded_loads(line, max_bytes=self.max_request_bytes, max_depth=MAX_JSON_DEPTH, no_duplicates=True)
        except JsonBoundsError as exc:
            what = str(exc)
            if what.startswith("nests deeper"):
                raise RequestError(f"request {what}") from None
            if "appears twice" in what:  # parsers disagree on which one wins, so none does
                raise RequestError(f"request refused: its {what}; name each field once") from None
            raise RequestError(f"request is not JSON: {what}") from None
        if not isinstance(req, dict):
            raise RequestError("request must be a JSON object")
        unknown = set(req) - {"op", "args", "deadline_s"}
        if unknown:
            raise RequestError(f"unknown request fields: {', '.join(sorted(unknown))}")
        deadline_s = req.get("deadline_s")
        if deadline_s is not None and (
            not isinstance(deadline_s, int | float)
            or isinstance(deadline_s, bool)
            or not 0 < deadline_s <= MAX_DEADLINE_S  # NaN fails this too
        ):
            raise RequestError(f"'deadline_s' must be a number of seconds above 0 and at most {MAX_DEADLINE_S:g}")
        op = req.get("op")
        if not isinstance(op, str) or op not in self.handlers:
            raise RequestError(f"unknown operation {op!r}; known: {', '.join(sorted(self.handlers))}")
        args = req.get("args", {})
        if not isinstance(args, dict):
            raise RequestError("'args' must be a JSON object")
        return op, args, None if deadline_s is None else float(deadline_s)
