"""Every metric the dashboards and alert rules query, in one place, with who exports it and since when.

The dashboards and rules never spell a metric name that is not listed here (a test parses every expression and
checks). ``exported`` says whether its source exports it today: flexmigd's families are the ones in the metric
reference of docs/metrics.md (``daemon/flexmig/export/prometheus.py``, ``findings_metrics.py`` and, for the
actuator's actions and jobs, ``action_metrics.py``). A metric marked ``exported=False`` would be one a dashboard
expects before its source exports it (its panels show "No data" and the integration test says which metric it waits
for).

``condition`` names what must be true for the series to carry samples at all (a family can be exported and
still have no series: host CPU exists only for processes the host can see).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["METRICS", "Kind", "MetricDef", "Source", "by_sample_name", "planned", "sample_names"]

Kind = Literal["gauge", "counter", "info", "histogram"]
Source = Literal["flexmigd", "actuator", "dcgm-exporter", "prometheus"]

_INSTANCE = "gpu, UUID, model_name, Hostname, GPU_I_ID, GPU_I_PROFILE, GPU_CI_ID, mig_uuid"
_GPU = "gpu, UUID, model_name, Hostname"
_DCGM = "gpu, UUID, modelName, GPU_I_ID, GPU_I_PROFILE, Hostname (hostname from 4.8.3)"


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


def _g(
    family: str, labels: str, doc: str, *, source: Source = "flexmigd", exported: bool = True, condition: str = ""
) -> MetricDef:
    return MetricDef(family, "gauge", labels, doc, source, exported, condition)


def _c(
    family: str, labels: str, doc: str, *, source: Source = "flexmigd", exported: bool = True, condition: str = ""
) -> MetricDef:
    return MetricDef(family, "counter", labels, doc, source, exported, condition)


_HOST_PROCS = "the instance runs processes the host can see (psutil); the simulator's workload pids are not real"
_MQTT = "[mqtt] enabled = true"
_DCGM_ON = "[dcgm] enabled = true"
_DETECT = "detection has judged the node (from the first sweeps on)"

METRICS: tuple[MetricDef, ...] = (
    # ------------------------------------------------------------------ flexmigd: node and sampling cost
    MetricDef("flexmig_node", "info", "Hostname, version, driver_version, nvml_version", "what runs on the node"),
    _c("flexmig_sweeps", "Hostname", "sampling sweeps since start"),
    _g("flexmig_sweep_duration_seconds", "Hostname", "wall time of the last sweep"),
    _g("flexmig_sweep_cpu_seconds", "Hostname", "CPU time of the last sweep"),
    _c("flexmig_sweep_cpu_seconds", "Hostname", "CPU time spent sampling since start"),
    _c("flexmig_inventories", "Hostname", "full NVML inventories (start-up and after every MIG change)"),
    _g("flexmig_last_sweep_timestamp_seconds", "Hostname", "Unix time of the sweep the figures come from"),
    _c("flexmig_nvml_errors", "Hostname, call, error", "failed NVML calls", condition="an NVML call failed"),
    _c("flexmig_source_errors", "Hostname, source", "failed reads of a telemetry source"),
    _g("flexmig_dcgm_up", "Hostname, url", "1 if the last dcgm-exporter scrape worked", condition=_DCGM_ON),
    _g(
        "flexmig_dcgm_instances", "Hostname, era", "instances in the last good dcgm-exporter scrape", condition=_DCGM_ON
    ),
    _g("flexmig_dcgm_scrape_age_seconds", "Hostname", "age of the last good dcgm scrape", condition=_DCGM_ON),
    _g("flexmig_detect_duration_seconds", "Hostname", "wall time of the last detection step", condition=_DETECT),
    _c("flexmig_detect_failures", "Hostname", "detection steps that failed", condition=_DETECT),
    # ------------------------------------------------------------------ flexmigd: GPUs
    _g("flexmig_gpu_power_watts", _GPU, "power draw"),
    _g("flexmig_gpu_temperature_celsius", _GPU, "core temperature"),
    _g("flexmig_gpu_sm_clock_hertz", _GPU, "SM clock"),
    _g("flexmig_gpu_memory_clock_hertz", _GPU, "memory clock"),
    _g("flexmig_gpu_mig_mode", _GPU, "1 MIG enabled, 0 disabled"),
    _g("flexmig_gpu_lost", _GPU, "1 after GPU_IS_LOST"),
    _g("flexmig_gpu_mig_instances", _GPU, "MIG instances on the GPU"),
    _g("flexmig_gpu_free_compute_slices", _GPU, "compute slices no instance holds"),
    _g("flexmig_gpu_free_memory_slices", _GPU, "memory slices no instance holds"),
    _g("flexmig_gpu_creatable_instances", f"{_GPU}, profile", "instances of the profile creatable now"),
    # ------------------------------------------------------------------ flexmigd: fragmentation (detection)
    _g("flexmig_node_fragmentation_external_ratio", "Hostname", "node external fragmentation 0-1", condition=_DETECT),
    _g("flexmig_node_stranded_compute_slices", "Hostname", "slices repacking would free", condition=_DETECT),
    _g("flexmig_node_stranded_ratio", "Hostname", "stranded over all compute slices", condition=_DETECT),
    _g("flexmig_gpu_fragmentation_external_ratio", _GPU, "GPU external fragmentation 0-1", condition=_DETECT),
    _g("flexmig_gpu_fragmentation_external_slices", _GPU, "F_g(M) of the GPU", condition=_DETECT),
    _g("flexmig_gpu_stranded_compute_slices", _GPU, "compute slices repacking would free", condition=_DETECT),
    _g(
        "flexmig_gpu_creatable_repacked_instances",
        f"{_GPU}, profile",
        "instances of the profile creatable if repacked",
        condition=_DETECT,
    ),
    _g("flexmig_gpu_stranded_instances", f"{_GPU}, profile", "repacked minus now", condition=_DETECT),
    _g("flexmig_gpu_finding", f"{_GPU}, finding", "1 while fragmentation is active", condition=_DETECT),
    _g(
        "flexmig_gpu_finding_duration_seconds",
        f"{_GPU}, finding",
        "how long the GPU finding has lasted",
        condition="a GPU finding is active",
    ),
    # ------------------------------------------------------------------ flexmigd: MIG instances
    _g("flexmig_mig_memory_total_bytes", _INSTANCE, "memory of the instance"),
    _g("flexmig_mig_memory_used_bytes", _INSTANCE, "memory used now"),
    _g("flexmig_mig_memory_used_mean_bytes", _INSTANCE, "mean memory used over the window"),
    _g("flexmig_mig_memory_used_max_bytes", _INSTANCE, "most memory used over the window"),
    _g("flexmig_mig_memory_used_p95_bytes", _INSTANCE, "p95 memory used over the window"),
    _g("flexmig_mig_sm_active_ratio", _INSTANCE, "SM activity (GPM or DCGM)"),
    _g("flexmig_mig_sm_active_mean_ratio", _INSTANCE, "mean SM activity over the window"),
    _g("flexmig_mig_sm_active_min_ratio", _INSTANCE, "lowest SM activity over the window"),
    _g("flexmig_mig_sm_active_p95_ratio", _INSTANCE, "p95 SM activity over the window"),
    _g("flexmig_mig_sm_occupancy_ratio", _INSTANCE, "resident warps over the maximum"),
    _g("flexmig_mig_dram_active_ratio", _INSTANCE, "memory interface busy"),
    _g("flexmig_mig_tensor_active_ratio", _INSTANCE, "tensor pipes busy"),
    _g("flexmig_mig_gr_engine_active_ratio", _INSTANCE, "graphics/compute engine busy", condition=_DCGM_ON),
    MetricDef("flexmig_mig_activity_source", "info", f"{_INSTANCE}, source", "gpm or dcgm"),
    _g("flexmig_mig_processes", _INSTANCE, "compute processes on the instance"),
    _g("flexmig_mig_processes_cpu_ratio", _INSTANCE, "host CPU of the processes, cores", condition=_HOST_PROCS),
    _g("flexmig_mig_processes_resident_memory_bytes", _INSTANCE, "host RSS of the processes", condition=_HOST_PROCS),
    _g("flexmig_mig_idle_seconds", _INSTANCE, "time since the instance last had a process or activity"),
    _g("flexmig_mig_compute_slices", _INSTANCE, "compute slices of the profile"),
    _g("flexmig_mig_memory_slices", _INSTANCE, "memory slices of the placement"),
    _g("flexmig_mig_placement_start", _INSTANCE, "first memory slice of the placement"),
    _g(
        "flexmig_mig_internal_fragmentation_compute_slices",
        _INSTANCE,
        "compute slices held beyond use",
        condition=_DETECT,
    ),
    _g(
        "flexmig_mig_internal_fragmentation_memory_slices",
        _INSTANCE,
        "memory slices held beyond use",
        condition=_DETECT,
    ),
    _g("flexmig_mig_finding", f"{_INSTANCE}, finding", "1 while idle/underused/oversized", condition=_DETECT),
    _g(
        "flexmig_mig_finding_duration_seconds",
        f"{_INSTANCE}, finding",
        "how long the finding has lasted",
        condition="an instance finding is active",
    ),
    MetricDef(
        "flexmig_mig_suggested_profile",
        "info",
        f"{_INSTANCE}, suggested_profile",
        "smaller profile an oversized job fits",
        condition="an oversized finding is active",
    ),
    # ------------------------------------------------------------------ flexmigd: MQTT publisher
    _g("flexmig_mqtt_connected", "Hostname", "1 while the MQTT session is up", condition=_MQTT),
    _g("flexmig_mqtt_outbox_events", "Hostname", "events waiting in the outbox", condition=_MQTT),
    _c("flexmig_mqtt_events_emitted", "Hostname, kind", "events handed to the publisher", condition=_MQTT),
    _c("flexmig_mqtt_events_sent", "Hostname", "events the broker acknowledged", condition=_MQTT),
    _c("flexmig_mqtt_events_dropped", "Hostname", "events the full outbox dropped", condition=_MQTT),
    _c("flexmig_mqtt_connect_failures", "Hostname", "failed connection attempts", condition=_MQTT),
    # ------------------------------------------------------------------ flexmigd: its own process
    _c("process_cpu_seconds", "(target labels only)", "CPU time of the flexmigd process"),
    _g("process_resident_memory_bytes", "(target labels only)", "RSS of the flexmigd process"),
    _g("process_open_fds", "(target labels only)", "open file descriptors of the flexmigd process"),
    _g("process_start_time_seconds", "(target labels only)", "Unix time the flexmigd process started"),
    # ------------------------------------------------------------------ actuator (flexmigd's actions and jobs)
    _c(
        "flexmig_actions",
        "Hostname, action, outcome",
        "actions finished; action = migrate|resplit|start|stop|create_instance|destroy_instance|restart, "
        "outcome = completed|failed|cancelled|skipped",
        source="actuator",
    ),
    MetricDef(
        "flexmig_action_duration_seconds",
        "histogram",
        "Hostname, action",
        "wall time of an action from its first journalled step to its last",
        source="actuator",
    ),
    MetricDef(
        "flexmig_job_downtime_seconds",
        "histogram",
        "Hostname, action",
        "time a job had no rank running during a migrate or resplit (old ranks stopped to new ranks started)",
        source="actuator",
    ),
    _g(
        "flexmig_actions_in_progress",
        "Hostname",
        "1 while an action is executing (actions run one at a time)",
        source="actuator",
    ),
    _g("flexmig_jobs", "Hostname, state", "registered jobs by state", source="actuator"),
    # ------------------------------------------------------------------ dcgm-exporter (overlays) and Prometheus
    _g("DCGM_FI_PROF_SM_ACTIVE", _DCGM, "SM active ratio (dcgm-exporter < 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_SM_UTIL_RATIO", _DCGM, "SM active ratio (dcgm-exporter >= 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_SM_OCCUPANCY", _DCGM, "SM occupancy (< 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", _DCGM, "SM occupancy (>= 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_DRAM_ACTIVE", _DCGM, "DRAM active (< 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_DRAM_UTIL_RATIO", _DCGM, "DRAM active (>= 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", _DCGM, "tensor pipe active (< 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_TENSOR_UTIL_RATIO", _DCGM, "tensor pipe active (>= 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_GR_ENGINE_ACTIVE", _DCGM, "graphics engine active (< 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", _DCGM, "graphics engine active (>= 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_DEV_FB_USED", _DCGM, "framebuffer used, MiB (< 4.9)", source="dcgm-exporter"),
    _g("DCGM_FI_DEV_FB_USED_BYTES", _DCGM, "framebuffer used, bytes (>= 4.9)", source="dcgm-exporter"),
    _g("up", "job, instance", "1 if Prometheus's last scrape of the target worked", source="prometheus"),
    _g("scrape_duration_seconds", "job, instance", "how long Prometheus's last scrape took", source="prometheus"),
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
