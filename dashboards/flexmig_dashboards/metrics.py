"""Every metric the dashboards and alert rules query, in one place, with who exports it and since when.

The dashboards and rules never spell a metric name that is not listed here (a test parses every expression and
checks). flexmigd's own entries take their kind, labels and meaning from the daemon's metric catalogue
(``flexmig.metrics.families``, the one place its families are declared), so a dashboard cannot read a name the
daemon does not have; this list only says which of them the dashboards read and, in ``condition``, when the series
carry samples at all (a family can be exported and still have no series: host CPU exists only for processes the
host can see). ``exported`` says whether its source exports it today: a metric marked ``exported=False`` would be
one a dashboard expects before its source exports it (its panels show "No data" and the integration test says
which metric it waits for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flexmig.metrics import families as catalogue

__all__ = ["METRICS", "Kind", "MetricDef", "Source", "by_sample_name", "planned", "sample_names"]

Kind = Literal["gauge", "counter", "info", "histogram"]
Source = Literal["flexmigd", "actuator", "dcgm-exporter", "prometheus"]

_DCGM = "gpu, UUID, pci_bus_id, device, modelName, GPU_I_ID, GPU_I_PROFILE, Hostname (hostname from 4.8.3)"


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One metric: its family name (as in ``# TYPE``), kind, labels, source and whether it is exported now."""

    family: str
    kind: Kind
    labels: str
    doc: str
    source: Source = "flexmigd"
    exported: bool = True
    condition: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        """The sample names PromQL uses for this family (``_total`` for counters, ``_info``, histogram parts)."""
        if self.kind == "counter":
            return (f"{self.family}_total",)
        if self.kind == "info":
            return (f"{self.family}_info",)
        if self.kind == "histogram":
            return (f"{self.family}_bucket", f"{self.family}_sum", f"{self.family}_count")
        return (self.family,)


def _ours(family: str, *, source: Source = "flexmigd", condition: str = "") -> MetricDef:
    """flexmigd's family ``family`` as its catalogue declares it (KeyError if flexmigd has no such family)."""
    f = catalogue.by_name(family)
    labels = ", ".join((*f.labels, *f.info_labels)) or "(target labels only)"
    return MetricDef(f.name, f.kind, labels, f.help, source, True, condition or f.when)


def _theirs(family: str, doc: str, source: Source, labels: str = _DCGM) -> MetricDef:
    return MetricDef(family, "gauge", labels, doc, source)


_HOST_PROCS = "the instance runs processes the host can see (psutil); the simulator's workload pids are not real"
_ACT: Source = "actuator"

METRICS: tuple[MetricDef, ...] = (
    # ------------------------------------------------------------------ flexmigd: node and sampling cost
    *(
        _ours(name)
        for name in (
            "flexmig_node",
            "flexmig_sweeps",
            "flexmig_sweep_duration_seconds",
            "flexmig_last_sweep_cpu_seconds",
            "flexmig_sweep_cpu_seconds",
            "flexmig_inventories",
            "flexmig_last_sweep_timestamp_seconds",
            "flexmig_nvml_errors",
            "flexmig_source_errors",
            "flexmig_dcgm_up",
            "flexmig_dcgm_instances",
            "flexmig_dcgm_scrape_age_seconds",
            "flexmig_detect_duration_seconds",
            "flexmig_detect_failures",
            # GPUs
            "flexmig_gpu_power_watts",
            "flexmig_gpu_power_limit_watts",
            "flexmig_gpu_temperature_celsius",
            "flexmig_gpu_sm_clock_hertz",
            "flexmig_gpu_memory_clock_hertz",
            "flexmig_gpu_mig_mode",
            "flexmig_gpu_lost",
            "flexmig_gpu_mig_instances",
            "flexmig_gpu_free_compute_slices",
            "flexmig_gpu_free_memory_slices",
            "flexmig_gpu_creatable_instances",
            # fragmentation (detection)
            "flexmig_node_fragmentation_external_ratio",
            "flexmig_node_recoverable_compute_slices",
            "flexmig_node_creatable_instances",
            "flexmig_node_creatable_repacked_instances",
            "flexmig_gpu_fragmentation_external_ratio",
            "flexmig_gpu_stranded_compute_slices",
            "flexmig_gpu_recoverable_compute_slices",
            "flexmig_gpu_instance_changes",
            "flexmig_gpu_creatable_repacked_instances",
            "flexmig_gpu_stranded_instances",
            "flexmig_gpu_finding",
            "flexmig_gpu_finding_duration_seconds",
            # MIG instances
            "flexmig_mig_memory_total_bytes",
            "flexmig_mig_memory_used_bytes",
            "flexmig_mig_memory_used_mean_bytes",
            "flexmig_mig_memory_used_max_bytes",
            "flexmig_mig_memory_used_p95_bytes",
            "flexmig_mig_sm_active_ratio",
            "flexmig_mig_sm_active_mean_ratio",
            "flexmig_mig_sm_active_min_ratio",
            "flexmig_mig_sm_active_p95_ratio",
            "flexmig_mig_sm_occupancy_ratio",
            "flexmig_mig_dram_active_ratio",
            "flexmig_mig_tensor_active_ratio",
            "flexmig_mig_gr_engine_active_ratio",
            "flexmig_mig_activity_source",
            "flexmig_mig_processes",
            "flexmig_mig_idle_seconds",
            "flexmig_mig_memory_slices",
            "flexmig_mig_placement_start",
            "flexmig_mig_internal_fragmentation_compute_slices",
            "flexmig_mig_internal_fragmentation_memory_slices",
            "flexmig_mig_finding",
            "flexmig_mig_finding_duration_seconds",
            "flexmig_mig_suggested_profile",
            # the MQTT publisher
            "flexmig_mqtt_connected",
            "flexmig_mqtt_outbox_events",
            "flexmig_mqtt_events_emitted",
            "flexmig_mqtt_events_sent",
            "flexmig_mqtt_events_dropped",
            "flexmig_mqtt_connect_failures",
            # its own process
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        )
    ),
    _ours("flexmig_mig_processes_cpu_ratio", condition=_HOST_PROCS),
    _ours("flexmig_mig_processes_resident_memory_bytes", condition=_HOST_PROCS),
    # ------------------------------------------------------------------ actuator (flexmigd's actions and jobs)
    *(
        _ours(name, source=_ACT)
        for name in (
            "flexmig_actions",
            "flexmig_action_duration_seconds",
            "flexmig_job_downtime_seconds",
            "flexmig_actions_in_progress",
            "flexmig_jobs",
        )
    ),
    # ------------------------------------------------------------------ dcgm-exporter (overlays) and Prometheus
    _theirs("DCGM_FI_PROF_SM_ACTIVE", "SM active ratio (dcgm-exporter < 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_SM_UTIL_RATIO", "SM active ratio (dcgm-exporter >= 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_SM_OCCUPANCY", "SM occupancy (< 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "SM occupancy (>= 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_DRAM_ACTIVE", "DRAM active (< 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_DRAM_UTIL_RATIO", "DRAM active (>= 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor pipe active (< 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_TENSOR_UTIL_RATIO", "tensor pipe active (>= 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "graphics engine active (< 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "graphics engine active (>= 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_DEV_FB_USED", "framebuffer used, MiB (< 4.9)", "dcgm-exporter"),
    _theirs("DCGM_FI_DEV_FB_USED_BYTES", "framebuffer used, bytes (>= 4.9)", "dcgm-exporter"),
    _theirs("up", "1 if Prometheus's last scrape of the target worked", "prometheus", "job, instance"),
    _theirs("scrape_duration_seconds", "how long Prometheus's last scrape took", "prometheus", "job, instance"),
)


def by_sample_name() -> dict[str, MetricDef]:
    """Sample name (``flexmig_sweeps_total``) -> its definition."""
    return {name: m for m in METRICS for name in m.names}


def sample_names(*, exported: bool | None = None, source: Source | None = None) -> frozenset[str]:
    """Sample names, optionally only the exported (or planned) ones, optionally from one source."""
    return frozenset(
        name
        for m in METRICS
        if (exported is None or m.exported == exported) and (source is None or m.source == source)
        for name in m.names
    )


def planned() -> tuple[MetricDef, ...]:
    """The metrics the dashboards expect but nobody exports yet."""
    return tuple(m for m in METRICS if not m.exported)
