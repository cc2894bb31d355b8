"""A control request whose client gave up is dropped before it acts (issue 19, point 5).

On a live actuator (simulated H200, real jobs, the real control socket): a move waits 20 s for an acknowledgement
that never comes (job ``stubborn`` never checkpoints), and meanwhile ``flexmig jobs --timeout 2 migrate counter``
asks for another move. The client's deadline passes while that request waits behind the action in flight: the
daemon drops it, its client hears so before giving up, a ``request_dropped`` event says so, and once the action in
flight ends nothing moves ``counter``. A request that does begin in time tells its client so (``begun``) and runs
to its end; a request that states no deadline gets the daemon's own (``control.max_wait_s``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flexmig.act.client import ControlClient
from support.actuator import LiveNode
from support.jobs import ROOT
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WAIT = 60.0


@pytest.fixture(scope="module")
def node() -> Iterator[LiveNode]:
    with LiveNode("h200") as n:
        submit_stubborn(n)
        yield n


def submit_stubborn(node: LiveNode) -> None:
    """Job ``stubborn``: installs the hook but sleeps 600 s between steps, so it never acknowledges a checkpoint."""
    path = node.base / "stubborn.toml"
    text = (node.base / "counter.toml").read_text()
    text = text.replace('name = "counter"', 'name = "stubborn"').replace("counter.ckpt", "stubborn.ckpt")
    text = text.replace(
        f'"{ROOT}/examples/hook_minimal.py",', f'"{ROOT}/examples/hook_minimal.py", "--step-time", "600",'
    )
    text = text.replace("ack_timeout_s = 10", "ack_timeout_s = 20")
    path.write_text(text)
    path.chmod(0o644)
    answer = node.call(node.control.dispatch(json.dumps({"op": "jobs.submit", "args": {"path": str(path)}}).encode()))
    assert answer["ok"], answer
    wait_until(lambda: len(node.act.supervisor.alive("stubborn")) == 1, what="stubborn runs")


def idle(node: LiveNode) -> bool:
    return node.act.executor.running is None and not node.act.executor.action_lock.locked()


def counter_moves(node: LiveNode) -> list[int]:
    return [a.id for a in node.act.journal.recent_actions(1000) if a.job == "counter" and a.kind == "migrate"]


class InFlight:
    """``jobs.migrate stubborn`` from a client of its own (a thread): an action that holds the executor for 20 s."""

    def __init__(self, node: LiveNode) -> None:
        self.answer: Any = None
        self.thread = threading.Thread(target=self._run, args=(node,), daemon=True)
        self.thread.start()
        wait_until(lambda: node.act.executor.running is not None, what="the stubborn move to be in flight")

    def _run(self, node: LiveNode) -> None:
        try:
            self.answer = ControlClient(node.socket, timeout_s=WAIT).call("jobs.migrate", name="stubborn")
        except Exception as exc:  # a ControlError: the move was cancelled
            self.answer = exc

    def join(self) -> None:
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def test_a_request_whose_client_gave_up_is_dropped_before_it_acts_and_the_client_hears_why(node: LiveNode) -> None:
    wait_until(lambda: idle(node), what="the node to be idle")
    before = node.truth()["jobs"]["counter"]
    moves = counter_moves(node)
    dropped_before = [e for e in node.events.events if e.kind == "request_dropped"]
    flight = InFlight(node)
    cli = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(node.socket), "--timeout", "2",
         "migrate", "counter"],
        capture_output=True, text=True, timeout=WAIT, check=False,
    )  # fmt: skip
    flight.join()
    wait_until(lambda: idle(node), what="the node to be idle again")
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "jobs.migrate dropped: it could not begin within 1.5 s, its client's deadline" in cli.stderr, cli.stderr
    assert "nothing was done" in cli.stderr
    after = node.truth()["jobs"]["counter"]
    assert after == before, "the request whose client gave up never ran: counter did not move"
    assert counter_moves(node) == moves
    dropped = [e for e in node.events.events if e.kind == "request_dropped"][len(dropped_before) :]
    assert len(dropped) == 1 and dropped[0].detail == {"op": "jobs.migrate"}
    assert dropped[0].reason.startswith("jobs.migrate dropped: it could not begin within 1.5 s")


def test_a_request_that_begins_in_time_says_so_and_runs_to_its_end(node: LiveNode) -> None:
    wait_until(lambda: idle(node), what="the node to be idle")
    generation = node.truth()["jobs"]["counter"][1]
    request = {"op": "jobs.migrate", "args": {"name": "counter"}, "deadline_s": 30}
    lines = node.call(exchange(node.socket, request))
    assert lines[0] == {"begun": True}
    assert lines[1]["ok"] is True, lines
    assert node.truth()["jobs"]["counter"][1] == generation + 1


def test_a_request_without_a_deadline_gets_the_daemons_and_no_begun_line(node: LiveNode) -> None:
    wait_until(lambda: idle(node), what="the node to be idle")
    before = node.truth()["jobs"]["counter"]

    async def limit(seconds: float) -> None:
        node.control.max_wait_s = seconds

    node.call(limit(1.0))
    try:
        flight = InFlight(node)
        lines = node.call(exchange(node.socket, {"op": "jobs.migrate", "args": {"name": "counter"}}))
        flight.join()
    finally:
        node.call(limit(900.0))
    wait_until(lambda: idle(node), what="the node to be idle again")
    assert len(lines) == 1 and lines[0]["type"] == "RequestExpiredError", lines
    assert lines[0]["error"].startswith("jobs.migrate dropped: it could not begin within 1 s")
    assert node.truth()["jobs"]["counter"] == before


@pytest.mark.parametrize("bad", [0, -1, "5", True, None, 1e9, float("nan")])
def test_a_bad_deadline_is_refused_naming_the_field(node: LiveNode, bad: object) -> None:
    request = json.dumps({"op": "jobs.list", "args": {}, "deadline_s": bad}).encode() + b"\n"
    answer = node.call(node.control.dispatch(request))
    if bad is None:  # null: no deadline stated
        assert answer["ok"] is True
        return
    assert answer["type"] == "RequestError"
    if bad != bad:  # NaN is not JSON: the request's parser refuses it before the field is looked at
        assert answer["error"] == "request is not JSON: NaN is not a number JSON allows"
    else:
        assert "'deadline_s' must be a number of seconds" in answer["error"]


async def exchange(path: Path, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one request; every line until the answer (the one with ``ok``)."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    out: list[dict[str, Any]] = []
    try:
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        while not out or "ok" not in out[-1]:
            line = await asyncio.wait_for(reader.readline(), WAIT)
            assert line, f"the daemon closed the connection after {out}"
            out.append(json.loads(line))
    finally:
        writer.close()
    return out
