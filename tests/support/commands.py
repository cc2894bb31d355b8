"""MQTT commands against a real mosquitto (the ``secured_broker`` fixture: passwords and the README's ACL): an
operator client, and the command listener running on a :class:`~support.actuator.LiveNode`'s loop, forwarding to
its control dispatcher.

Not a test module; imported by ``test_commands_mosquitto`` and ``test_fuzz_commands``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import socket
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from flexmig.config import HostPort
from flexmig.mqtt.commands import CommandListener, CommandSettings, Dispatch
from support.actuator import LiveNode
from support.mosquitto import PASSWORDS, WAIT, Mosquitto
from support.wait import until

NODE = "node-1"


def password_file(directory: Path, user: str = NODE, password: str | None = None) -> Path:
    """A credential file as the daemon wants it (mode 0600)."""
    path = directory / f"{user}.password"
    path.write_text((password or PASSWORDS[user]) + "\n")
    path.chmod(0o600)
    return path


class Operator:
    """A person's MQTT client (paho, its own thread): publishes commands, collects results in order."""

    def __init__(self, broker: Mosquitto, user: str = "operator", node: str = NODE) -> None:
        self.base = f"flexmig/v1/{node}/commands"
        self.results: queue.Queue[dict[str, Any]] = queue.Queue()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"{user}-{uuid.uuid4().hex[:8]}", protocol=paho.MQTTv5
        )
        self.client.username_pw_set(user, PASSWORDS[user])
        self.client.on_socket_open = lambda _c, _u, sock: sock.setsockopt(  # type: ignore[attr-defined]  # a TCP socket here
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )
        self.client.on_message = lambda _c, _u, msg: self.results.put(json.loads(msg.payload))
        subscribed = queue.Queue[bool]()
        self.client.on_subscribe = lambda *_a: subscribed.put(True)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        self.client.subscribe(f"{self.base}/result", qos=1)
        subscribed.get(timeout=WAIT)

    def send(self, verb: str, payload: bytes | dict[str, Any], *, retain: bool = False) -> None:
        """Publish one command at QoS 1 and wait for the broker's acknowledgement."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        info = self.client.publish(f"{self.base}/{verb}", data, qos=1, retain=retain)
        info.wait_for_publish(WAIT)
        assert info.is_published()

    def result(self, timeout: float = WAIT) -> dict[str, Any]:
        """The next result (bounded wait)."""
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no command result within {timeout} s") from None

    def ask(self, verb: str, payload: bytes | dict[str, Any]) -> dict[str, Any]:
        """Send and return the result that comes back."""
        self.send(verb, payload)
        return self.result()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Lines(logging.Handler):
    """Collects the listener's log lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class RunningListener:
    """A CommandListener on ``node``'s loop, logging to its own logger; ``stop()`` cancels it (bounded)."""

    def __init__(
        self,
        node: LiveNode,
        broker: Mosquitto,
        secret: Path,
        *,
        dispatch: Dispatch | None = None,
        node_name: str = NODE,
        **limits: Any,
    ) -> None:
        """Listen as ``node_name`` (also its broker user name; its password is in ``secret``)."""
        self.node = node
        self.log = Lines()
        self.logger = logging.getLogger(f"test.commands.{uuid.uuid4().hex[:6]}")
        self.logger.addHandler(self.log)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        settings = CommandSettings(
            node=node_name,
            broker=HostPort("127.0.0.1", broker.port),
            username=node_name,
            password_file=secret,
            backoff_initial_s=0.05,
            backoff_max_s=0.5,
            **limits,
        )
        self.listener = CommandListener(settings, dispatch or node.control.dispatch, logger=self.logger)

        async def start() -> asyncio.Task[None]:
            return asyncio.create_task(self.listener.run())

        self.task = node.call(start())

    def wait_connected(self) -> None:
        self.node.call(until(lambda: self.listener.stats().connected, WAIT, "the command listener connected"))

    def alive(self) -> bool:
        return not self.task.done()

    def stop(self) -> None:
        async def cancel() -> None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self.task, WAIT)

        self.node.call(cancel())


def anonymous_publish(broker: Mosquitto, verb: str, command: dict[str, Any], node: str = NODE) -> None:
    """What any local user can do on a broker that lets anonymous clients in: publish a command (QoS 1, waiting
    for the broker's acknowledgement)."""
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=f"intruder-{uuid.uuid4().hex[:6]}", protocol=paho.MQTTv5
    )
    connected: queue.Queue[bool] = queue.Queue()
    client.on_connect = lambda _c, _u, _f, rc, _p: connected.put(not rc.is_failure)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        assert connected.get(timeout=WAIT), "the broker lets anonymous clients in"
        client.publish(f"flexmig/v1/{node}/commands/{verb}", json.dumps(command), qos=1).wait_for_publish(WAIT)
    finally:
        client.disconnect()
        client.loop_stop()
