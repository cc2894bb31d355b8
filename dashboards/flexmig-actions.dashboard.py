"""flexmig: actions. Migrations, re-splits and other actions, their outcomes, durations and the downtime jobs saw.

The ``flexmig_actions_*``/``flexmig_action_*``/``flexmig_job_downtime_*``/``flexmig_jobs`` panels read what
flexmigd's actuator exports (``daemon/flexmig/metrics/actions.py``; the histograms have a series per action
once it ran). The layout-change panel shows every MIG change (flexmig's or anyone's), the recoverable-capacity
panel what act mode acts on; actions and layout changes are also annotations on every graph.

Generate with ``python dashboards/build.py``.
"""

from __future__ import annotations

from flexmig_dashboards.panels import Grid, Q, gpu_variable, host_variable, stat, table, timeseries
from flexmig_dashboards.panels import dashboard as make_dashboard
from flexmig_dashboards.promql import GPU, HOST

_RI = "$__rate_interval"
_MOVES = 'action=~"migrate|resplit"'

def _ran(histogram: str) -> str:
    """Per (Hostname, action), 1 where ``histogram`` had observations in the rate window: quantiles and means are
    only drawn there, as a gap elsewhere, never as the NaN of 0/0 (an action that did not run in the window)."""
    return f"(sum by (Hostname, action) (rate({histogram}_count{{{HOST}}}[{_RI}])) > 0)"


def _quantile(q: float, histogram: str) -> str:
    return (
        f"histogram_quantile({q:g}, sum by (Hostname, action, le) (rate({histogram}_bucket{{{HOST}}}[{_RI}]))) "
        f"and on(Hostname, action) {_ran(histogram)}"
    )


def _mean(histogram: str) -> str:
    return f"sum by (Hostname, action) (rate({histogram}_sum{{{HOST}}}[{_RI}])) / {_ran(histogram)}"


g = Grid()

g.row("Outcomes")
for title, outcome, colour in (
    ("Completed", "completed", "green"),
    ("Failed", "failed", "red"),
    ("Cancelled", "cancelled", "orange"),
    ("Skipped", "skipped", "blue"),
):
    g.add(
        stat(
            f"{title} actions (time range)",
            f"Actions that ended {outcome} in the dashboard's time range, every kind.",
            [
                Q(
                    f'sum by (Hostname) (increase(flexmig_actions_total{{{HOST}, outcome="{outcome}"}}[$__range]))',
                    "{{Hostname}}",
                )
            ],
            thresholds=(("green", None), (colour, 1)) if outcome != "completed" else (("green", None),),
        ),
        w=6,
        h=4,
    )
g.add(
    timeseries(
        "Actions by kind and outcome",
        "Actions finished per interval: migrate, resplit, start, stop, create_instance, destroy_instance, "
        "restart; outcome completed, failed (rolled back or job left stopped), cancelled (e.g. checkpoint not "
        "acknowledged in time), skipped.",
        [
            Q(
                f"sum by (Hostname, action, outcome) (increase(flexmig_actions_total{{{HOST}}}[{_RI}]))",
                "{{Hostname}} {{action}} {{outcome}}",
            )
        ],
        bars=True,
        stacked=True,
    ),
    w=16,
)
g.add(
    stat(
        "Action in progress",
        "1 while the actuator executes an action (they run one at a time).",
        [Q(f"flexmig_actions_in_progress{{{HOST}}}", "{{Hostname}}")],
        mappings=[{"type": "value", "options": {"0": {"text": "idle"}, "1": {"text": "acting"}}}],
    ),
    w=8,
)

g.row(
    "Migrations and re-splits",
    "Downtime, durations and outcomes of actions that ran: a node that observes or advises shows none.",
    needs=("mode act",),
)
g.add(
    timeseries(
        "Migrations and re-splits",
        "Job moves per interval: migrate (same world size, other instances) and resplit (another number or size "
        "of instances), by outcome.",
        [
            Q(
                f"sum by (Hostname, action, outcome) (increase(flexmig_actions_total{{{HOST}, {_MOVES}}}[{_RI}]))",
                "{{Hostname}} {{action}} {{outcome}}",
            )
        ],
        bars=True,
        stacked=True,
    ),
    w=12,
)
g.add(
    timeseries(
        "Job downtime per move (p50, p95)",
        "The job's own downtime in a migrate or resplit, as its hook reports it: its last step before the checkpoint "
        "to its first step after the move (flexmig's share of it: flexmig_move_pause_seconds).",
        [
            Q(_quantile(0.5, "flexmig_job_downtime_seconds"), "p50 {{Hostname}} {{action}}"),
            Q(_quantile(0.95, "flexmig_job_downtime_seconds"), "p95 {{Hostname}} {{action}}"),
        ],
        "s",
        min_value=0,
    ),
    w=12,
)
g.add(
    timeseries(
        "Action duration and mean downtime",
        "Wall time of each kind of action (first journalled step to last), p95 and mean, and the mean job "
        "downtime per move.",
        [
            Q(_quantile(0.95, "flexmig_action_duration_seconds"), "p95 duration {{Hostname}} {{action}}"),
            Q(_mean("flexmig_job_downtime_seconds"), "mean downtime {{Hostname}} {{action}}"),
            Q(_mean("flexmig_action_duration_seconds"), "mean duration {{Hostname}} {{action}}"),
        ],
        "s",
        min_value=0,
    ),
    w=12,
)
g.add(
    table(
        "Outcomes by kind (time range)",
        "Actions in the time range, by kind and outcome.",
        [Q(f"sum by (Hostname, action, outcome) (increase(flexmig_actions_total{{{HOST}}}[$__range])) > 0")],
        rename={"Value": "actions"},
    ),
    w=12,
)

g.row("What the actions change")
g.add(
    timeseries(
        "MIG layout changes",
        "MIG instances created and destroyed per interval, per GPU, whoever made the change (flexmig's own "
        "actions, nvidia-smi, mig-parted), and the instances there are: every create, destroy, migration and "
        "re-split shows here (and as an annotation on every graph).",
        [
            Q(
                f"sum by (Hostname, gpu, change) (increase(flexmig_gpu_instance_changes_total{{{GPU}}}[{_RI}]))",
                "{{Hostname}} gpu {{gpu}} {{change}}",
            ),
            Q(f"sum by (Hostname) (flexmig_gpu_mig_instances{{{GPU}}})", "{{Hostname}} instances"),
        ],
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "Recoverable capacity",
        "What act mode repairs: per GPU, the compute slices that repacking the running instances would make "
        "usable by a profile the demand mix asks for (a fragmentation finding starts at 2 of 7 by default), and "
        "the node's sum.",
        [
            Q(f"flexmig_gpu_recoverable_compute_slices{{{GPU}}}", "{{Hostname}} gpu {{gpu}}"),
            Q(f"flexmig_node_recoverable_compute_slices{{{HOST}}}", "{{Hostname}} node"),
        ],
        min_value=0,
    ),
    w=8,
)
g.add(
    timeseries(
        "Jobs by state",
        "Jobs registered with the actuator: pending, running, stopped, failed, done.",
        [Q(f"sum by (Hostname, state) (flexmig_jobs{{{HOST}}})", "{{Hostname}} {{state}}")],
        min_value=0,
        stacked=True,
    ),
    w=8,
)

dashboard = make_dashboard(
    "flexmig: actions",
    "flexmig-actions",
    "Migrations, re-splits and other actuator actions: outcomes, durations, job downtime.",
    g,
    [host_variable(), gpu_variable()],
)
