"""A sampled node and every metrics extension flexmigd wires, in modes observe, advise and act (a test rig).

:func:`sampled_node` samples a simulated node through the daemon's own path (the real NVML code over the simulator,
the telemetry store, the detection enricher) and gives its snapshot a dcgm-exporter status and error counts;
:func:`extensions` are the families flexmigd adds in a mode (detection's, the MQTT publisher's, the actuator's, the
daemon's own health, and Slurm's on an acting Slurm node).
"""

from __future__ import annotations

import dataclasses

from flexmig.act.durable import Durable
from flexmig.config.schema import DCGM_EXPORTER_PORT
from flexmig.detect import DetectSettings
from flexmig.metrics.actions import ActionMetrics
from flexmig.metrics.collector import Extension
from flexmig.metrics.findings import FindingsMetrics, PublisherMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.metrics.runtime import JournalWriteMetrics, ServerMetrics, TaskMetrics
from flexmig.metrics.server import ServerStats
from flexmig.metrics.slurm import SlurmMetrics
from flexmig.nvml import GpmWindows, Nvml
from flexmig.service.detection import Detector
from flexmig.sim import install, uninstall
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import DcgmStatus, SamplingStats, Snapshot
from flexmig.telemetry.store import TelemetryStore
from support.event_samples import act_events, facts

__all__ = ["DEMO", "MODES", "extensions", "sampled_node"]

MODES = ("observe", "advise", "act")
DEMO = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"


@dataclasses.dataclass(frozen=True)
class Stats:
    connected: bool = True
    queued: int = 2
    sent_total: int = 40
    connect_failures_total: int = 1
    dropped_total: int = 0
    unsaved_dropped_total: int = 0
    outbox_corruptions_total: int = 0
    outbox_lost_total: int = 0


@dataclasses.dataclass(frozen=True)
class CommandStats:
    results_dropped: int = 0


def sampled_node(spec: str = DEMO, *, busy: int = 1) -> Snapshot:
    """Three sweeps a second apart of simulated node ``spec`` (its first ``busy`` instances running a process, the
    others idle) through the daemon's path: NVML inventory and sample with GPM windows, the telemetry store, the
    detection enricher."""
    clock = [100.0]
    node = install(spec, clock=lambda: clock[0])
    try:
        uuids = node.mig_uuids()
        for n, uuid in enumerate(uuids[:busy]):
            node.start_process(uuid, memory_bytes=(8 + n % 5) << 30)
            node.set_activity(uuid, sm=0.6, occupancy=0.3, tensor=0.2, dram=0.4)
        with Nvml.open() as nvml:
            gpm = GpmWindows(clock=lambda: clock[0])
            store = TelemetryStore(TelemetrySettings(), "node-1")
            detector = Detector(DetectSettings())
            snap = None
            for sweep in (1, 2, 3):
                clock[0] += 1.0
                store.set_inventory(nvml.inventory())
                stats = SamplingStats(
                    sweep, 0.01, 0.004, 0.008, 1, {("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED"): 2}, {"dcgm": 1}
                )
                samples = nvml.sample(gpm)
                snap = detector.enrich(store.build(samples, now=clock[0], wall=1e9 + clock[0], stats=stats))
            gpm.close()
    finally:
        uninstall()
    assert snap is not None
    return dataclasses.replace(
        snap, dcgm=DcgmStatus(f"http://127.0.0.1:{DCGM_EXPORTER_PORT}/metrics", True, "4.9", 6, 0.5)
    )


def actions(mode: str) -> ActionMetrics:
    """The actuator's families as a node in ``mode`` has them (every mode wires the actuator)."""
    m = ActionMetrics()
    m.set_jobs({"running": 1})
    if mode in ("advise", "act"):
        m.record_plan(["create_instance", "migrate"], 12.0)
        m.record_plan_failure()
    if mode == "act":
        for e in act_events():
            m.record(e, facts(e.action_id or 0).downtime_s if e.kind == "action_completed" else None)
    return m


def slurm() -> SlurmMetrics:
    """The Slurm agent's families as an acting Slurm node has them: a read, a decision, a hook job moved."""
    m = SlurmMetrics()
    m.queue_read(0.03)
    m.spacing(1.0)
    m.read_ok(pending=3, running=1, movable=1, in_sync=True, registered={"1g.18gb": 3, "4g.71gb": 1})
    m.decided("node1", drain_s=4.0, gain=5394.0, cost=12.0, go=True)
    for action in ("signalled", "requeued", "released"):
        m.job_action(action)
    m.drained(2.5)
    return m


def extensions(mode: str) -> list[Extension]:
    """The metrics extensions flexmigd wires in ``mode``."""
    out: list[Extension] = [
        FindingsMetrics(lambda: (0.002, 0)),
        PublisherMetrics(Stats, lambda: {"instance_created": 3}),
        actions(mode),
        LossMetrics(Stats, CommandStats, lambda: 0),
        TaskMetrics({"mqtt": 1} if mode == "act" else {}),
        ServerMetrics(lambda: ServerStats(limit=64, open=1, served=2)),
        JournalWriteMetrics(lambda: Durable("/var/lib/flexmig/journal.sqlite3") if mode == "act" else None),
    ]
    if mode == "act":  # a Slurm node ([slurm] enabled) acts
        out.append(slurm())
    return out
