"""A control request past the JSON bounds is an error answer naming the bound, never an "internal error" with a
traceback in the daemon's log (a 5,000-digit number raised ValueError out of the decoder)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from flexmig.act.control import ControlServer


async def _answer_of(line: bytes) -> dict[str, object]:
    async def echo(args: object) -> object:
        return args

    server = ControlServer(Path("/nonexistent/control.sock"), {"echo": echo})
    return await server.dispatch(line)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"op": "echo", "args": {"n": ' + b"9" * 5000 + b"}}", "more than 20 digits"),
        (b'{"op": "echo", "args": {"n": ' + b"[" * 20_000 + b"]" * 20_000 + b"}}", "nests deeper than 32"),
        (b'{"op": "echo", "args": {"n": NaN}}', "NaN"),
        (b'{"op": "echo", "args": {"n": 1e999}}', "out of range"),
    ],
)
def test_a_request_past_the_bounds_is_an_error_answer_and_no_traceback(
    line: bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        answer = asyncio.run(_answer_of(line))
    assert answer["ok"] is False and answer["type"] == "RequestError", answer
    assert why in str(answer["error"]), answer
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
