"""The daemon's components above telemetry: detection on every snapshot, its Prometheus families, MQTT, the
actuator with the planner and the control socket, and the MQTT command listener that forwards to the actuator.

:func:`wire` registers them on a daemon through its extension points only (a snapshot enricher and subscriber, a
metrics extension, loops, start/stop/reload hooks), so ``daemon.py`` keeps no knowledge of any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from flexmig.config import Config
from flexmig.export.commands import CommandListener, command_listener
from flexmig.export.findings_metrics import FindingsMetrics, PublisherMetrics
from flexmig.export.prometheus import SnapshotMetrics
from flexmig.telemetry.publish import SnapshotHub
from flexmig.wiring.actuator import ActuatorComponent, ActuatorHost
from flexmig.wiring.detection import Detector, detect_settings
from flexmig.wiring.mqtt import FindingsPublisher, MqttComponent

__all__ = [
    "ActuatorComponent",
    "Components",
    "DaemonHooks",
    "Detector",
    "FindingsPublisher",
    "MqttComponent",
    "detect_settings",
    "wire",
]


class DaemonHooks(Protocol):
    """What :func:`wire` needs of a daemon (``flexmig.daemon.Daemon`` has it)."""

    config: Config
    hostname: str
    hub: SnapshotHub

    def add_loop(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``factory()`` under the daemon's TaskGroup."""
        ...

    def add_metrics(self, extension: SnapshotMetrics) -> None:
        """Export more families from each snapshot."""
        ...

    def on_reload(self, hook: Callable[[Config], None]) -> None:
        """Call ``hook`` after each accepted configuration reload."""
        ...


@dataclass(frozen=True, slots=True)
class Components:
    """What :func:`wire` added: the detector and the actuator always, the MQTT component when ``[mqtt] enabled``."""

    detector: Detector
    mqtt: MqttComponent | None
    actuator: ActuatorComponent
    commands: CommandListener | None = None
    """The MQTT command listener (``[mqtt] enabled`` and ``commands_enabled``), forwarding to the actuator."""


def wire(daemon: ActuatorHost) -> Components:
    """Register detection (enricher, metrics, reload of ``[detect]``), if enabled MQTT (loop ``mqtt``,
    subscriber, publisher metrics), the actuator (start, loop ``actuator``, stop, reload, action metrics), and if
    enabled the MQTT command listener (loop ``mqtt-commands``, forwarding to :meth:`ActuatorComponent.dispatch`).
    Raises ConfigError or OutboxError when MQTT cannot be set up."""
    config = daemon.config
    detector = Detector(detect_settings(config.detect))
    daemon.hub.add_enricher(detector.enrich)
    daemon.add_metrics(FindingsMetrics(detector.stats))
    daemon.on_reload(lambda cfg: detector.configure(detect_settings(cfg.detect)))
    mqtt: MqttComponent | None = None
    if config.mqtt.enabled:
        hostname = daemon.hostname
        mqtt = MqttComponent(config.mqtt, config.node(lambda: hostname), detector, mode=config.mode)
        daemon.hub.subscribe(mqtt.findings)
        daemon.add_metrics(PublisherMetrics(mqtt.publisher.stats, mqtt.findings.emitted))
        daemon.add_loop("mqtt", mqtt.run)
    actuator = ActuatorComponent(daemon, mqtt=mqtt)
    hostname = daemon.hostname
    listener = command_listener(config, config.node(lambda: hostname), actuator.dispatch)
    if listener is not None:
        daemon.add_loop("mqtt-commands", listener.run)
    return Components(detector, mqtt, actuator, listener)
