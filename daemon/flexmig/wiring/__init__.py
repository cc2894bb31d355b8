"""The daemon's components above telemetry: detection on every snapshot, its Prometheus families, MQTT, the
actuator with the planner and the control socket, and the MQTT command listener that forwards to the actuator.

:func:`wire` registers them on a daemon through its extension points only (a snapshot enricher and subscriber, a
metrics extension, loops, start/stop/reload hooks), so ``daemon.py`` keeps no knowledge of any of them.
:func:`flexmig.wiring.backend.open_backend` opens the node: the real driver or the simulated one, with the process
table and (simulated) the demo workload that go with it; nothing below the wiring knows which.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from flexmig.config import ConfigProblem
from flexmig.errors import ConfigError
from flexmig.metrics.findings import FindingsMetrics, PublisherMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.mqtt.commands import CommandListener, Dispatch, command_listener
from flexmig.storage import LockSet
from flexmig.wiring.actuator import ActuatorComponent
from flexmig.wiring.actuator_host import ActuatorHost
from flexmig.wiring.detection import Detector, detect_settings
from flexmig.wiring.mqtt import FindingsPublisher, MqttComponent
from flexmig.wiring.slurm import SlurmComponent

__all__ = [
    "ActuatorComponent",
    "Components",
    "Detector",
    "FindingsPublisher",
    "MqttComponent",
    "SlurmComponent",
    "WiredDaemon",
    "detect_settings",
    "wire",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Components:
    """What :func:`wire` added: the detector and the actuator always, the MQTT component when ``[mqtt] enabled``."""

    detector: Detector
    mqtt: MqttComponent | None
    actuator: ActuatorComponent
    commands: CommandListener | None = None
    """The MQTT command listener (``[mqtt] enabled`` and ``commands_enabled``), forwarding to the actuator."""
    slurm: SlurmComponent | None = None
    """The Slurm agent (``[slurm] enabled``): demand from Slurm, re-registrations in mode act."""


class WiredDaemon(ActuatorHost, Protocol):
    """What :func:`wire` needs of a daemon (``flexmig.daemon.Daemon`` has it): the actuator's host, and the
    configuration problems it started with (:func:`flexmig.config.load_config_deferring`)."""

    deferred_problems: tuple[ConfigProblem, ...]
    sim_workload: bool
    wall: Callable[[], float]
    clock: Callable[[], float]


def wire(daemon: WiredDaemon) -> Components:
    """Register detection (enricher, metrics, reload of ``[detect]``), if enabled MQTT (loop ``mqtt``,
    subscriber, publisher metrics), the actuator (start, loop ``actuator``, stop, reload, action metrics), and if
    enabled the MQTT command listener (loop ``mqtt-commands``, forwarding to :meth:`ActuatorComponent.dispatch`).
    Raises ConfigError or OutboxError when MQTT cannot be set up, StateInUseError when another daemon holds the
    outbox's directory."""
    config = daemon.config
    detector = Detector(detect_settings(config.detect))
    daemon.hub.add_enricher(detector.enrich)
    daemon.add_metrics(FindingsMetrics(detector.stats))
    daemon.on_reload(lambda cfg: detector.configure(detect_settings(cfg.detect)))
    hostname = daemon.hostname
    node = config.node(lambda: hostname)
    broker_problem = next((str(p) for p in daemon.deferred_problems if p.key == "mqtt.broker"), None)
    locks = LockSet()  # the state directories this daemon holds (journal's, outbox's), shared by its components
    mqtt: MqttComponent | None = None
    if config.mqtt.enabled:
        mqtt = MqttComponent(config.mqtt, node, detector, mode=config.mode, broker_problem=broker_problem, locks=locks)
        daemon.hub.subscribe(mqtt.findings)
        daemon.add_metrics(PublisherMetrics(mqtt.publisher.stats, mqtt.findings.emitted))
        daemon.add_loop("mqtt", mqtt.run, restart=True)  # its state is in the outbox, on disk
        daemon.on_close(mqtt.close)
        daemon.on_reload(mqtt.reload)
    elif broker_problem is not None:
        log.warning("%s; ignored while [mqtt] enabled = false (fix it before enabling MQTT)", broker_problem)
    actuator = ActuatorComponent(daemon, mqtt=mqtt, locks=locks, wall=daemon.wall, clock=daemon.clock)
    slurm: SlurmComponent | None = None
    if config.slurm.enabled:
        if daemon.sim_spec is not None and daemon.sim_workload:
            log.info("simulated node with [slurm] enabled: no demo workload, the node runs Slurm's jobs")
            daemon.sim_workload = False

        def simulated() -> bool:  # asked when the actuator is built, once the backend is open
            return daemon.backend is not None and daemon.backend.simulated

        slurm = SlurmComponent(daemon, actuator, mqtt=mqtt, simulated=simulated, wall=daemon.wall, clock=daemon.clock)
    listener = command_listener(config, node, actuator.dispatch)
    serving = listener
    if listener is not None:
        if mqtt is not None and mqtt.publisher.off is not None:
            daemon.add_loop("mqtt-commands", _commands_once_on(daemon, mqtt, node, actuator.dispatch), restart=True)
            serving = None  # another listener is made once the broker address is fixed
        else:
            daemon.add_loop("mqtt-commands", listener.run, restart=True)
    daemon.add_metrics(
        LossMetrics(
            publisher=mqtt.publisher.stats if mqtt is not None else None,
            commands=serving.stats if serving is not None else None,
            unknown_ranks=actuator.unknown_rank_count,
        )
    )
    return Components(detector, mqtt, actuator, listener, slurm)


def _commands_once_on(
    daemon: WiredDaemon, mqtt: MqttComponent, node: str, dispatch: Dispatch
) -> Callable[[], Coroutine[Any, Any, None]]:
    """The command listener of a daemon that started with a malformed ``mqtt.broker``: it waits until a reload
    fixed the address (the publisher is on), then listens with the reloaded configuration."""

    async def run() -> None:
        await mqtt.publisher.wait_on()
        try:
            listener = command_listener(daemon.config, node, dispatch)
        except ConfigError as exc:  # the reload validated the file; settings it cannot express stay off
            log.error("MQTT commands stay off: %s", exc)
            listener = None
        if listener is None:
            await asyncio.Event().wait()
            return
        await listener.run()

    return run
