"""flexmig: MIG instance detail. Activity (SM active, occupancy, DRAM, tensor), memory, processes, idle time and
findings of the selected instances, with dcgm-exporter's DCGM_FI_PROF_* series overlaid when it is scraped too.

Generate with ``python dashboards/build.py``.
"""

from __future__ import annotations

from typing import Any

from flexmig_dashboards.panels import (
    Grid,
    Q,
    gpu_variable,
    host_variable,
    instance_variable,
    mig_uuid_variable,
    state_timeline,
    table,
    timeseries,
    value_mapping,
)
from flexmig_dashboards.panels import dashboard as make_dashboard
from flexmig_dashboards.promql import INST, dcgm_overlay

_LEGEND = "{{Hostname}} gpu {{gpu}} GI {{GPU_I_ID}} {{GPU_I_PROFILE}}"
_DCGM_LEGEND = "DCGM {{Hostname}} gpu {{gpu}} GI {{GPU_I_ID}}"
_MIB = 1024 * 1024


def _activity(title: str, what: str, ours: str, dcgm: tuple[str, ...]) -> Any:
    return timeseries(
        title,
        f"{what} flexmig's figure (GPM on Hopper, or DCGM where flexmigd scrapes dcgm-exporter) and, when "
        "Prometheus scrapes dcgm-exporter too, its own series for the same instance (joined on Hostname, gpu "
        "and GPU_I_ID; dcgm-exporter < 4.9 and >= 4.9 names alike).",
        [Q(f"{ours}{{{INST}}}", f"flexmig {_LEGEND}"), Q(dcgm_overlay(dcgm), _DCGM_LEGEND)],
        "percentunit",
        min_value=0,
        max_value=1,
    )


g = Grid()

g.row(
    "Instances",
    "Placement is there from standard on, where the activity figures come from at full.",
    needs=("detail full",),
)
g.add(
    table(
        "Selected instances",
        "Identity and placement of the selected instances: the MIG UUID is what CUDA_VISIBLE_DEVICES takes; "
        "'activity from' says where the activity figures come from (gpm or dcgm).",
        [
            Q(f"flexmig_mig_activity_source_info{{{INST}}}"),
            Q(f"flexmig_mig_placement_start{{{INST}}}"),
            Q(f"flexmig_mig_memory_total_bytes{{{INST}}}"),
            Q(f"flexmig_mig_processes{{{INST}}}"),
            Q(f"flexmig_mig_idle_seconds{{{INST}}}"),
        ],
        rename={
            "GPU_I_ID": "GI",
            "GPU_CI_ID": "CI",
            "GPU_I_PROFILE": "profile",
            "source": "activity from",
            "Value #B": "first memory slice",
            "Value #C": "memory",
            "Value #D": "processes",
            "Value #E": "idle",
        },
        hide=("Time", "__name__", "UUID", "model_name", "job", "instance", "Value #A"),
        units={"Value #C": "bytes", "Value #E": "s"},
    ),
    w=24,
    h=7,
)

g.row(
    "Activity",
    "SM activity is there at every detail, its window statistics from standard on, occupancy, DRAM and tensor "
    "activity at full; the graphics engine and the DCGM_FI_PROF_* overlays come from dcgm-exporter.",
    needs=("detail full", "dcgm-exporter"),
)
g.add(
    _activity(
        "SM active",
        "Fraction of cycles an SM of the instance had a warp resident:",
        "flexmig_mig_sm_active_ratio",
        ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"),
    )
)
g.add(
    _activity(
        "SM occupancy",
        "Resident warps as a fraction of the maximum:",
        "flexmig_mig_sm_occupancy_ratio",
        ("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"),
    )
)
g.add(
    _activity(
        "DRAM active",
        "Fraction of cycles the memory interface was busy:",
        "flexmig_mig_dram_active_ratio",
        ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO"),
    )
)
g.add(
    _activity(
        "Tensor active",
        "Fraction of cycles a tensor pipe was busy:",
        "flexmig_mig_tensor_active_ratio",
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"),
    )
)
g.add(
    _activity(
        "Graphics engine active",
        "Fraction of time the graphics/compute engine was busy (DCGM's GR_ENGINE_ACTIVE, the figure "
        "dcgm-exporter's maintainers point MIG users to instead of the blank GPU_UTIL):",
        "flexmig_mig_gr_engine_active_ratio",
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"),
    )
)
g.add(
    timeseries(
        "SM active over the window",
        "Mean, lowest and 95th percentile of SM activity over flexmig's window (flexmig_window_seconds, 60 s by "
        "default): what detection judges underuse and oversize by.",
        [
            Q(f"flexmig_mig_sm_active_mean_ratio{{{INST}}}", f"mean {_LEGEND}"),
            Q(f"flexmig_mig_sm_active_min_ratio{{{INST}}}", f"min {_LEGEND}"),
            Q(f"flexmig_mig_sm_active_p95_ratio{{{INST}}}", f"p95 {_LEGEND}"),
        ],
        "percentunit",
        min_value=0,
        max_value=1,
    )
)

g.row(
    "Memory",
    "Memory used and size are there at every detail, the peak over the window from standard on, its mean and p95 "
    "at full; the framebuffer overlay comes from dcgm-exporter.",
    needs=("detail full", "dcgm-exporter"),
)
g.add(
    timeseries(
        "Memory used",
        "Memory used on the instance against its size; with dcgm-exporter scraped, its framebuffer-used figure "
        "for the same instance (MiB before 4.9, converted to bytes).",
        [
            Q(f"flexmig_mig_memory_used_bytes{{{INST}}}", f"used {_LEGEND}"),
            Q(f"flexmig_mig_memory_total_bytes{{{INST}}}", f"size {_LEGEND}"),
            Q(
                dcgm_overlay(("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES"), scale={"DCGM_FI_DEV_FB_USED": _MIB}),
                f"used {_DCGM_LEGEND}",
            ),
        ],
        "bytes",
        min_value=0,
    ),
    w=12,
)
g.add(
    timeseries(
        "Memory used over the window",
        "Mean, peak and 95th percentile of memory used over flexmig's window, as a fraction of the instance.",
        [
            Q(
                f"flexmig_mig_memory_used_mean_bytes{{{INST}}} / flexmig_mig_memory_total_bytes{{{INST}}}",
                f"mean {_LEGEND}",
            ),
            Q(
                f"flexmig_mig_memory_used_max_bytes{{{INST}}} / flexmig_mig_memory_total_bytes{{{INST}}}",
                f"max {_LEGEND}",
            ),
            Q(
                f"flexmig_mig_memory_used_p95_bytes{{{INST}}} / flexmig_mig_memory_total_bytes{{{INST}}}",
                f"p95 {_LEGEND}",
            ),
        ],
        "percentunit",
        min_value=0,
        max_value=1,
    ),
    w=12,
)

g.row("Processes and idle time")
_PROC_FIGURES = (
    ("flexmig_mig_processes", "processes"),
    ("flexmig_mig_processes_cpu_ratio", "host CPU (cores)"),
    ("flexmig_mig_processes_resident_memory_bytes", "host RSS"),
)
g.add(
    timeseries(
        "Processes",
        "Compute processes on the instance (CUDA shows one MIG device per process) and, for processes the host "
        "can see, their CPU summed in cores and their resident host memory (right axis). A process from a "
        "container the daemon cannot see counts, with no CPU or RSS.",
        [
            Q(
                " or ".join(
                    f'label_replace({name}{{{INST}}}, "figure", "{figure}", "__name__", ".*")'
                    for name, figure in _PROC_FIGURES
                ),
                f"{{{{figure}}}} {_LEGEND}",
            )
        ],
        min_value=0,
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": "^host RSS.*"},
                "properties": [{"id": "unit", "value": "bytes"}, {"id": "custom.axisPlacement", "value": "right"}],
            }
        ],
    ),
    w=12,
)
g.add(
    timeseries(
        "Idle time",
        "Time since the instance last had a process or SM activity above 1%: it resets when work arrives.",
        [Q(f"flexmig_mig_idle_seconds{{{INST}}}", _LEGEND)],
        "s",
        min_value=0,
    ),
    w=12,
)

g.row(
    "Findings",
    "Active findings and how long they have held are there at every detail; internal fragmentation, and the "
    "findings judged absent (0), at full.",
    needs=("detail full",),
)
g.add(
    timeseries(
        "Internal fragmentation",
        "Slices the instance holds beyond what its job used over the window: compute from p95 activity, memory "
        "from peak use.",
        [
            Q(f"flexmig_mig_internal_fragmentation_compute_slices{{{INST}}}", f"compute {_LEGEND}"),
            Q(f"flexmig_mig_internal_fragmentation_memory_slices{{{INST}}}", f"memory {_LEGEND}"),
        ],
        min_value=0,
    ),
    w=12,
)
g.add(
    timeseries(
        "Active findings: how long",
        "How long each active finding (idle, underused, oversized) has lasted.",
        [Q(f"flexmig_mig_finding_duration_seconds{{{INST}}}", f"{{{{finding}}}} {_LEGEND}")],
        "s",
        min_value=0,
    ),
    w=12,
)
g.add(
    state_timeline(
        "Findings",
        "Each finding kind per instance: active (with detection's hysteresis) or not.",
        [Q(f"flexmig_mig_finding{{{INST}}}", f"{{{{finding}}}} {_LEGEND}")],
        [value_mapping((("0", "no", "green"), ("1", "yes", "orange")))],
    ),
    w=16,
    h=8,
)
_KEY = "Hostname, gpu, GPU_I_ID, GPU_CI_ID"
g.add(
    table(
        "Findings now",
        "Each finding kind per instance: 1 while active, 0 when detection judged it absent; for an oversized "
        "instance, the smaller profile its job would fit with headroom.",
        [
            Q(
                f"(flexmig_mig_finding{{{INST}}} * on({_KEY}) group_left(suggested_profile) "
                f"flexmig_mig_suggested_profile_info{{{INST}}}) "
                f"or on({_KEY}, finding) flexmig_mig_finding{{{INST}}}"
            )
        ],
        rename={
            "GPU_I_ID": "GI",
            "GPU_CI_ID": "CI",
            "GPU_I_PROFILE": "profile",
            "suggested_profile": "fits in",
            "Value": "active",
        },
    ),
    w=8,
    h=8,
)

dashboard = make_dashboard(
    "flexmig: MIG instance detail",
    "flexmig-instance",
    "Per MIG instance: activity, memory, processes, idle time and findings, with DCGM_FI_PROF_* overlays.",
    g,
    [host_variable(), gpu_variable(), instance_variable(), mig_uuid_variable()],
)
