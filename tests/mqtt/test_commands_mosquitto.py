"""MQTT commands through a real mosquitto (passwords, the README's ACL) to a live actuator on a simulated node:
a valid command acts and its result carries its ID; the mode, retained messages, repeated IDs, a full queue, the
ACL and bad credentials each refuse with one clear log line and a result; the listener outlives a broker restart.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from support.actuator import LiveNode
from support.commands import Operator, RunningListener, password_file
from support.mosquitto import ACL, PASSWORDS, WAIT, Mosquitto, needs_mosquitto
from support.wait import wait_until

pytestmark = [pytest.mark.integration, needs_mosquitto, pytest.mark.timeout(240)]

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def node() -> Iterator[LiveNode]:
    with LiveNode("h200") as n:
        yield n


@pytest.fixture(scope="module")
def listener(
    node: LiveNode, secured_broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningListener]:
    running = RunningListener(node, secured_broker, password_file(tmp_path_factory.mktemp("secrets")))
    running.wait_connected()
    yield running
    running.stop()


@pytest.fixture
def operator(secured_broker: Mosquitto, listener: RunningListener) -> Iterator[Operator]:
    op = Operator(secured_broker)
    yield op
    op.close()


def new_lines(listener: RunningListener, since: int) -> list[str]:
    return listener.log.lines[since:]


def refusals(lines: list[str]) -> list[str]:
    return [line for line in lines if "refused" in line]


def refused_logins(broker: Mosquitto) -> int:
    """Logins the broker refused so far, by its own log."""
    return broker.log().count("disconnected, not authorised")


# ------------------------------------------------------------------------------------------------ acting
def test_a_migrate_command_moves_the_job_and_its_result_carries_the_id(
    node: LiveNode, listener: RunningListener, operator: Operator
) -> None:
    before = node.truth()
    result = operator.ask("migrate", {"id": "op-42", "args": {"name": "counter"}})
    assert result["id"] == "op-42" and result["verb"] == "migrate" and result["node"] == "node-1"
    assert result["ok"] is True, result
    assert [a["outcome"] for a in result["result"]["actions"]] == ["completed"] * 3
    after = node.truth()
    (state, generation, slots, _uid) = after["jobs"]["counter"]
    assert state == "running" and generation == before["jobs"]["counter"][1] + 1
    assert slots != before["jobs"]["counter"][2], "the job runs on another instance now"
    assert after["gpus"][0]["layout"] != before["gpus"][0]["layout"]


@pytest.mark.parametrize(("mode", "why"), [("observe", "mode is 'observe'"), ("advise", "mode is 'advise'")])
def test_outside_act_mode_a_valid_command_is_refused_and_changes_nothing(
    node: LiveNode, listener: RunningListener, operator: Operator, mode: str, why: str
) -> None:
    before, since = node.truth(), len(listener.log.lines)
    node.set_mode(mode)
    try:
        for verb, args in (("migrate", {"name": "counter"}), ("stop", {"name": "counter"})):
            result = operator.ask(verb, {"id": f"{mode}-{verb}", "args": args})
            assert result["ok"] is False and result["type"] == "PlanRejectedError", result
            assert why in result["error"]
    finally:
        node.set_mode("act")
    assert node.truth() == before
    lines = refusals(new_lines(listener, since))
    assert len(lines) == 2 and all("refused by the daemon" in line and why in line for line in lines)
    assert "'flexmig/v1/node-1/commands/migrate'" in lines[0]


# ------------------------------------------------------------------------------------------------ refusing
def test_a_bad_payload_gets_one_log_line_naming_the_topic_and_a_result(
    node: LiveNode, listener: RunningListener, operator: Operator
) -> None:
    before, since = node.truth(), len(listener.log.lines)
    result = operator.ask("reboot", {"id": "op-1", "args": {"name": "counter"}})
    assert result == {
        **result,
        "id": "op-1",
        "verb": None,
        "ok": False,
        "type": "CommandRefused",
        "error": "unknown verb 'reboot'; known: migrate, resplit, stop, plan-now",
    }
    result = operator.ask("stop", b'{"id": "op-2", "args": {"name": "counter; reboot"}}')
    assert result["id"] == "op-2" and result["type"] == "CommandRefused" and "args.name" in result["error"]
    assert node.truth() == before
    lines = new_lines(listener, since)
    assert lines == [
        "MQTT command op-1 on 'flexmig/v1/node-1/commands/reboot' refused: unknown verb 'reboot'; known: "
        "migrate, resplit, stop, plan-now",
        "MQTT command op-2 on 'flexmig/v1/node-1/commands/stop' refused: args.name: 'counter; reboot' does not "
        "match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$(?!\\n)",
    ]
    assert listener.alive()


def test_a_retained_command_is_refused_live_and_at_every_reconnect(
    node: LiveNode, secured_broker: Mosquitto, listener: RunningListener, operator: Operator, tmp_path: Path
) -> None:
    before = node.truth()
    operator.send("stop", {"id": "kept", "args": {"name": "counter"}}, retain=True)
    try:
        live = operator.result()
        assert live["id"] == "kept" and live["ok"] is False and "retained commands are refused" in live["error"]
        # A second listener connecting now gets the retained message too, and refuses it again.
        other = RunningListener(node, secured_broker, password_file(tmp_path), client_id="second")
        try:
            again = operator.result()
            assert again["id"] == "kept" and "retained" in again["error"]
        finally:
            other.stop()
    finally:
        operator.send("stop", b"", retain=True)  # clear it: an empty message is no command, and gets no result
    assert node.truth() == before
    result = operator.ask("stop", {"id": "after-clear", "args": {"name": "nosuch"}})
    assert result["id"] == "after-clear", "the clearing message produced no result of its own"


def test_a_repeated_id_is_not_run_twice(listener: RunningListener, operator: Operator) -> None:
    first = operator.ask("stop", {"id": "twice", "args": {"name": "nosuch"}})
    assert first["type"] == "RequestError" and "no job named 'nosuch'" in first["error"]
    second = operator.ask("stop", {"id": "twice", "args": {"name": "nosuch"}})
    assert second["type"] == "DuplicateCommand" and "not run again" in second["error"]


def test_a_user_the_acl_does_not_allow_cannot_command(
    node: LiveNode, secured_broker: Mosquitto, listener: RunningListener, operator: Operator
) -> None:
    before = node.truth()
    viewer = Operator(secured_broker, user="viewer")
    try:
        viewer.send("stop", {"id": "from-viewer", "args": {"name": "counter"}})  # the broker drops it
        result = operator.ask("stop", {"id": "from-operator", "args": {"name": "nosuch"}})
        assert result["id"] == "from-operator", "the viewer's command never reached the node"
        assert viewer.result()["id"] == "from-operator", "viewers may read results"
    finally:
        viewer.close()
    assert node.truth() == before


def test_the_docs_show_the_acl_the_tests_use() -> None:
    docs = README.parent / "docs" / "mqtt.md"
    assert ACL in docs.read_text(), "docs/mqtt.md, MQTT commands: the mosquitto ACL must be the one tested here"


# ------------------------------------------------------------------------------------------------ queue
def test_commands_run_one_at_a_time_and_a_full_queue_answers_busy(
    node: LiveNode, secured_broker: Mosquitto, tmp_path: Path
) -> None:
    """plan-now forwards to the daemon's ``plan`` operation; here one that waits until released."""
    release = asyncio.Event()
    started: list[str] = []

    async def plan_now(args: Mapping[str, Any]) -> dict[str, Any]:
        started.append("plan")
        await release.wait()
        return {"planned": True}

    async def add() -> None:
        node.control.add("plan", plan_now)

    node.call(add())
    slow = RunningListener(node, secured_broker, password_file(tmp_path, "node-2"), node_name="node-2", max_pending=1)
    operator = Operator(secured_broker, node="node-2")
    try:
        slow.wait_connected()
        operator.send("plan-now", {"id": "p0"})
        deadline = time.monotonic() + WAIT
        while not started:  # p0 runs (and waits to be released)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        operator.send("plan-now", {"id": "p1"})  # waits in the queue of 1
        operator.send("plan-now", {"id": "p2"})  # finds the queue full
        busy = operator.result()
        assert busy["id"] == "p2" and busy["type"] == "Busy", busy
        assert started == ["plan"], "one runs, one waits, the third is refused"

        async def go() -> None:
            release.set()

        node.call(go())
        done = [operator.result(), operator.result()]
        assert [(r["id"], r["ok"], r["result"]) for r in done] == [
            ("p0", True, {"planned": True}),
            ("p1", True, {"planned": True}),
        ]
    finally:
        operator.close()
        slow.stop()

        async def remove() -> None:
            node.control.handlers.pop("plan", None)

        node.call(remove())


def test_a_command_that_waited_past_control_max_wait_s_is_dropped_unrun(
    node: LiveNode, secured_broker: Mosquitto, tmp_path: Path
) -> None:
    """Each command reaches the dispatcher with what is left of its deadline (counted from its arrival); one that
    waited longer than that behind the command before it is answered RequestExpiredError and never dispatched."""
    lines: list[dict[str, Any]] = []
    release = asyncio.Event()

    async def dispatch(line: bytes) -> Mapping[str, Any]:
        lines.append(json.loads(line))
        await release.wait()
        return {"ok": True, "result": {"planned": True}}

    slow = RunningListener(
        node, secured_broker, password_file(tmp_path, "node-2"), node_name="node-2", dispatch=dispatch, max_wait_s=1.0
    )
    operator = Operator(secured_broker, node="node-2")
    try:
        slow.wait_connected()
        operator.send("plan-now", {"id": "first"})
        wait_until(lambda: len(lines) == 1, WAIT, "the first command dispatched")
        assert 0 < lines[0]["deadline_s"] <= 1.0 and lines[0]["op"] == "plan"
        operator.send("plan-now", {"id": "second"})  # waits behind the first, past its deadline
        sent = time.monotonic()
        wait_until(lambda: time.monotonic() > sent + 1.0, WAIT, "its deadline to pass")

        async def go() -> None:
            release.set()

        node.call(go())
        first, second = operator.result(), operator.result()
    finally:
        operator.close()
        slow.stop()
    assert (first["id"], first["ok"]) == ("first", True)
    assert (second["id"], second["ok"], second["type"]) == ("second", False, "RequestExpiredError"), second
    assert second["error"].startswith("plan dropped: it could not begin within 1 s of its arrival")
    assert len(lines) == 1, "the second command never reached the dispatcher"


# ------------------------------------------------------------------------------------------------ broker trouble
def test_wrong_credentials_give_one_clear_line_without_the_password_and_the_listener_keeps_trying(
    node: LiveNode, secured_broker: Mosquitto, tmp_path: Path
) -> None:
    wrong = password_file(tmp_path, password="Not-The-Pass-9f")
    refused_before = refused_logins(secured_broker)
    bad = RunningListener(node, secured_broker, wrong, client_id="wrong")
    try:
        wait_until(lambda: any("refused the login" in line for line in bad.log.lines), WAIT, "the listener's line")
        # It keeps trying (by the broker's own account), and its log still holds that one line.
        wait_until(lambda: refused_logins(secured_broker) >= refused_before + 3, WAIT, "3 refused logins")
        assert bad.alive()
        (line,) = bad.log.lines
        assert line.startswith(
            f"MQTT commands: broker 127.0.0.1:{secured_broker.port} refused the login of user 'node-1'"
        )
        assert "check mqtt.username and mqtt.password_file" in line
        assert "Not-The-Pass-9f" not in line and PASSWORDS["node-1"] not in line
    finally:
        bad.stop()


def test_the_listener_comes_back_after_a_broker_restart(
    node: LiveNode, secured_broker: Mosquitto, tmp_path: Path
) -> None:
    own = RunningListener(node, secured_broker, password_file(tmp_path, "node-3"), node_name="node-3")
    try:
        own.wait_connected()
        secured_broker.stop()
        deadline = time.monotonic() + WAIT
        while own.listener.stats().connected:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        secured_broker.start()
        own.wait_connected()
        op = Operator(secured_broker, node="node-3")
        try:
            result = op.ask("stop", {"id": "after-restart", "args": {"name": "nosuch"}})
        finally:
            op.close()
        assert result["id"] == "after-restart" and result["node"] == "node-3"
        assert sum("listening on" in line for line in own.log.lines) == 2
        assert own.alive()
        assert re.search(r"MQTT commands: broker 127\.0\.0\.1:\d+: .*; retrying with backoff", "\n".join(own.log.lines))
    finally:
        own.stop()
