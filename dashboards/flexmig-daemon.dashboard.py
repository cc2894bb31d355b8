"""flexmig: daemon health. Is flexmigd up and sampling, what sampling costs, errors, the MQTT outbox, DCGM.

flexmigd's own ``process_*`` series carry only Prometheus's target labels (``job``, ``instance``); they are joined
to the node's ``Hostname`` through ``flexmig_node_info`` from the same target.

Generate with ``python dashboards/build.py``.
"""

from __future__ import annotations

from flexmig_dashboards.panels import Grid, Q, host_variable, stat, table, timeseries
from flexmig_dashboards.panels import dashboard as make_dashboard
from flexmig_dashboards.promql import HOST, or_zero

_RI = "$__rate_interval"
_H = "{{Hostname}}"


def _on_host(expr: str, window: str = "") -> str:
    """``expr`` (a series of flexmigd's target without Hostname) labelled with the node's Hostname."""
    info = f"flexmig_node_info{{{HOST}}}"
    if window:
        info = f"max_over_time({info}[{window}])"
    return f"({expr}) * on(instance, job) group_left(Hostname) max by (instance, job, Hostname) ({info})"


g = Grid()

g.row("Daemon")
g.add(
    stat(
        "Up",
        "Prometheus's last scrape of flexmigd worked (1) or failed (0); a node that answered in the last day and "
        "stopped shows 0 here (alert FlexmigDaemonDown).",
        [Q(_on_host("up", "1d"), _H)],
        thresholds=(("red", None), ("green", 1)),
        mappings=[{"type": "value", "options": {"0": {"text": "down"}, "1": {"text": "up"}}}],
    ),
    w=4,
    h=4,
)
g.add(
    stat(
        "Last sweep age",
        "Seconds since the sweep the metrics come from; it stays near the sampling interval while sampling is "
        "healthy (alert FlexmigSamplingStalled above 60 s).",
        [Q(f"time() - flexmig_last_sweep_timestamp_seconds{{{HOST}}}", _H)],
        "s",
        thresholds=(("green", None), ("orange", 5), ("red", 30)),
    ),
    w=4,
    h=4,
)
g.add(
    stat(
        "Uptime",
        "Time since flexmigd started.",
        [Q(_on_host("time() - process_start_time_seconds"), _H)],
        "s",
    ),
    w=4,
    h=4,
)
g.add(
    table(
        "Versions",
        "flexmig, NVIDIA driver and NVML versions on each node.",
        [Q(f"flexmig_node_info{{{HOST}}}")],
        rename={"driver_version": "driver", "nvml_version": "NVML", "version": "flexmig"},
        hide=("Time", "__name__", "job", "instance", "Value"),
    ),
    w=12,
    h=4,
)

g.row("Sampling cost")
g.add(
    timeseries(
        "Sweep time",
        "Wall and CPU time of the last sampling sweep (every NVML read of every GPU and MIG device).",
        [
            Q(f"flexmig_sweep_duration_seconds{{{HOST}}}", f"wall {_H}"),
            Q(f"flexmig_last_sweep_cpu_seconds{{{HOST}}}", f"CPU {_H}"),
        ],
        "s",
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "CPU used (share of one core)",
        "CPU spent in sampling sweeps, and by the whole flexmigd process (sampling, detection, metrics, MQTT).",
        [
            Q(f"rate(flexmig_sweep_cpu_seconds_total{{{HOST}}}[{_RI}])", f"sampling {_H}"),
            Q(_on_host(f"rate(process_cpu_seconds_total[{_RI}])"), f"process {_H}"),
        ],
        "percentunit",
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "Sweeps and inventories",
        "Sampling sweeps per second (1 at the default interval) and full re-inventories per interval (each MIG "
        "change causes one).",
        [
            Q(f"rate(flexmig_sweeps_total{{{HOST}}}[{_RI}])", f"sweeps/s {_H}"),
            Q(f"increase(flexmig_inventories_total{{{HOST}}}[{_RI}])", f"inventories {_H}"),
        ],
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "Detection and scrape time",
        "Wall time of the last detection step, and how long Prometheus's scrape of flexmigd took.",
        [
            Q(f"flexmig_detect_duration_seconds{{{HOST}}}", f"detection {_H}"),
            Q(_on_host("scrape_duration_seconds"), f"scrape {_H}"),
        ],
        "s",
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "Daemon memory",
        "Resident memory of the flexmigd process.",
        [Q(_on_host("process_resident_memory_bytes"), _H)],
        "bytes",
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "Open file descriptors",
        "File descriptors the flexmigd process holds (NVML, sockets, the outbox and journal databases).",
        [Q(_on_host("process_open_fds"), _H)],
        min_value=0,
    ),
    w=8,
)

g.row("Errors")
g.add(
    timeseries(
        "Telemetry source errors",
        "Failed reads per second by source: nvml (a whole sweep), dcgm, host, sweep (a bug, logged). 0 when "
        "there were none.",
        [
            Q(
                or_zero(f"sum by (Hostname, source) (rate(flexmig_source_errors_total{{{HOST}}}[{_RI}]))"),
                "{{Hostname}} {{source}}",
            )
        ],
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "NVML errors",
        "Failed NVML calls per second, by call and NVML error (the field stays absent, never 0). 0 when there "
        "were none.",
        [
            Q(
                or_zero(f"sum by (Hostname, call, error) (rate(flexmig_nvml_errors_total{{{HOST}}}[{_RI}]))"),
                "{{Hostname}} {{call}} {{error}}",
            )
        ],
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "Detection failures",
        "Detection steps that failed per second (a bug; logged with its traceback).",
        [Q(f"rate(flexmig_detect_failures_total{{{HOST}}}[{_RI}])", _H)],
        min_value=0,
    ),
    w=8,
)

g.row("MQTT publisher", "The publisher's session, outbox and events.", needs=("MQTT",))
g.add(
    stat(
        "Broker session",
        "1 while flexmigd has a session with its MQTT broker.",
        [Q(f"flexmig_mqtt_connected{{{HOST}}}", _H)],
        thresholds=(("red", None), ("green", 1)),
        mappings=[{"type": "value", "options": {"0": {"text": "disconnected"}, "1": {"text": "connected"}}}],
    ),
    w=4,
)
g.add(
    timeseries(
        "Outbox depth",
        "Events waiting in the persistent outbox for the broker's acknowledgement: near 0 while the broker is "
        "reachable, growing while it is away (nothing is lost until the outbox's bound is reached).",
        [Q(f"flexmig_mqtt_outbox_events{{{HOST}}}", _H)],
        min_value=0,
    ),
    w=10,
)
g.add(
    timeseries(
        "Events",
        "Events handed to the publisher by kind, acknowledged by the broker, and dropped by a full outbox, per "
        "second; failed connection attempts.",
        [
            Q(
                or_zero(f"sum by (Hostname, kind) (rate(flexmig_mqtt_events_emitted_total{{{HOST}}}[{_RI}]))"),
                "emitted {{Hostname}} {{kind}}",
            ),
            Q(f"rate(flexmig_mqtt_events_sent_total{{{HOST}}}[{_RI}])", f"sent {_H}"),
            Q(f"rate(flexmig_mqtt_events_dropped_total{{{HOST}}}[{_RI}])", f"dropped {_H}"),
            Q(f"rate(flexmig_mqtt_connect_failures_total{{{HOST}}}[{_RI}])", f"connect failures {_H}"),
        ],
        min_value=0,
    ),
    w=10,
)

g.row("dcgm-exporter source", "flexmigd's scrapes of dcgm-exporter.", needs=("dcgm-exporter",))
g.add(
    stat(
        "dcgm-exporter scrape",
        "With [dcgm] enabled: 1 if flexmigd's last scrape of dcgm-exporter worked.",
        [Q(f"flexmig_dcgm_up{{{HOST}}}", "{{Hostname}} {{url}}")],
        thresholds=(("red", None), ("green", 1)),
        mappings=[{"type": "value", "options": {"0": {"text": "failing"}, "1": {"text": "ok"}}}],
    ),
    w=4,
)
g.add(
    timeseries(
        "DCGM instances and age",
        "MIG instances in the last good dcgm-exporter scrape (era: legacy names or 4.9), and that scrape's age "
        "(figures older than 30 s are not joined).",
        [
            Q(f"flexmig_dcgm_instances{{{HOST}}}", "instances {{Hostname}} {{era}}"),
            Q(f"flexmig_dcgm_scrape_age_seconds{{{HOST}}}", f"age (s) {_H}"),
        ],
        min_value=0,
    ),
    w=20,
)

dashboard = make_dashboard(
    "flexmig: daemon health",
    "flexmig-daemon",
    "flexmigd itself: up, sampling cost, errors, MQTT outbox, dcgm-exporter source.",
    g,
    [host_variable()],
)
