"""MQTT commands in the real ``flexmigd``: a command through a real mosquitto (passwords and the README's ACL)
reaches the daemon's actuator and its result comes back on ``commands/result``.

* in mode act, ``migrate`` moves a running job (``examples/hook_minimal.py``) and the result says so;
* after a reload into observe, the same command is refused with a result, and nothing moves;
* with ``[control] enabled = false`` nothing is bound, and commands still run (the dispatcher needs no socket);
* SIGTERM stops the daemon, listener included (exit status 0);
* on a broker that lets anonymous clients publish, commands are refused at start with one line, an anonymous
  ``stop`` does nothing, and the daemon runs on.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.commands import NODE, Operator, anonymous_publish, password_file
from support.flexmigd import act_node, short_base
from support.jobs import counter_spec, flexmig, log_lines, write_spec
from support.mosquitto import Brokers, Mosquitto, needs_mosquitto
from support.wait import wait_until

pytestmark = [pytest.mark.integration, needs_mosquitto, pytest.mark.timeout(300)]


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base() as d:
        yield d


def commands_on(base: Path) -> str:
    """The ``[mqtt]`` keys that turn commands on, with the node's broker credentials."""
    return f'username = "{NODE}"\npassword_file = "{password_file(base)}"\ncommands_enabled = true\n'


def listening(log: Path) -> bool:
    return "MQTT commands: listening on flexmig/v1/node-1/commands/+" in log.read_text()


def test_a_migrate_command_moves_a_job_in_act_and_is_refused_with_a_result_in_observe(
    base: Path, secured_broker: Mosquitto
) -> None:
    with act_node(base, "h200", node_name=NODE, broker=secured_broker.address, mqtt_extra=commands_on(base)) as node:
        wait_until(lambda: listening(node.log), what="the command listener")
        flexmig(node.sock, "submit", str(write_spec(base / "counter.toml", counter_spec(base, "counter"))))
        wait_until(lambda: len(log_lines(base / "counter.log")) >= 3, what="counter runs")
        before = node.jobs()["counter"]
        operator = Operator(secured_broker)
        try:
            moved = operator.ask("migrate", {"id": "op-1", "args": {"name": "counter"}})
            after = node.jobs()["counter"]
            node.hup("observe")
            refused = operator.ask("migrate", {"id": "op-2", "args": {"name": "counter"}})
        finally:
            operator.close()
        unmoved = node.jobs()["counter"]
        rc = node.stop()
        log = node.log.read_text()

    assert (moved["id"], moved["node"], moved["verb"], moved["ok"]) == ("op-1", NODE, "migrate", True), moved
    assert "migrate" in [a["kind"] for a in moved["result"]["actions"]]
    assert after["state"] == "running" and after["generation"] == before["generation"] + 1
    assert after["instances"] != before["instances"], "the job runs on another instance now"
    assert sum(e["event"] == "start" for e in log_lines(base / "counter.log")) == 2  # resumed once, after the move

    assert (refused["id"], refused["ok"], refused["type"]) == ("op-2", False, "PlanRejectedError"), refused
    assert "mode is 'observe'" in refused["error"]
    assert unmoved["generation"] == after["generation"] and unmoved["instances"] == after["instances"]

    assert "MQTT command op-1 migrate on 'flexmig/v1/node-1/commands/migrate': done" in log
    assert "MQTT command op-2 migrate on 'flexmig/v1/node-1/commands/migrate' refused by the daemon" in log
    assert rc == 0 and "Traceback" not in log


def test_commands_run_with_the_control_socket_disabled(base: Path, secured_broker: Mosquitto) -> None:
    with act_node(
        base, "h200", node_name=NODE, broker=secured_broker.address, mqtt_extra=commands_on(base), control=False
    ) as node:
        wait_until(lambda: listening(node.log), what="the command listener")
        operator = Operator(secured_broker)
        try:
            plan = operator.ask("plan-now", {"id": "p-1"})
            stop = operator.ask("stop", {"id": "s-1", "args": {"name": "nosuch"}})
        finally:
            operator.close()
        bound = node.sock.exists()
        rc = node.stop()

    assert not bound, "[control] enabled = false binds no socket"
    assert plan["ok"] is True and plan["result"]["mode"] == "act" and plan["result"]["executes"] is True, plan
    assert (stop["ok"], stop["type"]) == (False, "RequestError") and "no job named 'nosuch'" in stop["error"], stop
    assert rc == 0


def test_started_with_a_malformed_broker_address_commands_begin_once_a_reload_fixes_it(
    base: Path, secured_broker: Mosquitto
) -> None:
    with act_node(base, "h200", node_name=NODE, broker="no-port", mqtt_extra=commands_on(base)) as node:
        wait_until(lambda: "MQTT publishing is off" in node.log.read_text(), what="the line saying MQTT is off")
        assert not listening(node.log)
        node.broker = secured_broker.address
        node.write_config()
        assert node.proc is not None
        node.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: listening(node.log), what="the command listener after the reload")
        operator = Operator(secured_broker)
        try:
            plan = operator.ask("plan-now", {"id": "after-fix"})
        finally:
            operator.close()
        rc = node.stop()
    assert (plan["id"], plan["ok"]) == ("after-fix", True), plan
    assert rc == 0


def test_on_a_broker_that_lets_anyone_publish_commands_are_refused_with_one_line_and_the_daemon_runs_on(
    base: Path, mosquitto: Brokers
) -> None:
    broker = mosquitto("allow_anonymous true\n")
    with act_node(base, "h200", node_name=NODE, broker=broker.address, mqtt_extra=commands_on(base)) as node:
        wait_until(lambda: "MQTT commands refused" in node.log.read_text(), what="the refusal")
        flexmig(node.sock, "submit", str(write_spec(base / "counter.toml", counter_spec(base, "counter"))))
        wait_until(lambda: len(log_lines(base / "counter.log")) >= 3, what="counter runs")
        before = node.jobs()["counter"]
        anonymous_publish(broker, "stop", {"id": "intruder", "args": {"name": "counter", "force": True}})
        job = node.jobs()["counter"]
        rc = node.stop()
        log = node.log.read_text()
    refusals = [line for line in log.splitlines() if "MQTT commands refused" in line]
    assert len(refusals) == 1 and "an anonymous client could publish to flexmig/v1/node-1/commands/" in refusals[0]
    assert "MQTT commands: listening" not in log and "intruder" not in log
    assert job["state"] == "running" and job["generation"] == before["generation"]
    assert rc == 0 and "Traceback" not in log
