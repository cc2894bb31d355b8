"""The daemon's components, built in the order they start: :func:`wire` returns them; it changes nothing else.

The order (:class:`Components`, ``docs/architecture.md`` lists it), each a :class:`~flexmig.wiring.component.Component`:

=================  =========================================================================================
``nvml``           the node: NVML opened, or the simulated node installed under pynvml first
``detection``      detection's enricher on the hub (before the first sweep, so that sweep gets its report)
``mqtt``           the outbox, the publisher and its subscriber on the hub (``[mqtt] enabled``)
``sampling``       the sampling loop; its start is the first inventory and sweep
``dcgm``           the dcgm-exporter scrape (``[dcgm] enabled``)
``metrics``        the ``/metrics`` endpoint, with each component's families from its start (``[prometheus] enabled``)
``actuator``       the journal, the control socket and the planner
``slurm``          the Slurm agent, on the actuator (``[slurm] enabled``)
``mqtt-commands``  the MQTT command listener, forwarding to the actuator (``commands_enabled``)
``workload``       a simulated node's load: the demo's (not with ``--no-sim-workload`` or Slurm), the jobs' own
``watchdog``       systemd's watchdog, fed while sampling is healthy
=================  =========================================================================================

They start in this order and drain and close in the reverse one (the node closes last). The daemon
(:class:`flexmig.daemon.Daemon`) keeps what they share: the configuration, the snapshot hub, the NVML worker thread,
the heartbeat, the notifier, the count of restarts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flexmig.config import ConfigProblem, HostPort
from flexmig.metrics.runtime import TaskMetrics
from flexmig.mqtt.commands import command_listener
from flexmig.sdnotify import Heartbeat, Notifier
from flexmig.storage import LockSet
from flexmig.telemetry.dcgm import DcgmSource
from flexmig.telemetry.sampler import dcgm_loop
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.wiring.actuator import ActuatorComponent
from flexmig.wiring.actuator_host import ActuatorHost
from flexmig.wiring.backend import NodeComponent
from flexmig.wiring.commands import CommandsComponent
from flexmig.wiring.component import Component, Loop
from flexmig.wiring.detection import DetectionComponent, Detector, detect_settings
from flexmig.wiring.metrics_endpoint import MetricsEndpoint, MetricsRegistry
from flexmig.wiring.mqtt import FindingsPublisher, MqttComponent
from flexmig.wiring.sampling import SamplerComponent, demo_workload_loop, watchdog_loop
from flexmig.wiring.slurm import SlurmComponent

__all__ = [
    "ActuatorComponent",
    "Component",
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
    """What :func:`wire` built: :attr:`order`, the list the daemon walks, and the components by name for those who
    reach one (the tests, the demo workload's exclusions)."""

    order: tuple[Component, ...]
    node: NodeComponent
    detection: DetectionComponent
    sampler: SamplerComponent
    actuator: ActuatorComponent
    registry: MetricsRegistry
    """The families ``/metrics`` exports beside the snapshot's: the daemon's, then each component's as it starts."""
    mqtt: MqttComponent | None = None
    metrics: MetricsEndpoint | None = None
    slurm: SlurmComponent | None = None
    """The Slurm agent (``[slurm] enabled``): demand from Slurm, re-registrations in mode act."""
    commands: CommandsComponent | None = None
    """The MQTT command listener (``[mqtt] enabled`` and ``commands_enabled``), forwarding to the actuator."""
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(c.name for c in self.order))

    @property
    def detector(self) -> Detector:
        """Detection's state and settings."""
        return self.detection.detector

    def __iter__(self) -> Iterator[Component]:
        return iter(self.order)


class WiredDaemon(ActuatorHost, Protocol):
    """What :func:`wire` reads of a daemon (``flexmig.daemon.Daemon`` has it): the actuator's host, and what the
    other components share or are told at start."""

    deferred_problems: tuple[ConfigProblem, ...]
    """Problems of the keys the configuration left at their defaults (:func:`flexmig.config.load_config_deferring`)."""
    settings: TelemetrySettings
    heartbeat: Heartbeat
    notifier: Notifier
    restarts: Counter[str]
    clock: Callable[[], float]
    wall: Callable[[], float]
    metrics_addr: HostPort | None
    sim_spec: str | None
    sim_state: Path | None
    sim_workload: bool


def wire(daemon: WiredDaemon) -> Components:
    """The components of ``daemon``, in the order they start (see the module docstring), built and not started.

    Touches no file, socket or process: each component opens what it needs in its ``start`` (the outbox, the
    journal, the control socket, the metrics port), so a configuration that cannot run fails there, and
    :class:`flexmig.daemon.Daemon` closes what the components before it opened. The optional parts are built when
    their switch is on, and left out of the list when it is off."""
    config, settings = daemon.config, daemon.settings
    node_name = config.node(lambda: daemon.hostname)
    node = NodeComponent(
        daemon.worker,
        daemon.sim_spec,
        gpm=settings.gpm,
        clock=daemon.clock,
        sim_state=daemon.sim_state,
        sim_workload=_sim_workload(daemon),
    )
    detector = Detector(detect_settings(config.detect))
    detection = DetectionComponent(detector, daemon.hub)
    locks = LockSet()  # the state directories this daemon holds (journal's, outbox's), shared by its components
    mqtt = _mqtt(daemon, node_name, detector, locks)
    dcgm = _dcgm(daemon)
    sampler = SamplerComponent(
        node, daemon.worker, settings, daemon.hub, daemon.heartbeat, hostname=daemon.hostname, dcgm=dcgm,
        clock=daemon.clock,
    )  # fmt: skip
    actuator = ActuatorComponent(daemon, node, mqtt=mqtt, locks=locks, wall=daemon.wall, clock=daemon.clock)
    slurm = _slurm(daemon, node, actuator, mqtt)
    listener = None if mqtt is None else command_listener(config, node_name, actuator.dispatch)
    commands = None
    if mqtt is not None and listener is not None:
        commands = CommandsComponent(listener, config, node_name, actuator.dispatch, mqtt)
    registry = MetricsRegistry()
    registry.register("daemon", (TaskMetrics(daemon.restarts),))  # the daemon's own families come first
    endpoint = None
    if daemon.metrics_addr is not None:
        endpoint = MetricsEndpoint(daemon.metrics_addr, daemon.hub.latest, registry, detail=config.prometheus.detail)
    parts: tuple[Component | None, ...] = (
        node, detection, mqtt, sampler, _dcgm_loop(dcgm, settings), endpoint, actuator, slurm, commands,
        _workload(daemon, node, actuator),
        Loop("watchdog", lambda: watchdog_loop(daemon.notifier, daemon.heartbeat, config.sampling.stall_s)),
    )  # fmt: skip
    order = tuple(part for part in parts if part is not None)
    return Components(order, node, detection, sampler, actuator, registry, mqtt, endpoint, slurm, commands)


def _sim_workload(daemon: WiredDaemon) -> bool:
    """Whether a simulated node runs the demo's workload (not with Slurm: the node runs Slurm's jobs)."""
    if daemon.config.slurm.enabled and daemon.sim_spec is not None and daemon.sim_workload:
        log.info("simulated node with [slurm] enabled: no demo workload, the node runs Slurm's jobs")
        return False
    return daemon.sim_workload


def _mqtt(daemon: WiredDaemon, node_name: str, detector: Detector, locks: LockSet) -> MqttComponent | None:
    """The MQTT component (``[mqtt] enabled``); a malformed broker address left at its default is reported."""
    config = daemon.config
    broker_problem = next((str(p) for p in daemon.deferred_problems if p.key == "mqtt.broker"), None)
    if config.mqtt.enabled:
        return MqttComponent(
            config.mqtt, node_name, detector, daemon.hub, mode=config.mode, broker_problem=broker_problem, locks=locks
        )
    if broker_problem is not None:
        log.warning("%s; ignored while [mqtt] enabled = false (fix it before enabling MQTT)", broker_problem)
    return None


def _dcgm(daemon: WiredDaemon) -> DcgmSource | None:
    """dcgm-exporter's scrape source (``[dcgm] enabled``)."""
    s = daemon.settings
    if s.dcgm_url is None:
        return None
    return DcgmSource(s.dcgm_url, timeout_s=s.dcgm_timeout_s, max_age_s=s.dcgm_max_age_s, clock=daemon.clock)


def _dcgm_loop(dcgm: DcgmSource | None, settings: TelemetrySettings) -> Component | None:
    """The loop that scrapes ``dcgm`` (restarted after a failure)."""
    if dcgm is None:
        return None
    return Loop("dcgm", lambda: dcgm_loop(dcgm, settings.dcgm_interval_s), restart=True)


def _slurm(
    daemon: WiredDaemon, node: NodeComponent, actuator: ActuatorComponent, mqtt: MqttComponent | None
) -> SlurmComponent | None:
    """The Slurm agent on the actuator (``[slurm] enabled``)."""
    if not daemon.config.slurm.enabled:
        return None
    simulated = lambda: node.backend is not None and node.backend.simulated  # noqa: E731 - asked once it is open
    slurm = SlurmComponent(daemon, actuator, mqtt=mqtt, simulated=simulated, wall=daemon.wall, clock=daemon.clock)
    actuator.on_built(slurm.attach)
    return slurm


def _workload(daemon: WiredDaemon, node: NodeComponent, actuator: ActuatorComponent) -> Component | None:
    """A simulated node's load: the demo's synthetic one (unless turned off) and the jobs' own footprint."""
    if daemon.sim_spec is None:
        return None
    exclude = lambda: actuator.workload_exclude  # noqa: E731 - read at each step, on the NVML thread
    interval_s = daemon.settings.interval_s
    return Loop(
        "workload",
        lambda: demo_workload_loop(node, daemon.worker, exclude, interval_s, daemon.clock),
        restart=True,
    )
