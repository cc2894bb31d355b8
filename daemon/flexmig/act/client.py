"""A blocking client for the control socket (what ``flexmig jobs`` uses).

Its timeout and the daemon's deadline agree (:mod:`flexmig.act.deadline`): each request states how long the client
waits for it to begin (``deadline_s``: the timeout less a margin for the answer to travel back, at most 1 s), so a
request the daemon could not begin in time is dropped there and the client hears why. Once the daemon says the
request has begun, the client waits for its end, however long the action takes (it runs to its end either way).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from flexmig.errors import ControlError, ControlRequestError

__all__ = ["ControlClient", "ControlError", "ControlRequestError"]

_MAX_ANSWER_BYTES = 16 * 1024 * 1024
_BAD_INPUT = frozenset({"JobSpecError", "RequestError", "ConfigError", "ValueError"})
_AFTER_BEGUN_S = 86400.0  # begun, an action ends by its own timeouts (checkpoint, exit); this only bounds a hang


class ControlClient:
    """Sends one request per call over the unix socket ``path`` and returns the answer's result."""

    def __init__(self, path: Path, timeout_s: float = 900.0) -> None:
        self.path = path
        self.timeout_s = timeout_s

    @property
    def deadline_s(self) -> float:
        """What a request states as its deadline: the timeout less the margin for the answer to come back."""
        return max(0.001, self.timeout_s - min(1.0, self.timeout_s / 4))

    def call(self, op: str, **args: Any) -> Any:
        """Run ``op`` with ``args`` on the daemon; ControlError carries the daemon's error message."""
        request = json.dumps({"op": op, "args": args, "deadline_s": self.deadline_s}).encode() + b"\n"
        begun = False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(str(self.path))
            except OSError as exc:
                raise ControlError(
                    f"cannot reach the flexmig daemon at {self.path}: {exc.strerror or exc} "
                    "(is flexmigd running, and are you root or its user?)"
                ) from None
            try:
                sock.sendall(request)
                reader = _Lines(sock)
                while True:
                    answer = _decode(reader.line())
                    if answer.get("begun") is True and "ok" not in answer and not begun:
                        begun = True  # it runs to its end now: wait for that
                        sock.settimeout(max(self.timeout_s, _AFTER_BEGUN_S))
                        continue
                    break
            except TimeoutError:
                if begun:
                    raise ControlError(
                        f"the daemon began {op} but sent no result within {_AFTER_BEGUN_S:g} s; see flexmig jobs list"
                    ) from None
                raise ControlError(
                    f"no answer from the daemon within {self.timeout_s:g} s: {op} had not begun, and the daemon "
                    "drops a request it could not begin by its deadline (nothing was done)"
                ) from None
            except OSError as exc:
                raise ControlError(f"control socket {self.path}: {exc.strerror or exc}") from None
        if answer.get("ok"):
            return answer.get("result")
        msg = str(answer.get("error", "request failed"))
        if answer.get("type") in _BAD_INPUT:
            raise ControlRequestError(msg)
        raise ControlError(msg)


class _Lines:
    """The answer lines of one connection (a ``begun`` line may come before the answer, in the same read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def line(self) -> bytes:
        """The next line (ControlError when the daemon closed the connection first, or sent too much)."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                if self.buf:
                    break
                raise ControlError("the daemon closed the connection without answering")
            self.buf += chunk
            if len(self.buf) > _MAX_ANSWER_BYTES:
                raise ControlError("answer from the daemon too large")
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return line


def _decode(data: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ControlError(f"the daemon sent a malformed answer: {exc}") from None
    if not isinstance(answer, dict):
        raise ControlError("the daemon sent a malformed answer")
    return answer
