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
``slurm``          the Slurm part, on the actuator (``[slurm] enabled``); its action runner is the actuator's
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from flexmig.config import Config, ConfigProblem, HostPort
from flexmig.metrics.runtime import TaskMetrics
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.mqtt.commands import command_listener
from flexmig.sdnotify import Heartbeat, Notifier
from flexmig.service.actuator_host import ActuatorHost
from flexmig.service.actuator_runtime import ActuatorRuntime
from flexmig.service.detection import Detector, detect_settings
from flexmig.service.slurm_agents import ActuatorView
from flexmig.service.slurm_rounds import SlurmRounds
from flexmig.slurm.change import KIND
from flexmig.storage import LockSet
from flexmig.telemetry.dcgm import DcgmSource
from flexmig.telemetry.sampler import dcgm_loop
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.wiring.actuator import ActuatorComponent
from flexmig.wiring.backend import NodeComponent
from flexmig.wiring.commands import CommandsComponent
from flexmig.wiring.component import Component, Loop, Off
from flexmig.wiring.detection import DetectionComponent
from flexmig.wiring.metrics_endpoint import MetricsEndpoint, MetricsRegistry
from flexmig.wiring.mqtt import MqttComponent
from flexmig.wiring.sampling import SamplerComponent, demo_workload_loop, watchdog_loop
from flexmig.wiring.slurm import SlurmComponent

__all__ = [
    "SWITCHES",
    "ActuatorComponent",
    "Component",
    "Components",
    "Detector",
    "MqttComponent",
    "SlurmComponent",
    "WiredDaemon",
    "detect_settings",
    "wire",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Components:
    """What :func:`wire` built: every part, in the order they start (an optional part that is off an
    :class:`~flexmig.wiring.component.Off`), :attr:`order`, the list the daemon walks (the parts that are on), and
    the components by name for those who reach one (the tests, the demo workload's exclusions)."""

    parts: tuple[Component, ...]
    node: NodeComponent
    detection: DetectionComponent
    sampler: SamplerComponent
    actuator: ActuatorComponent
    registry: MetricsRegistry
    """The families ``/metrics`` exports beside the snapshot's: the daemon's, then each component's as it starts."""
    order: tuple[Component, ...] = field(init=False)
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        order = tuple(c for c in self.parts if not isinstance(c, Off))
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "names", tuple(c.name for c in order))

    def part(self, name: str) -> Component:
        """The part called ``name`` (an Off when its switch is off)."""
        return next(c for c in self.parts if c.name == name)

    @property
    def mqtt(self) -> MqttComponent | None:
        """The outbox and publisher (``[mqtt] enabled``), for the tests that look at them."""
        part = self.part("mqtt")
        return part if isinstance(part, MqttComponent) else None

    @property
    def metrics(self) -> MetricsEndpoint | None:
        """The ``/metrics`` endpoint (``[prometheus] enabled``)."""
        part = self.part("metrics")
        return part if isinstance(part, MetricsEndpoint) else None

    @property
    def slurm(self) -> SlurmComponent | None:
        """The Slurm agent (``[slurm] enabled``): demand from Slurm, re-registrations in mode act."""
        part = self.part("slurm")
        return part if isinstance(part, SlurmComponent) else None

    @property
    def commands(self) -> CommandsComponent | None:
        """The MQTT command listener (``[mqtt] enabled`` and ``commands_enabled``), forwarding to the actuator."""
        part = self.part("mqtt-commands")
        return part if isinstance(part, CommandsComponent) else None

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


#: The optional parts and the switch that turns each on (docs/architecture.md's "present when"). A part whose switch
#: is off is an :class:`~flexmig.wiring.component.Off` in :attr:`Components.parts`, left out of the order.
SWITCHES: Mapping[str, Callable[[WiredDaemon], bool]] = MappingProxyType(
    {
        "mqtt": lambda d: d.config.mqtt.enabled,
        "dcgm": lambda d: d.settings.dcgm_url is not None,
        "metrics": lambda d: d.metrics_addr is not None,
        "slurm": lambda d: d.config.slurm.enabled,
        "mqtt-commands": lambda d: d.config.mqtt.enabled and d.config.mqtt.commands_enabled,
        "workload": lambda d: d.sim_spec is not None,
    }
)


def wire(daemon: WiredDaemon) -> Components:
    """The components of ``daemon``, in the order they start (see the module docstring), built and not started.

    Touches no file, socket or process: each component opens what it needs in its ``start`` (the outbox, the
    journal, the control socket, the metrics port), so a configuration that cannot run fails there, and
    :class:`flexmig.daemon.Daemon` closes what the components before it opened. An optional part is built when
    its switch (:data:`SWITCHES`) is on, and is an :class:`~flexmig.wiring.component.Off` when it is off."""
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
    publisher = mqtt if isinstance(mqtt, MqttComponent) else None  # the actuator's and Slurm's event sink
    on = {name: switch(daemon) for name, switch in SWITCHES.items()}
    findings = None if publisher is None else publisher.findings
    runtime = ActuatorRuntime(daemon, findings=findings, locks=locks, wall=daemon.wall, clock=daemon.clock)
    slurm = _slurm(daemon, node, runtime, publisher) if on["slurm"] else None
    runners = {} if slurm is None else {KIND: slurm.run_action}  # on the executor before the journal's reconcile
    actuator = ActuatorComponent(runtime, node, runners=runners)
    registry = MetricsRegistry()
    registry.register("daemon", (TaskMetrics(daemon.restarts),))  # the daemon's own families come first
    parts: tuple[Component, ...] = (
        node, detection, mqtt, sampler,
        Loop("dcgm", lambda: dcgm_loop(dcgm, settings.dcgm_interval_s), restart=True) if dcgm else Off("dcgm"),
        _endpoint(daemon, registry) if on["metrics"] else Off("metrics"),
        actuator,
        SlurmComponent(slurm) if slurm is not None else Off("slurm"),
        _commands(config, node_name, runtime, publisher) if on["mqtt-commands"] else Off("mqtt-commands"),
        _workload(node, runtime, sampler) if on["workload"] else Off("workload"),
        Loop("watchdog", lambda: watchdog_loop(daemon.notifier, daemon.heartbeat, config.sampling.stall_s)),
    )  # fmt: skip
    return Components(parts, node, detection, sampler, actuator, registry)


def _sim_workload(daemon: WiredDaemon) -> bool:
    """Whether a simulated node runs the demo's workload (not with Slurm: the node runs Slurm's jobs)."""
    if daemon.config.slurm.enabled and daemon.sim_spec is not None and daemon.sim_workload:
        log.info("simulated node with [slurm] enabled: no demo workload, the node runs Slurm's jobs")
        return False
    return daemon.sim_workload


def _mqtt(daemon: WiredDaemon, node_name: str, detector: Detector, locks: LockSet) -> MqttComponent | Off:
    """The MQTT component (``[mqtt] enabled``); a malformed broker address left at its default is reported."""
    config = daemon.config
    broker_problem = next((str(p) for p in daemon.deferred_problems if p.key == "mqtt.broker"), None)
    if SWITCHES["mqtt"](daemon):
        return MqttComponent(
            config.mqtt, node_name, detector, daemon.hub, mode=config.mode, broker_problem=broker_problem, locks=locks
        )
    if broker_problem is not None:
        log.warning("%s; ignored while [mqtt] enabled = false (fix it before enabling MQTT)", broker_problem)
    return Off("mqtt")


def _dcgm(daemon: WiredDaemon) -> DcgmSource | None:
    """dcgm-exporter's scrape source (``[dcgm] enabled``)."""
    s = daemon.settings
    if s.dcgm_url is None:
        return None
    return DcgmSource(s.dcgm_url, timeout_s=s.dcgm_timeout_s, max_age_s=s.dcgm_max_age_s, clock=daemon.clock)


def _endpoint(daemon: WiredDaemon, registry: MetricsRegistry) -> MetricsEndpoint:
    """``/metrics`` on the daemon's metrics address, with the registry's families."""
    assert daemon.metrics_addr is not None  # its switch is on
    return MetricsEndpoint(daemon.metrics_addr, daemon.hub.latest, registry, detail=daemon.config.prometheus.detail)


def _commands(
    config: Config, node_name: str, runtime: ActuatorRuntime, mqtt: MqttComponent | None
) -> CommandsComponent:
    """The MQTT command listener (``commands_enabled``, on the MQTT component); ConfigError when the configuration
    cannot make one (credentials, TLS)."""
    listener = command_listener(config, node_name, runtime.dispatch)
    assert mqtt is not None and listener is not None  # its switch is on: so is MQTT's
    return CommandsComponent(listener, config, node_name, runtime.dispatch, mqtt)


def _slurm(daemon: WiredDaemon, node: NodeComponent, actuator: ActuatorView, mqtt: MqttComponent | None) -> SlurmRounds:
    """The Slurm part (``[slurm] enabled``), on the actuator ``actuator`` holds once its component started."""
    simulated = lambda: node.backend is not None and node.backend.simulated  # noqa: E731 - asked once it is open
    return SlurmRounds(
        daemon, actuator, slurm_metrics=SlurmMetrics(), mqtt=mqtt, simulated=simulated, wall=daemon.wall,
        clock=daemon.clock,
    )  # fmt: skip


def _workload(node: NodeComponent, runtime: ActuatorRuntime, sampler: SamplerComponent) -> Component:
    """A simulated node's load: the demo's synthetic one (unless turned off) and the jobs' own footprint, stepped by
    the sampler before each sweep's reads."""
    exclude = lambda: runtime.workload_exclude  # noqa: E731 - read at each step, on the NVML thread
    return Loop(
        "workload",
        lambda: demo_workload_loop(node, sampler, exclude),
        restart=True,
    )
