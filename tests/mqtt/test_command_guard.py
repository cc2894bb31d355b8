"""MQTT commands stay off unless the broker keeps strangers off the command topics (issue 19, point 10): against real
mosquittos, one that lets anonymous clients publish anywhere, one with passwords but no ACL, and one with the
documented ACL, a live actuator's job is commanded only through the last, and the first two are refused at start
with one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.actuator import LiveNode
from support.commands import NODE, Operator, RunningListener, anonymous_publish, password_file
from support.mosquitto import WAIT, Brokers, Mosquitto, needs_mosquitto, secured_config
from support.wait import free_port, wait_until

pytestmark = [pytest.mark.integration, needs_mosquitto, pytest.mark.timeout(240)]

STOP = {"id": "intruder-1", "args": {"name": "counter", "force": True}}


@pytest.fixture(scope="module")
def node() -> Iterator[LiveNode]:
    with LiveNode("h200") as n:
        yield n


@contextmanager
def listening(node: LiveNode, broker: Mosquitto, tmp_path: Path, *, own: bool = False) -> Iterator[RunningListener]:
    """The node's command listener on ``broker`` for the body of a ``with``; stopped after it (and ``broker`` too
    when the test started it itself: ``own``)."""
    listener = RunningListener(node, broker, password_file(tmp_path))
    try:
        yield listener
    finally:
        listener.stop()
        if own:
            broker.stop()


def refusal(listener: RunningListener) -> str:
    """The listener's refusal line, once it is logged (bounded wait)."""
    wait_until(lambda: listener.listener.stats().off is not None, WAIT, "the refusal line")
    lines = [line for line in listener.log.lines if "refused" in line]
    assert len(lines) == 1, listener.log.lines
    return lines[0]


def job_runs(node: LiveNode) -> bool:
    return bool(node.truth()["jobs"]["counter"][0] == "running")


def test_a_broker_that_lets_anonymous_clients_publish_is_refused_at_start_with_one_line(
    node: LiveNode, mosquitto: Brokers, tmp_path: Path
) -> None:
    broker = mosquitto("allow_anonymous true\n")  # mosquitto's out-of-the-box trust: anyone, anywhere
    with listening(node, broker, tmp_path) as listener:
        line = refusal(listener)
        assert line.startswith(
            f"MQTT commands refused: an anonymous client could publish to flexmig/v1/{NODE}/commands/"
        ), line
        assert "set allow_anonymous false" in line and "docs/mqtt.md" in line
        anonymous_publish(broker, "stop", STOP)  # the attack of the issue: a local user force-stops the job
        assert listener.alive() and not listener.listener.stats().connected
        assert job_runs(node), "an anonymous command never runs"
        assert listener.listener.stats().received == 0
        assert listener.log.lines == [line], "one line, and nothing more as it stays off"


def test_a_broker_with_passwords_but_no_acl_is_refused_at_start_with_one_line(
    node: LiveNode, mosquitto: Brokers, tmp_path: Path
) -> None:
    """Every account may publish everywhere there, so the node's own account probes its command topics."""
    conf = "".join(line + "\n" for line in secured_config(tmp_path / "s").splitlines() if "acl_file" not in line)
    broker = mosquitto(conf)
    with listening(node, broker, tmp_path) as listener:
        line = refusal(listener)
        assert line.startswith(
            f"MQTT commands refused: the node's own account '{NODE}' could publish to flexmig/v1/{NODE}/commands/"
        ), line
        assert "ACL" in line and "restarted" in line
        viewer = Operator(broker, user="viewer")  # another account: without an ACL, it may publish commands
        try:
            viewer.send("stop", STOP)
        finally:
            viewer.close()
        assert job_runs(node)
        assert listener.listener.stats().received == 0


def test_with_the_documented_acl_operators_command_and_anonymous_clients_cannot(
    node: LiveNode, mosquitto: Brokers, tmp_path: Path
) -> None:
    """Anonymous clients may even connect (to read nothing): the ACL, not the login, keeps the topics closed."""
    conf = secured_config(tmp_path / "s").replace("allow_anonymous false", "allow_anonymous true")
    broker = mosquitto(conf)
    with listening(node, broker, tmp_path) as listener:
        operator = Operator(broker)
        try:
            listener.wait_connected()
            assert listener.listener.stats().off is None
            assert any("anonymous clients and the node's own account cannot publish" in x for x in listener.log.lines)
            anonymous_publish(broker, "stop", STOP)
            answer = operator.ask("stop", {"id": "op-1", "args": {"name": "nosuch"}})
            assert answer["id"] == "op-1", "the anonymous command never reached the node: the operator's is the first"
            assert answer["type"] == "RequestError" and "no job named 'nosuch'" in answer["error"]
            assert job_runs(node)
        finally:
            operator.close()


def test_a_second_listener_that_lets_anonymous_clients_publish_keeps_commands_off_and_says_which(
    node: LiveNode, mosquitto: Brokers, tmp_path: Path
) -> None:
    """With ``per_listener_settings true`` each listener has its own rules: the one flexmig uses has the documented
    ACL and refuses anonymous clients, a second one lets them publish anywhere. Before, flexmig probed only its own
    listener, logged that anonymous clients could not publish commands, and any local user force-stopped the job
    through the second one."""
    door = free_port()
    anonymous = f"listener {door} 127.0.0.1\nallow_anonymous true\n"
    broker = per_listener(tmp_path, secured_config(tmp_path / "s"), anonymous)
    with listening(node, broker, tmp_path, own=True) as listener:
        line = refusal(listener)
        assert line.startswith(
            f"MQTT commands refused: an anonymous client could publish to flexmig/v1/{NODE}/commands/"
        ), line
        assert f"through the broker's other listener 127.0.0.1:{door}" in line, line
        anonymous_publish(SimpleNamespace(port=door), "stop", STOP)  # type: ignore[arg-type]  # the second door
        assert job_runs(node), "an anonymous command through the other listener never runs"
        assert listener.listener.stats().received == 0


def test_commands_run_when_every_listener_of_the_broker_keeps_anonymous_clients_off(
    node: LiveNode, mosquitto: Brokers, tmp_path: Path
) -> None:
    door = free_port()
    secured = secured_config(tmp_path / "s")
    broker = per_listener(tmp_path, secured, f"listener {door} 127.0.0.1\n" + secured)
    with listening(node, broker, tmp_path, own=True) as listener:
        listener.wait_connected()
        assert listener.listener.stats().off is None
        assert any("nor anonymous clients on its 1 other listener(s)" in x for x in listener.log.lines), listener.log


def per_listener(tmp_path: Path, first: str, more: str) -> Mosquitto:
    """A started mosquitto with ``per_listener_settings true`` (which must come before its first listener): its
    first listener (flexmig's) with the lines ``first``, then the lines ``more`` (further listeners)."""
    broker = Mosquitto(tmp_path / "per-listener", extra=first + more)
    broker.conf.write_text("per_listener_settings true\n" + broker.conf.read_text())
    return broker.start()


def test_a_second_anonymous_listener_on_a_unix_socket_keeps_commands_off_too(node: LiveNode, tmp_path: Path) -> None:
    path = tmp_path / "mq.sock"
    broker = per_listener(tmp_path, secured_config(tmp_path / "s"), f"listener 0 {path}\nallow_anonymous true\n")
    with listening(node, broker, tmp_path, own=True) as listener:
        line = refusal(listener)
        assert f"through the broker's other listener unix:{path}" in line, line
