"""MQTT commands in the running daemon (``[mqtt] enabled`` and ``commands_enabled``): component ``mqtt-commands``.

The listener (:mod:`flexmig.mqtt.commands`) forwards each valid command, as a control request line, to the
actuator's dispatcher (:meth:`flexmig.service.actuator_runtime.ActuatorRuntime.dispatch`, of the runtime that
:func:`flexmig.wiring.wire` hands it): the same operations, checks and mode rules as the control socket. Its loop is
restarted after a failure (it holds nothing worth keeping).

A daemon that started with a malformed ``mqtt.broker`` (publishing off, see :class:`~flexmig.wiring.mqtt.
MqttComponent`) listens only once a reload fixed the address: then with the reloaded configuration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from flexmig.config import Config
from flexmig.errors import ConfigError
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.mqtt.commands import CommandListener, Dispatch, command_listener
from flexmig.wiring.mqtt import MqttComponent

__all__ = ["CommandsComponent"]

log = logging.getLogger(__name__)


class CommandsComponent:
    """The MQTT command listener of one daemon, forwarding to ``dispatch``."""

    name = "mqtt-commands"
    restart = True

    def __init__(
        self, listener: CommandListener, config: Config, node: str, dispatch: Dispatch, mqtt: MqttComponent
    ) -> None:
        self.listener = listener
        """The listener made from the start's configuration (it checked the credentials and TLS rules)."""
        self.config = config
        self.node = node
        self.dispatch = dispatch
        self.mqtt = mqtt
        self._deferred = mqtt.broker_problem is not None
        """The broker address was malformed at start: listen once a reload fixed it."""

    async def start(self) -> None:
        """Nothing to open: the listener connects in its loop."""

    async def run(self) -> None:
        """Listen until cancelled (after the broker address is fixed, if it was malformed)."""
        if not self._deferred:
            await self.listener.run()
            return
        await self.mqtt.publisher.wait_on()
        try:
            listener = command_listener(self.config, self.node, self.dispatch)
        except ConfigError as exc:  # the reload validated the file; settings it cannot express stay off
            log.error("MQTT commands stay off: %s", exc)
            listener = None
        if listener is None:
            await asyncio.Event().wait()
            return
        await listener.run()

    async def drain(self) -> None:
        """A command in flight is the actuator's to finish (its drain waits for the action lock)."""

    async def close(self) -> None:
        """Nothing held beyond the loop's connection, closed when it is cancelled."""

    def reload(self, config: Config) -> None:
        """Keep the configuration a deferred listener starts with; the ``[mqtt]`` keys are restart keys."""
        self.config = config

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """Results dropped unsent (only for the listener made at start: a deferred one reports none)."""
        return () if self._deferred else (LossMetrics(commands=self.listener.stats),)
