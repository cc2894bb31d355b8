"""Every metric family flexmigd exports, declared once: name, type, labels, help text and when it has series.

The collectors (``metrics.collector``, ``metrics.findings``, ``metrics.actions``) build each family
from its entry here, the metric reference of docs/metrics.md is generated from these entries
(``python -m flexmig.metrics.reference --markdown``), and tests hold the live exposition of every mode to them in
both directions, so code, exposition and documentation cannot drift apart.

Every family has a *detail* level (:data:`LEVELS`): ``minimal``, ``standard`` (the default, ``[prometheus]
detail``) or ``full``; a node exports the families of its level and the levels below it (the per-instance and
per-GPU ones are what the levels trade: :func:`budget_table` counts the series each level costs).

Identity labels follow dcgm-exporter, so our series join its ``DCGM_FI_*`` series: per GPU ``gpu`` (NVML index),
``UUID`` (the GPU's), ``pci_bus_id`` (``00000000:18:00.0``), ``device`` (``nvidia0``), ``model_name`` and
``Hostname``; per MIG instance also ``GPU_I_ID``, ``GPU_I_PROFILE``, ``GPU_CI_ID`` (the compute instance, which
dcgm-exporter lacks) and ``mig_uuid`` (what ``CUDA_VISIBLE_DEVICES`` takes). The model is ``model_name``, not
dcgm-exporter's ``modelName``: ``promtool check metrics`` rejects camelCase label names, and the model is never a
join key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from flexmig.metrics.family import (
    GPU_LABELS,
    INSTANCE_LABELS,
    LEVELS,
    NODE_LABELS,
    Family,
    FamilyKind,
    Level,
)
from flexmig.metrics.family import counter as _c
from flexmig.metrics.family import gauge as _g

__all__ = [
    "FAMILIES",
    "GPU_LABELS",
    "INSTANCE_LABELS",
    "LEVELS",
    "NODE_LABELS",
    "ZEROS_FROM",
    "Family",
    "FamilyKind",
    "Level",
    "by_name",
    "sample_names",
]

_MQTT = "with `[mqtt] enabled = true`"
_DCGM = "with `[dcgm] enabled = true`"
_DETECT = "once detection has judged the node (from the first sweep on)"
_HOST = "for processes the host can see (psutil)"
_SLURM = "with `[slurm] enabled = true`"
_SLURM_READ = "with `[slurm] enabled = true`, once Slurm was read"


_N, _G, _I = NODE_LABELS, GPU_LABELS, INSTANCE_LABELS

FAMILIES: tuple[Family, ...] = (
    # ------------------------------------------------------------------ the node and the daemon's own sampling
    Family(
        "flexmig_node",
        "info",
        _N,
        "The node flexmig runs on: versions of flexmig, the driver and NVML.",
        info_labels=("version", "driver_version", "nvml_version"),
    ),
    _c("flexmig_sweeps", _N, "Sampling sweeps completed since start."),
    _g("flexmig_sweep_duration_seconds", _N, "Wall time of the last sampling sweep."),
    _g("flexmig_last_sweep_cpu_seconds", _N, "CPU time of the last sampling sweep (NVML thread and loop)."),
    _c("flexmig_sweep_cpu_seconds", _N, "CPU time spent in sampling sweeps since start."),
    _c("flexmig_inventories", _N, "Full NVML inventories taken (start-up and after every MIG change)."),
    _g("flexmig_last_sweep_timestamp_seconds", _N, "Unix time of the sweep these figures come from."),
    _g("flexmig_window_seconds", _N, "Length of the window the *_mean/_min/_max/_p95 series cover."),
    _c(
        "flexmig_nvml_errors",
        (*_N, "call", "error"),
        "NVML calls that failed, by call and NVML error name (nvmlDeviceGetPowerUsage, NOT_SUPPORTED).",
        "once an NVML call failed",
    ),
    _c(
        "flexmig_source_errors",
        (*_N, "source"),
        "Failed reads of a telemetry source: nvml (a whole sweep), dcgm, host, sweep (a bug, logged).",
        "once a read failed",
    ),
    _g("flexmig_dcgm_up", (*_N, "url"), "1 if the last dcgm-exporter scrape succeeded, else 0.", _DCGM),
    _g(
        "flexmig_dcgm_instances",
        (*_N, "era"),
        "MIG instances in the last good dcgm-exporter scrape; era is legacy or 4.9 (its field names).",
        _DCGM,
    ),
    _g("flexmig_dcgm_scrape_age_seconds", _N, "Age of the last good dcgm-exporter scrape.", _DCGM),
    # ------------------------------------------------------------------ GPUs
    _g("flexmig_gpu_power_watts", _G, "Power draw of the GPU (nvidia-smi -q -d POWER)."),
    _g(
        "flexmig_gpu_power_limit_watts",
        _G,
        "Enforced power limit of the GPU (nvidia-smi --query-gpu=enforced.power.limit), read at each inventory.",
    ),
    _g("flexmig_gpu_temperature_celsius", _G, "GPU core temperature."),
    _g("flexmig_gpu_sm_clock_hertz", _G, "Current SM clock."),
    _g("flexmig_gpu_memory_clock_hertz", _G, "Current memory clock."),
    _g("flexmig_gpu_memory_total_bytes", _G, "Total memory of the GPU."),
    _g("flexmig_gpu_mig_mode", _G, "1 if MIG mode is enabled on the GPU, 0 if disabled.", "on GPUs with MIG"),
    _g("flexmig_gpu_lost", _G, "1 if NVML reported the GPU lost (fell off the bus), else 0."),
    _g("flexmig_gpu_mig_instances", _G, "MIG instances (GI/CI pairs) on the GPU."),
    _g("flexmig_gpu_free_compute_slices", _G, "Compute slices (of 7) held by no instance.", "on MIG GPUs"),
    _g("flexmig_gpu_free_memory_slices", _G, "Memory slices (of 8) held by no instance.", "on MIG GPUs"),
    _g(
        "flexmig_gpu_creatable_instances",
        (*_G, "profile"),
        "How many instances of this profile alone could still be created on the GPU now.",
        "on MIG GPUs",
    ),
    # ------------------------------------------------------------------ MIG instances
    _g("flexmig_mig_memory_total_bytes", _I, "Memory of the MIG instance."),
    _g(
        "flexmig_mig_memory_used_bytes",
        _I,
        "Memory used on the MIG instance (NVML, or DCGM's framebuffer when NVML will not say).",
    ),
    _g("flexmig_mig_memory_used_mean_bytes", _I, "Mean memory used over the window."),
    _g("flexmig_mig_memory_used_max_bytes", _I, "Most memory used over the window."),
    _g("flexmig_mig_memory_used_p95_bytes", _I, "95th percentile of memory used over the window."),
    _g("flexmig_mig_sm_active_ratio", _I, "Fraction of cycles an SM of the instance had a warp (GPM/DCGM)."),
    _g("flexmig_mig_sm_active_mean_ratio", _I, "Mean SM activity over the window."),
    _g("flexmig_mig_sm_active_min_ratio", _I, "Lowest SM activity over the window."),
    _g("flexmig_mig_sm_active_p95_ratio", _I, "95th percentile of SM activity over the window."),
    _g("flexmig_mig_sm_occupancy_ratio", _I, "Resident warps as a fraction of the maximum (GPM/DCGM)."),
    _g("flexmig_mig_dram_active_ratio", _I, "Fraction of cycles the memory interface was busy."),
    _g("flexmig_mig_tensor_active_ratio", _I, "Fraction of cycles a tensor pipe was busy."),
    _g(
        "flexmig_mig_gr_engine_active_ratio",
        _I,
        "Fraction of time the graphics/compute engine was busy (DCGM).",
        _DCGM,
    ),
    Family(
        "flexmig_mig_activity_source",
        "info",
        _I,
        "Where the activity figures come from: gpm or dcgm.",
        "once an activity source reported",
        info_labels=("source",),
    ),
    _g("flexmig_mig_processes", _I, "Compute processes running on the MIG instance."),
    _g(
        "flexmig_mig_processes_cpu_ratio",
        _I,
        "CPU use of the instance's processes, summed, in cores (1 = one core).",
        _HOST,
    ),
    _g("flexmig_mig_processes_resident_memory_bytes", _I, "Host resident memory of the instance's processes.", _HOST),
    _g("flexmig_mig_idle_seconds", _I, "Time since the instance last had a process or SM activity above 1%."),
    _g("flexmig_mig_compute_slices", _I, "Compute slices the instance's profile holds."),
    _g("flexmig_mig_memory_slices", _I, "Memory slices the instance's placement holds."),
    _g("flexmig_mig_placement_start", _I, "First memory slice of the instance's placement (0-7)."),
    # ------------------------------------------------------------------ detection: fragmentation and findings
    _g("flexmig_detect_duration_seconds", _N, "Wall time of the last detection step.", _DETECT),
    _c("flexmig_detect_failures", _N, "Detection steps that failed (a bug; logged) since start."),
    _g(
        "flexmig_node_fragmentation_external_ratio",
        _N,
        "Demand-weighted external fragmentation of the node's MIG GPUs, 0-1: sum of F_g(M) over sum of free "
        "compute slices.",
        _DETECT,
    ),
    _g(
        "flexmig_node_fragmentation_external_slices",
        _N,
        "Free compute slices the demand mix cannot use, summed over MIG GPUs (sum of F_g(M)).",
        _DETECT,
    ),
    _g(
        "flexmig_node_stranded_compute_slices",
        _N,
        "Compute slices that repacking the running instances would make usable, summed over MIG GPUs.",
        _DETECT,
    ),
    _g(
        "flexmig_node_stranded_ratio",
        _N,
        "Stranded compute slices over all compute slices of the node's MIG GPUs, 0-1.",
        _DETECT,
    ),
    _g(
        "flexmig_node_recoverable_compute_slices",
        _N,
        "Recoverable compute slices summed over MIG GPUs: what repacking each GPU would make usable by a profile "
        "the demand mix asks for.",
        _DETECT,
    ),
    _g(
        "flexmig_node_creatable_instances",
        (*_N, "profile"),
        "Instances of this profile alone that could still be created now, summed over the node's MIG GPUs.",
        _DETECT,
    ),
    _g(
        "flexmig_node_creatable_repacked_instances",
        (*_N, "profile"),
        "Instances of this profile alone that could be created, summed over the node's MIG GPUs, if each GPU's "
        "running instances were packed tightly (minus the now figure: capacity stranded by placement).",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_fragmentation_external_ratio",
        _G,
        "Demand-weighted external fragmentation, 0-1: the chance a request from the demand mix finds no place "
        "although compute slices are free (0 when none is free).",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_fragmentation_external_slices",
        _G,
        "F_g(M): free compute slices weighted by the share of the demand mix that cannot use them.",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_stranded_compute_slices",
        _G,
        "Most compute slices that repacking the running instances would make usable by one profile.",
        _DETECT,
    ),
    _g("flexmig_gpu_stranded_ratio", _G, "Stranded compute slices over the GPU's compute slices.", _DETECT),
    _g(
        "flexmig_gpu_recoverable_compute_slices",
        _G,
        "Most compute slices that repacking the running instances would make usable by one profile the demand "
        "mix asks for (the figure the fragmentation finding and alert use).",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_recoverable_ratio",
        _G,
        "Recoverable compute slices over the GPU's compute slices, 0-1 (what [detect] fragmentation_threshold "
        "compares).",
        _DETECT,
    ),
    _c(
        "flexmig_gpu_instance_changes",
        (*_G, "change"),
        "MIG instances created and destroyed on the GPU since start, by change (created, destroyed), whoever made "
        "them (flexmig, nvidia-smi, mig-parted): a layout change counts here.",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_creatable_repacked_instances",
        (*_G, "profile"),
        "How many instances of this profile alone could be created if the running instances were packed tightly.",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_stranded_instances",
        (*_G, "profile"),
        "Instances of this profile that only the placement of the running instances prevents (repacked - now).",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_finding",
        (*_G, "finding"),
        "1 while a GPU-wide finding (fragmentation) is active, else 0.",
        _DETECT,
    ),
    _g(
        "flexmig_gpu_finding_duration_seconds",
        (*_G, "finding"),
        "How long the active GPU-wide finding has lasted.",
        "while a GPU finding is active",
    ),
    _g(
        "flexmig_mig_internal_fragmentation_compute_slices",
        _I,
        "Compute slices the instance holds beyond what its job used over the window (p95 activity).",
        "once detection judged the instance and its activity is known",
    ),
    _g(
        "flexmig_mig_internal_fragmentation_memory_slices",
        _I,
        "Memory slices the instance holds beyond what its job used over the window (peak memory).",
        "once detection judged the instance",
    ),
    _g(
        "flexmig_mig_finding",
        (*_I, "finding"),
        "1 while an underuse finding (idle, underused) or an oversized finding is active on the instance, else 0.",
        "once detection judged the instance (no series before its first window)",
    ),
    _g(
        "flexmig_mig_finding_duration_seconds",
        (*_I, "finding"),
        "How long the active finding has lasted.",
        "while an instance finding is active",
    ),
    Family(
        "flexmig_mig_suggested_profile",
        "info",
        _I,
        "The smaller profile an oversized instance's job would fit (only while the finding is active).",
        "while an oversized finding is active",
        info_labels=("suggested_profile",),
    ),
    # ------------------------------------------------------------------ the MQTT publisher
    _g("flexmig_mqtt_connected", _N, "1 while a session with the MQTT broker is up, else 0.", _MQTT),
    _g(
        "flexmig_mqtt_outbox_events",
        _N,
        "Events waiting in the persistent outbox for the broker's acknowledgement.",
        _MQTT,
    ),
    _c("flexmig_mqtt_events_sent", _N, "Events the broker acknowledged (QoS 1 PUBACK).", _MQTT),
    _c("flexmig_mqtt_events_dropped", _N, "Events the full outbox dropped, oldest first.", _MQTT),
    _c("flexmig_mqtt_connect_failures", _N, "Failed attempts to connect to the broker.", _MQTT),
    _c(
        "flexmig_mqtt_events_emitted",
        (*_N, "kind"),
        "Events handed to the publisher (stored in the outbox), by kind.",
        _MQTT,
    ),
    _c(
        "flexmig_events_dropped",
        (*_N, "reason"),
        "Events that will never reach the broker, by reason (outbox_full, outbox_unwritable, outbox_corrupt).",
        _MQTT,
    ),
    _c(
        "flexmig_outbox_corruptions",
        _N,
        "Outbox files found corrupt, moved aside (NAME.corrupt-TIME) and replaced by a fresh one.",
        _MQTT,
    ),
    _c(
        "flexmig_mqtt_command_results_dropped",
        _N,
        "MQTT command results dropped unsent because too many were waiting for the broker.",
        "with MQTT commands enabled",
    ),
    # ------------------------------------------------------------------ the actuator and the planner (every mode)
    _c(
        "flexmig_actions",
        (*_N, "action", "outcome"),
        "Actions the actuator finished, by kind (migrate, resplit, start, stop, create_instance, destroy_instance, "
        "restart) and outcome (completed, failed, cancelled, skipped); every pair is present from the start at 0 "
        "(slurm_reregister, with [slurm], once one ran).",
    ),
    Family(
        "flexmig_action_duration_seconds",
        "histogram",
        (*_N, "action"),
        "Wall time of an action, from its first journalled step to its last.",
        "per action, once it ran",
    ),
    Family(
        "flexmig_job_downtime_seconds",
        "histogram",
        (*_N, "action"),
        "The job's own downtime in a move, as its hook reports it: from its last step before the checkpoint to its "
        "first step after the move (the save, the exit, the start-up, the load and the first step included).",
        "per action (migrate, resplit), once a moved job reported its first step",
    ),
    Family(
        "flexmig_move_pause_seconds",
        "histogram",
        (*_N, "action"),
        "flexmig's share of a move's pause: the job's old ranks had exited to its new ranks started (the job's own "
        "downtime is flexmig_job_downtime_seconds).",
        "per action (migrate, resplit), once it ran",
    ),
    _g("flexmig_actions_in_progress", _N, "Actions executing now (they run one at a time)."),
    _g("flexmig_jobs", (*_N, "state"), "Registered jobs by state (pending, running, stopped, failed, done)."),
    _c("flexmig_planner_runs", _N, "Planning rounds since start (modes advise and act)."),
    _c("flexmig_planner_failures", _N, "Planning rounds that failed (logged) since start."),
    _g(
        "flexmig_planned_actions",
        (*_N, "action"),
        "Actions the last plan proposes, by kind (0 everywhere: nothing worth doing).",
    ),
    _g("flexmig_plan_cost_seconds", _N, "Estimated cost of the last plan's actions.", "from the first plan on"),
    _g(
        "flexmig_unknown_ranks",
        _N,
        "Processes of no running rank: with flexmig's job markers on this node's MIG instances and of no journalled "
        "job, or of a journalled job (its markers, its cgroup) that no rank of it accounts for.",
        "once the actuator has looked at the node's processes",
    ),
    # ------------------------------------------------------------------ the daemon's own health
    _c(
        "flexmig_task_restarts",
        (*_N, "task"),
        "Restarts of a background task of the daemon after it failed (mqtt, mqtt-commands, dcgm, workload); past 5 "
        "in 10 minutes the daemon stops instead.",
        "once a restartable task failed and was restarted",
    ),
    _g("flexmig_metrics_connections", _N, "Open connections to the metrics server."),
    _g("flexmig_metrics_connection_limit", _N, "Connections the metrics server holds at most."),
    _c(
        "flexmig_metrics_connections_evicted",
        _N,
        "Connections still sending their request head, closed at the cap to make room for a new one.",
    ),
    _c("flexmig_metrics_connections_refused", _N, "Connections closed unanswered at the cap."),
    _c("flexmig_metrics_connections_timed_out", _N, "Connections cut: request head or answer too slow."),
    _g(
        "flexmig_journal_write_waiting",
        _N,
        "1 while an action waits for the journal's storage to take a write (a full disk), else 0.",
    ),
    _c("flexmig_journal_write_retries", _N, "Journal writes tried again because the storage could not take them."),
    _c("flexmig_journal_write_stalls", _N, "Times an action had to wait for the journal's storage."),
    # ------------------------------------------------------------------ the Slurm agent
    _g("flexmig_slurm_up", _N, "1 when the last read of Slurm succeeded, 0 when it failed.", _SLURM_READ),
    _c("flexmig_slurm_read_errors", _N, "Reads of Slurm that failed.", _SLURM),
    _g("flexmig_slurm_pending_jobs", _N, "Slurm jobs pending that count for this node.", _SLURM_READ),
    _g("flexmig_slurm_running_jobs", _N, "Slurm jobs running that count for this node.", _SLURM_READ),
    _g("flexmig_slurm_movable_jobs", _N, "Slurm jobs movable that count for this node.", _SLURM_READ),
    _g("flexmig_slurm_in_sync", _N, "1 when Slurm lists the node with exactly NVML's instances.", _SLURM_READ),
    _g(
        "flexmig_slurm_registered_gpus",
        (*_N, "profile"),
        "GPU GRES Slurm lists for the node, by type.",
        _SLURM_READ,
    ),
    _g(
        "flexmig_slurm_drain_estimate_seconds",
        (*_N, "slurm_node"),
        "Estimated drain of the last decision.",
        "with `[slurm] enabled = true`, from the first decision on",
    ),
    _g(
        "flexmig_slurm_reregistration_gain_slice_seconds",
        (*_N, "slurm_node"),
        "Busy compute slice-seconds the last decision's change would add over its horizon (forecast, 0: none).",
        "with `[slurm] enabled = true`, from the first decision on",
    ),
    _g(
        "flexmig_slurm_reregistration_cost_slice_seconds",
        (*_N, "slurm_node"),
        "Compute slice-seconds the last decision's change would leave idle until the node is registered again.",
        "with `[slurm] enabled = true`, from the first decision on",
    ),
    _g(
        "flexmig_slurm_reregistration_wanted",
        (*_N, "slurm_node"),
        "1 when the last decision said go.",
        "with `[slurm] enabled = true`, from the first decision on",
    ),
    _c(
        "flexmig_slurm_job_actions",
        (*_N, "action"),
        "Slurm jobs signalled, requeued and released.",
        _SLURM,
    ),
    Family(
        "flexmig_slurm_drain_seconds",
        "histogram",
        _N,
        "How long re-registrations waited for the node to empty.",
        _SLURM,
    ),
    _c(
        "flexmig_slurm_queue_reads",
        _N,
        "Reads of Slurm's whole queue (squeue); summed over the nodes, the load flexmig puts on slurmctld.",
        _SLURM,
    ),
    _g(
        "flexmig_slurm_queue_read_seconds",
        _N,
        "How long the last read of the queue took, Slurm's answer and its parsing.",
        _SLURM_READ,
    ),
    _g(
        "flexmig_slurm_queue_read_spacing_seconds",
        _N,
        "The least time between two reads of the queue that its moving counters ask for (cluster_reads_per_s).",
        _SLURM,
    ),
    Family(
        "flexmig_slurm_slurmd_restarts",
        "counter",
        _N,
        "Crashed slurmds flexmig started again with the GRES they had (their jobs run on).",
        _SLURM,
    ),
    # ------------------------------------------------------------------ the daemon's process (prometheus_client)
    Family("process_cpu_seconds", "counter", (), "Total user and system CPU time spent in seconds.", extern=True),
    Family("process_resident_memory_bytes", "gauge", (), "Resident memory size in bytes.", extern=True),
    Family("process_virtual_memory_bytes", "gauge", (), "Virtual memory size in bytes.", extern=True),
    Family("process_open_fds", "gauge", (), "Number of open file descriptors.", extern=True),
    Family("process_max_fds", "gauge", (), "Maximum number of open file descriptors.", extern=True),
    Family(
        "process_start_time_seconds", "gauge", (), "Start time of the process since unix epoch in seconds.", extern=True
    ),
)

_DETAIL: Mapping[str, Level] = {
    # per GPU, standard: the power limit, MIG mode and clocks, and the rest of the fragmentation summary (the
    # fragmentation finding judged absent as 0 too: ZEROS_FROM); what is free per profile now and if repacked is
    # node-wide at every level (14 series a node, where per GPU it would be 14 a GPU)
    "flexmig_gpu_power_limit_watts": "standard",
    "flexmig_gpu_mig_mode": "standard",
    "flexmig_gpu_sm_clock_hertz": "standard",
    "flexmig_gpu_memory_clock_hertz": "standard",
    "flexmig_gpu_free_memory_slices": "standard",
    "flexmig_gpu_fragmentation_external_ratio": "standard",
    "flexmig_gpu_stranded_compute_slices": "standard",
    "flexmig_gpu_recoverable_ratio": "standard",
    # per GPU, full: per-profile capacities, and the raw figures PromQL computes from standard's (F_g is the
    # external ratio times the free compute slices, the stranded ratio the stranded slices over 7)
    "flexmig_gpu_creatable_instances": "full",
    "flexmig_gpu_creatable_repacked_instances": "full",
    "flexmig_gpu_stranded_instances": "full",
    "flexmig_gpu_fragmentation_external_slices": "full",
    "flexmig_gpu_stranded_ratio": "full",
    # per instance, standard: the window statistics PromQL cannot recompute from a 15 s scrape (SM activity's mean,
    # min and p95, memory's peak), and the placement (start and memory slices; the compute slices are the
    # GPU_I_PROFILE label's, which the slice map reads)
    "flexmig_mig_sm_active_mean_ratio": "standard",
    "flexmig_mig_sm_active_min_ratio": "standard",
    "flexmig_mig_sm_active_p95_ratio": "standard",
    "flexmig_mig_memory_used_max_bytes": "standard",
    "flexmig_mig_placement_start": "standard",
    "flexmig_mig_memory_slices": "standard",
    "flexmig_mig_suggested_profile": "standard",
    # per instance, full: the other activity figures, host figures, compute size and internal fragmentation
    "flexmig_mig_compute_slices": "full",
    "flexmig_mig_memory_used_mean_bytes": "full",
    "flexmig_mig_memory_used_p95_bytes": "full",
    "flexmig_mig_sm_occupancy_ratio": "full",
    "flexmig_mig_dram_active_ratio": "full",
    "flexmig_mig_tensor_active_ratio": "full",
    "flexmig_mig_gr_engine_active_ratio": "full",
    "flexmig_mig_activity_source": "full",
    "flexmig_mig_processes_cpu_ratio": "full",
    "flexmig_mig_processes_resident_memory_bytes": "full",
    "flexmig_mig_internal_fragmentation_compute_slices": "full",
    "flexmig_mig_internal_fragmentation_memory_slices": "full",
}
"""The detail level of every family that is not ``minimal``: what ``standard`` and ``full`` add, in one place.
``minimal`` keeps, per instance, its memory size and use, SM activity, processes, idle time and active findings;
per GPU, its memory, the sensors an operator pages on (lost, power, temperature), instances, free compute slices,
recoverable capacity, findings and layout changes; every node-wide family (the daemon's own health, detection's
node figures, MQTT, actions, Slurm) at every level."""

FAMILIES = tuple(replace(f, level=_DETAIL.get(f.name, "minimal")) for f in FAMILIES)
assert set(_DETAIL) <= {f.name for f in FAMILIES}, "a detail level for a family the catalogue lacks"

_BY_NAME: Mapping[str, Family] = MappingProxyType({f.name: f for f in FAMILIES})
assert len(_BY_NAME) == len(FAMILIES), "two catalogue entries share a family name (OpenMetrics forbids it)"


def by_name(name: str) -> Family:
    """The entry of family ``name``; KeyError names the culprit."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric family {name!r} is not in flexmig.metrics.families") from None


def sample_names(families: Iterable[Family] = FAMILIES) -> frozenset[str]:
    """Every sample name of ``families``."""
    return frozenset(n for f in families for n in f.samples)


ZEROS_FROM: Mapping[str, Level] = MappingProxyType({"flexmig_mig_finding": "full", "flexmig_gpu_finding": "standard"})
"""0/1 finding families and the least detail at which they carry the findings judged absent (0) too; below it only
active findings have a series. A GPU's is one series (the node dashboard's fragmentation timeline shows "ok" from
``standard`` on); an instance's three would be a third of its series, so they wait for ``full``."""
