"""flexmig: node overview. GPUs, their MIG layouts as slice maps, free capacity per profile, fragmentation.

Generate with ``python dashboards/build.py`` (or ``PYTHONPATH=dashboards generate-dashboard -o
dashboards/flexmig-node.json dashboards/flexmig-node.dashboard.py``).
"""

from __future__ import annotations

from flexmig_dashboards.panels import (
    Grid,
    Q,
    gpu_variable,
    host_variable,
    stat,
    state_timeline,
    table,
    timeseries,
    value_mapping,
)
from flexmig_dashboards.panels import dashboard as make_dashboard
from flexmig_dashboards.promql import GPU, HOST, SLICES, slice_occupant

_GPU_LEGEND = "{{Hostname}} gpu {{gpu}}"
_GPU_KEY = "Hostname, gpu"

g = Grid()

g.row("Node")
g.add(
    stat(
        "MIG GPUs",
        "GPUs with MIG mode enabled (those with a count of free compute slices, at every detail).",
        [Q(f"count by (Hostname) (flexmig_gpu_free_compute_slices{{{GPU}}})", "{{Hostname}}")],
    ),
    w=4,
    h=4,
)
g.add(
    stat(
        "MIG instances",
        "GPU/compute instance pairs on the selected GPUs.",
        [Q(f"sum by (Hostname) (flexmig_gpu_mig_instances{{{GPU}}})", "{{Hostname}}")],
    ),
    w=4,
    h=4,
)
g.add(
    stat(
        "Free compute slices",
        "Compute slices no instance holds, summed over the selected GPUs.",
        [Q(f"sum by (Hostname) (flexmig_gpu_free_compute_slices{{{GPU}}})", "{{Hostname}}")],
    ),
    w=4,
    h=4,
)
g.add(
    stat(
        "External fragmentation",
        "Demand-weighted external fragmentation of the node, 0-1: the chance a request from the demand mix finds "
        "no place although compute slices are free (docs/detection.md).",
        [Q(f"flexmig_node_fragmentation_external_ratio{{{HOST}}}", "{{Hostname}}")],
        "percentunit",
        thresholds=(("green", None), ("orange", 0.3), ("red", 0.5)),
    ),
    w=4,
    h=4,
)
g.add(
    stat(
        "Recoverable compute slices",
        "Compute slices that repacking the running instances would make usable by a profile the demand mix asks "
        "for, summed over the node's GPUs (docs/detection.md); a GPU is fragmented from 2 (of 7) by default.",
        [Q(f"flexmig_node_recoverable_compute_slices{{{HOST}}}", "{{Hostname}}")],
        thresholds=(("green", None), ("orange", 2), ("red", 4)),
    ),
    w=4,
    h=4,
)
g.add(
    stat(
        "Lost GPUs",
        "GPUs NVML reported lost (GPU_IS_LOST): their instances drop out until the GPU comes back.",
        [Q(f"sum by (Hostname) (flexmig_gpu_lost{{{GPU}}})", "{{Hostname}}")],
        thresholds=(("green", None), ("red", 1)),
    ),
    w=4,
    h=4,
)

g.row(
    "Layouts",
    "The slice map and the instances' placement come from each instance's placement figures.",
    needs=("detail standard",),
)
_PROFILE_COLOURS = (
    ("0", "free", "#808080"),
    ("1", "1g", "green"),
    ("2", "2g", "blue"),
    ("3", "3g", "purple"),
    ("4", "4g", "orange"),
    ("7", "7g", "red"),
)
g.add(
    state_timeline(
        "Slice map: memory slices 0-7 of each GPU",
        "One row per GPU and memory slice; the colour is the size (compute slices) of the instance holding the "
        "slice, 'free' when none does. An instance spans as many rows as its placement has memory slices, so "
        "each GPU's column of rows is its MIG layout, and a migration or re-split shows as a change over time.",
        [Q(slice_occupant(s), f"{_GPU_LEGEND} slice {s}") for s in range(SLICES)],
        [value_mapping(_PROFILE_COLOURS)],
    ),
    w=14,
    h=16,
)
g.add(
    table(
        "Instances",
        "Every MIG instance on the selected GPUs: profile, placement (first memory slice and count), processes, "
        "SM activity over the window, idle time.",
        [
            Q(f"flexmig_mig_placement_start{{{GPU}}}"),
            Q(f"flexmig_mig_memory_slices{{{GPU}}}"),
            Q(f"flexmig_mig_processes{{{GPU}}}"),
            Q(f"flexmig_mig_sm_active_mean_ratio{{{GPU}}}"),
            Q(f"flexmig_mig_idle_seconds{{{GPU}}}"),
        ],
        rename={
            "GPU_I_ID": "GI",
            "GPU_CI_ID": "CI",
            "GPU_I_PROFILE": "profile",
            "Value #A": "start",
            "Value #B": "memory slices",
            "Value #C": "processes",
            "Value #D": "SM active (mean)",
            "Value #E": "idle",
        },
        units={"Value #D": "percentunit", "Value #E": "s"},
    ),
    w=10,
    h=16,
)

g.row(
    "Free capacity per profile",
    "Creatable instances per profile on the node, now and if repacked, and free slices per GPU (memory slices "
    "from standard on).",
    needs=("detail standard",),
)
g.add(
    table(
        "Creatable now vs if repacked",
        "Per node and profile, summed over its MIG GPUs: how many instances of that profile alone could be created "
        "now, how many if each GPU's running instances were packed tightly, and the difference (capacity stranded "
        "by placement). Per GPU: the row below, at detail full.",
        [
            Q(f"flexmig_node_creatable_instances{{{HOST}}}"),
            Q(f"flexmig_node_creatable_repacked_instances{{{HOST}}}"),
            Q(f"flexmig_node_creatable_repacked_instances{{{HOST}}} - flexmig_node_creatable_instances{{{HOST}}}"),
        ],
        rename={"Value #A": "creatable now", "Value #B": "if repacked", "Value #C": "stranded"},
    ),
    w=12,
    h=10,
)
g.add(
    timeseries(
        "Creatable now and if repacked, per profile",
        "Instances of each profile a scheduler could still place on the node now (solid), and if its GPUs were "
        "repacked (dashed): the gap is capacity stranded by placement.",
        [
            Q(f"flexmig_node_creatable_instances{{{HOST}}}", "{{Hostname}} {{profile}}"),
            Q(f"flexmig_node_creatable_repacked_instances{{{HOST}}}", "{{Hostname}} {{profile}} if repacked"),
        ],
        min_value=0,
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".* if repacked$"},
                "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}],
            }
        ],
    ),
    w=12,
    h=10,
)
g.add(
    timeseries(
        "Free slices per GPU",
        "Compute slices (of 7) and memory slices (of 8) that no instance holds.",
        [
            Q(f"flexmig_gpu_free_compute_slices{{{GPU}}}", f"{_GPU_LEGEND} compute"),
            Q(f"flexmig_gpu_free_memory_slices{{{GPU}}}", f"{_GPU_LEGEND} memory"),
        ],
        min_value=0,
    ),
    w=24,
    h=8,
)

g.row(
    "Free capacity per GPU and profile",
    "Per GPU and profile: 14 series a GPU, which the default detail leaves to the node totals above.",
    needs=("detail full",),
)
g.add(
    table(
        "Creatable now vs if repacked, per GPU",
        "Per GPU and profile: how many instances of that profile alone could be created now, how many if the "
        "running instances were packed tightly, and the difference (capacity stranded by placement).",
        [
            Q(f"flexmig_gpu_creatable_instances{{{GPU}}}"),
            Q(f"flexmig_gpu_creatable_repacked_instances{{{GPU}}}"),
            Q(f"flexmig_gpu_stranded_instances{{{GPU}}}"),
        ],
        rename={"Value #A": "creatable now", "Value #B": "if repacked", "Value #C": "stranded"},
    ),
    w=24,
    h=10,
)

g.row(
    "Fragmentation",
    "Detection's figures per GPU: external fragmentation, stranded and recoverable slices, the fragmentation "
    "finding (0 judged absent, from standard on) and how long it has held.",
    needs=("detail standard",),
)
g.add(
    timeseries(
        "External fragmentation per GPU",
        "Demand-weighted external fragmentation score F/free per GPU (0 when nothing is free): how much of the "
        "free compute the demand mix cannot use now; the node figure is the sum of F over the sum of free slices. "
        "Whether a repack would help is the recoverable figure beside it (what the finding and alert use).",
        [
            Q(f"flexmig_gpu_fragmentation_external_ratio{{{GPU}}}", _GPU_LEGEND),
            Q(f"flexmig_node_fragmentation_external_ratio{{{HOST}}}", "{{Hostname}} node"),
        ],
        "percentunit",
        min_value=0,
        max_value=1,
    ),
    w=12,
)
g.add(
    timeseries(
        "Stranded and recoverable compute slices per GPU",
        "Stranded: the most compute slices that repacking the running instances would make usable by one "
        "profile. Recoverable: the same, for profiles the demand mix asks for (a fragmentation finding starts at "
        "2 of 7 by default). F: free compute slices the demand mix cannot use now.",
        [
            Q(f"flexmig_gpu_recoverable_compute_slices{{{GPU}}}", f"{_GPU_LEGEND} recoverable"),
            Q(f"flexmig_gpu_stranded_compute_slices{{{GPU}}}", f"{_GPU_LEGEND} stranded"),
            Q(
                f"flexmig_gpu_fragmentation_external_ratio{{{GPU}}} * on({_GPU_KEY}) "
                f"flexmig_gpu_free_compute_slices{{{GPU}}}",
                f"{_GPU_LEGEND} F (unusable free slices)",
            ),
        ],
        min_value=0,
    ),
    w=12,
)
g.add(
    state_timeline(
        "Fragmentation findings",
        "A GPU is 'fragmented' while its fragmentation finding is active: a repack would make at least 2 of its 7 "
        "compute slices usable by a profile of the demand mix (by default; with hysteresis, see docs/detection.md).",
        [Q(f'flexmig_gpu_finding{{{GPU}, finding="fragmentation"}}', _GPU_LEGEND)],
        [value_mapping((("0", "ok", "green"), ("1", "fragmented", "red")))],
    ),
    w=16,
    h=6,
)
g.add(
    timeseries(
        "Fragmented for",
        "How long each GPU's active fragmentation finding has lasted (the alert FlexmigGpuFragmented waits 15 min); "
        "0 while the GPU is not fragmented.",
        [
            Q(
                f'flexmig_gpu_finding_duration_seconds{{{GPU}, finding="fragmentation"}} '
                f'or 0 * flexmig_gpu_finding{{{GPU}, finding="fragmentation"}}',
                _GPU_LEGEND,
            )
        ],
        "s",
        min_value=0,
    ),
    w=8,
    h=6,
)

g.row(
    "GPU health",
    "Temperature and power draw are there at every detail; the power limit (and so the share of it drawn) and "
    "the clocks from standard on.",
    needs=("detail standard",),
)
# NVIDIA's DCGM dashboard (grafana.com 12239) colours temperature yellow from 83 C and red from 87 C, and total power
# yellow from 1800 W and red from 2200 W of 2400 W; power here is taken against each GPU's enforced limit instead
# (an H200 draws up to 700 W), with the same proportions: 75 % and 92 %.
_TEMPERATURE = (("green", None), ("#EAB839", 83), ("red", 87))
_POWER_SHARE = (("green", None), ("#EAB839", 0.75), ("red", 0.92))
g.add(
    stat(
        "Hottest GPU",
        "The highest core temperature among the selected GPUs: yellow from 83 C, red from 87 C (the thresholds of "
        "NVIDIA's DCGM dashboard).",
        [Q(f"max by (Hostname) (flexmig_gpu_temperature_celsius{{{GPU}}})", "{{Hostname}}")],
        "celsius",
        thresholds=_TEMPERATURE,
    ),
    w=4,
)
g.add(
    stat(
        "Power draw of the limit",
        "Power drawn by the selected GPUs over their enforced power limits: yellow from 75 %, red from 92 % "
        "(NVIDIA's DCGM dashboard: 1800 W and 2200 W of 2400 W).",
        [
            Q(
                f"sum by (Hostname) (flexmig_gpu_power_watts{{{GPU}}}) "
                f"/ sum by (Hostname) (flexmig_gpu_power_limit_watts{{{GPU}}})",
                "{{Hostname}}",
            )
        ],
        "percentunit",
        thresholds=_POWER_SHARE,
    ),
    w=4,
)
g.add(
    timeseries(
        "Temperature",
        "GPU core temperature, against the thresholds of NVIDIA's DCGM dashboard (83 C, 87 C).",
        [Q(f"flexmig_gpu_temperature_celsius{{{GPU}}}", _GPU_LEGEND)],
        "celsius",
        thresholds=_TEMPERATURE,
    ),
    w=8,
)
g.add(
    timeseries(
        "Power",
        "Power draw per GPU and its enforced power limit (nvidia-smi -q -d POWER).",
        [
            Q(f"flexmig_gpu_power_watts{{{GPU}}}", _GPU_LEGEND),
            Q(f"flexmig_gpu_power_limit_watts{{{GPU}}}", f"{_GPU_LEGEND} limit"),
        ],
        "watt",
        min_value=0,
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".* limit$"},
                "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}],
            }
        ],
    ),
    w=8,
)
g.add(
    timeseries(
        "Power draw, share of the limit",
        "Power draw over the enforced power limit per GPU: yellow from 75 %, red from 92 %.",
        [Q(f"flexmig_gpu_power_watts{{{GPU}}} / flexmig_gpu_power_limit_watts{{{GPU}}}", _GPU_LEGEND)],
        "percentunit",
        min_value=0,
        thresholds=_POWER_SHARE,
    ),
    w=12,
)
g.add(
    timeseries(
        "Clocks",
        "SM and memory clocks.",
        [
            Q(f"flexmig_gpu_sm_clock_hertz{{{GPU}}}", f"{_GPU_LEGEND} SM"),
            Q(f"flexmig_gpu_memory_clock_hertz{{{GPU}}}", f"{_GPU_LEGEND} memory"),
        ],
        "hertz",
    ),
    w=12,
)

dashboard = make_dashboard(
    "flexmig: node overview",
    "flexmig-node",
    "GPUs, MIG layouts as slice maps, free capacity per profile and fragmentation, from flexmigd.",
    g,
    [host_variable(), gpu_variable()],
)
