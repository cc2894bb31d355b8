"""The daemon's components, built in the order they start: :func:`wire` returns them; it changes nothing else.

The order (:class:`Components`, ``docs/architecture.md`` lists it), each a :class:`~flexmig.wiring.component.Component`:

=================  =========================================================================================
``nvml``           the node: NVML opened, or the simulated node installed under pynvml first
``detection``      detection's enricher on the hub (before the first sweep, so that sweep gets its report)
``mqtt``           the outbox, the publisher and its subscriber on the hub (``[mqtt] enabled``)
``sampling``       the sampling loop; its start is the first inventory and sweep
``dcgm``           the dcgm-exporter scrape (``[dcgm] enabled``)
``metrics``        the ``/metrics`` endpoint, with every component's families (``[prometheus] enabled``)
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flexmig.config import ConfigProblem, HostPort
from flexmig.metrics.collector import Extension
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
from flexmig.wiring.metrics_endpoint import MetricsEndpoint
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

    Raises ConfigError or OutboxError when MQTT cannot be set up (the outbox is opened here: the daemon refuses to
    start rather than lose events), StateInUseError when another daemon holds the outbox's directory."""
    config = daemon.config
    settings = daemon.settings
    hostname = daemon.hostname
    node_name = config.node(lambda: hostname)
    sim_workload = daemon.sim_workload
    if config.slurm.enabled and daemon.sim_spec is not None and sim_workload:
        log.info("simulated node with [slurm] enabled: no demo workload, the node runs Slurm's jobs")
        sim_workload = False
    node = NodeComponent(
        daemon.worker,
        daemon.sim_spec,
        gpm=settings.gpm,
        clock=daemon.clock,
        sim_state=daemon.sim_state,
        sim_workload=sim_workload,
    )
    detector = Detector(detect_settings(config.detect))
    detection = DetectionComponent(detector, daemon.hub)
    locks = LockSet()  # the state directories this daemon holds (journal's, outbox's), shared by its components
    broker_problem = next((str(p) for p in daemon.deferred_problems if p.key == "mqtt.broker"), None)
    mqtt: MqttComponent | None = None
    if config.mqtt.enabled:
        mqtt = MqttComponent(
            config.mqtt, node_name, detector, daemon.hub, mode=config.mode, broker_problem=broker_problem, locks=locks
        )
    elif broker_problem is not None:
        log.warning("%s; ignored while [mqtt] enabled = false (fix it before enabling MQTT)", broker_problem)
    dcgm = None
    if settings.dcgm_url is not None:
        dcgm = DcgmSource(
            settings.dcgm_url, timeout_s=settings.dcgm_timeout_s, max_age_s=settings.dcgm_max_age_s, clock=daemon.clock
        )
    sampler = SamplerComponent(
        node, daemon.worker, settings, daemon.hub, daemon.heartbeat, hostname=hostname, dcgm=dcgm, clock=daemon.clock
    )
    actuator = ActuatorComponent(daemon, node, mqtt=mqtt, locks=locks, wall=daemon.wall, clock=daemon.clock)
    slurm = None
    if config.slurm.enabled:
        simulated = lambda: node.backend is not None and node.backend.simulated  # noqa: E731 - asked once it is open
        slurm = SlurmComponent(
            daemon, actuator, mqtt=mqtt, simulated=simulated, wall=daemon.wall, clock=daemon.clock
        )
        actuator.on_built(slurm.attach)
    listener = command_listener(config, node_name, actuator.dispatch)
    commands = None if listener is None else CommandsComponent(listener, config, node_name, actuator.dispatch, mqtt)
    order: list[Component] = [node, detection, *_some(mqtt), sampler]
    if dcgm is not None:
        order.append(Loop("dcgm", lambda: dcgm_loop(dcgm, settings.dcgm_interval_s), restart=True))
    endpoint = None
    if daemon.metrics_addr is not None:
        endpoint = MetricsEndpoint(
            daemon.metrics_addr, daemon.hub.latest, lambda: _families(daemon, order), detail=config.prometheus.detail
        )
        order.append(endpoint)
    order += [actuator, *_some(slurm), *_some(commands)]
    if daemon.sim_spec is not None:  # the demo's synthetic load (unless turned off) and the jobs' own footprint
        exclude = lambda: actuator.workload_exclude  # noqa: E731 - read at each step, on the NVML thread
        order.append(
            Loop(
                "workload",
                lambda: demo_workload_loop(node, daemon.worker, exclude, settings.interval_s, daemon.clock),
                restart=True,
            )
        )
    order.append(Loop("watchdog", lambda: watchdog_loop(daemon.notifier, daemon.heartbeat, config.sampling.stall_s)))
    return Components(tuple(order), node, detection, sampler, actuator, mqtt, endpoint, slurm, commands)


def _some(component: Component | None) -> list[Component]:
    return [] if component is None else [component]


def _families(daemon: WiredDaemon, order: Sequence[Component]) -> list[Extension]:
    """What ``/metrics`` exports beside the snapshot's own families: the daemon's task restarts, then each
    component's families, in the components' order."""
    return [TaskMetrics(daemon.restarts), *(m for c in order for m in c.metrics())]

