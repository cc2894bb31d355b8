"""A blocking client for the control socket (what ``flexmig jobs`` uses)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from flexmig.errors import ControlError, ControlRequestError

__all__ = ["ControlClient", "ControlError", "ControlRequestError"]

_MAX_ANSWER_BYTES = 16 * 1024 * 1024
_BAD_INPUT = frozenset({"JobSpecError", "RequestError", "ConfigError", "ValueError"})


class ControlClient:
    """Sends one request per call over the unix socket ``path`` and returns the answer's result."""

    def __init__(self, path: Path, timeout_s: float = 900.0) -> None:
        self.path = path
        self.timeout_s = timeout_s

    def call(self, op: str, **args: Any) -> Any:
        """Run ``op`` with ``args`` on the daemon; ControlError carries the daemon's error message."""
        request = json.dumps({"op": op, "args": args}).encode() + b"\n"
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
                data = _read_line(sock)
            except TimeoutError:
                raise ControlError(f"no answer from the daemon within {self.timeout_s:g} s") from None
            except OSError as exc:
                raise ControlError(f"control socket {self.path}: {exc.strerror or exc}") from None
        try:
            answer = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ControlError(f"the daemon sent a malformed answer: {exc}") from None
        if not isinstance(answer, dict):
            raise ControlError("the daemon sent a malformed answer")
        if answer.get("ok"):
            return answer.get("result")
        msg = str(answer.get("error", "request failed"))
        if answer.get("type") in _BAD_INPUT:
            raise ControlRequestError(msg)
        raise ControlError(msg)


def _read_line(sock: socket.socket) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > _MAX_ANSWER_BYTES:
            raise ControlError("answer from the daemon too large")
    if not buf:
        raise ControlError("the daemon closed the connection without answering")
    return bytes(buf)
