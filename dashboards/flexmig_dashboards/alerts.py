"""Prometheus alerting rules for flexmig, written out as ``dashboards/rules/flexmig.rules.yml``.

Defined here, beside the dashboards, so they use the same metric catalogue; ``dashboards/build.py`` writes the
YAML (strings JSON-quoted, which YAML reads unchanged; expressions as literal blocks). Thresholds and ``for:``
durations are starting points: the defaults of flexmig's own detection already carry hysteresis, so most rules
only add "and it has lasted long enough to wake someone".

The daemon-down rules assume the scrape job is called ``flexmig`` (docs/metrics.md: Scrape flexmigd and load the
alert rules).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["GROUPS", "JOB", "Group", "Rule", "render_rules", "rules_document"]

JOB = "flexmig"
"""The Prometheus job name the rules expect for flexmigd targets."""

_INST = "{{ $labels.Hostname }} GPU {{ $labels.gpu }} GI {{ $labels.GPU_I_ID }} ({{ $labels.GPU_I_PROFILE }})"
_NODE_DASH = "/d/flexmig-node"
_INST_DASH = "/d/flexmig-instance"
_DAEMON_DASH = "/d/flexmig-daemon"
_ACTIONS_DASH = "/d/flexmig-actions"


@dataclass(frozen=True, slots=True)
class Rule:
    """One alerting rule."""

    alert: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    dashboard: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def all_labels(self) -> dict[str, str]:
        """Labels the alert carries: ``severity`` and any extra ones."""
        return {"severity": self.severity, **self.labels}

    def annotations(self) -> dict[str, str]:
        """``summary``, ``description`` and the dashboard to open (a path under Grafana's URL)."""
        out = {"summary": self.summary, "description": self.description}
        if self.dashboard:
            out["dashboard"] = self.dashboard
        return out

    def document(self) -> dict[str, object]:
        """The rule as Prometheus's rules file has it."""
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": self.all_labels(),
            "annotations": self.annotations(),
        }


@dataclass(frozen=True, slots=True)
class Group:
    """A rule group (evaluated together, at Prometheus's ``evaluation_interval``)."""

    name: str
    rules: tuple[Rule, ...]


GROUPS: tuple[Group, ...] = (
    Group(
        "flexmig-daemon",
        (
            Rule(
                "FlexmigDaemonDown",
                f'up{{job="{JOB}"}} == 0',
                "2m",
                "critical",
                "flexmigd on {{ $labels.instance }} is not answering scrapes",
                "Prometheus could not scrape flexmigd at {{ $labels.instance }} for 2 minutes: no MIG telemetry, "
                "findings or actions from this node. Check `systemctl status flexmigd` and "
                "`journalctl -u flexmigd` on the node.",
                _DAEMON_DASH,
            ),
            Rule(
                "FlexmigDaemonAbsent",
                f'absent(up{{job="{JOB}"}})',
                "10m",
                "warning",
                "No flexmigd target is scraped at all",
                f'Prometheus has no target in job "{JOB}": the scrape configuration lost it (or names the job '
                "differently from these rules).",
            ),
            Rule(
                "FlexmigSamplingStalled",
                "time() - flexmig_last_sweep_timestamp_seconds > 60",
                "2m",
                "critical",
                "flexmigd on {{ $labels.Hostname }} serves metrics but stopped sampling",
                "The last sampling sweep is {{ $value | humanizeDuration }} old: the NVML thread is wedged (the "
                "systemd watchdog restarts the daemon when it runs under systemd).",
                _DAEMON_DASH,
            ),
            Rule(
                "FlexmigSamplingErrors",
                "sum by (Hostname, source) (rate(flexmig_source_errors_total[5m])) > 0",
                "10m",
                "warning",
                "flexmigd on {{ $labels.Hostname }} fails to read {{ $labels.source }}",
                "Reads of the {{ $labels.source }} telemetry source have failed for 10 minutes "
                '({{ $value | printf "%.2f" }}/s): those figures are missing from the node\'s series.',
                _DAEMON_DASH,
            ),
            Rule(
                "FlexmigNvmlErrors",
                "sum by (Hostname, call, error) (rate(flexmig_nvml_errors_total[5m])) > 0",
                "15m",
                "warning",
                "NVML call {{ $labels.call }} fails with {{ $labels.error }} on {{ $labels.Hostname }}",
                "{{ $labels.call }} has failed with {{ $labels.error }} for 15 minutes "
                '({{ $value | printf "%.2f" }}/s); the field it reads is absent from the metrics.',
                _DAEMON_DASH,
            ),
            Rule(
                "FlexmigGpuLost",
                "flexmig_gpu_lost == 1",
                "1m",
                "critical",
                "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} fell off the bus",
                "NVML reports GPU {{ $labels.gpu }} ({{ $labels.UUID }}) lost (GPU_IS_LOST); its MIG instances are "
                "gone from flexmig's view until it comes back. Check `dmesg` for Xid errors.",
                _NODE_DASH,
            ),
            Rule(
                "FlexmigMqttDisconnected",
                "flexmig_mqtt_connected == 0",
                "10m",
                "warning",
                "flexmigd on {{ $labels.Hostname }} cannot reach its MQTT broker",
                "No MQTT session for 10 minutes; events wait in the outbox (depth in flexmig_mqtt_outbox_events) "
                "and are sent when the broker is back.",
                _DAEMON_DASH,
            ),
            Rule(
                "FlexmigMqttEventsDropped",
                "increase(flexmig_mqtt_events_dropped_total[15m]) > 0",
                "0m",
                "warning",
                "flexmigd on {{ $labels.Hostname }} dropped MQTT events",
                "The outbox was full and dropped {{ $value | humanize }} event(s), oldest first, in 15 minutes.",
                _DAEMON_DASH,
            ),
        ),
    ),
    Group(
        "flexmig-findings",
        (
            Rule(
                "FlexmigMigInstanceIdle",
                "flexmig_mig_idle_seconds "
                'and on(Hostname, gpu, GPU_I_ID, GPU_CI_ID) (flexmig_mig_finding{finding="idle"} == 1)',
                "30m",
                "info",
                f"MIG instance {_INST} is idle",
                "No process has run on this instance for the idle window ([detect] underuse_window_s) plus 30 "
                "minutes (idle for {{ $value | humanizeDuration }}): its slices could host another job.",
                _INST_DASH,
            ),
            Rule(
                "FlexmigMigInstanceUnderused",
                'flexmig_mig_finding{finding="underused"} == 1',
                "30m",
                "warning",
                f"MIG instance {_INST} is underused",
                "The job on this instance has used little of its SMs and memory (below the [detect] thresholds) "
                "for the underuse window plus 30 minutes.",
                _INST_DASH,
            ),
            Rule(
                "FlexmigMigInstanceOversized",
                '(flexmig_mig_finding{finding="oversized"} == 1) * on(Hostname, gpu, GPU_I_ID, GPU_CI_ID) '
                "group_left(suggested_profile) flexmig_mig_suggested_profile_info",
                "30m",
                "info",
                f"MIG instance {_INST} is bigger than its job needs",
                "The job's p95 SM use and memory fit {{ $labels.suggested_profile }} with headroom; a migration "
                "there frees slices.",
                _INST_DASH,
            ),
            Rule(
                "FlexmigGpuFragmented",
                "flexmig_gpu_recoverable_compute_slices "
                'and on(Hostname, gpu) (flexmig_gpu_finding{finding="fragmentation"} == 1)',
                "15m",
                "warning",
                "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is fragmented",
                "Repacking the running instances would make {{ $value }} compute slices usable by a profile the "
                "demand mix asks for (the node dashboard's creatable now vs if repacked says which); the fragmentation "
                "finding has "
                "held for its window plus 15 minutes. In act mode the planner migrates jobs to do so.",
                _NODE_DASH,
            ),
            Rule(
                "FlexmigNodeCapacityStranded",
                "sum by (Hostname) (flexmig_gpu_recoverable_compute_slices "
                'and on(Hostname, gpu) (flexmig_gpu_finding{finding="fragmentation"} == 1)) >= 4',
                "1h",
                "info",
                "{{ $value }} compute slices are stranded on {{ $labels.Hostname }}",
                "Repacking the running instances of the node's fragmented GPUs would make {{ $value }} compute "
                "slices usable by profiles the demand mix asks for, for an hour now; in act mode the planner "
                "migrates jobs to do so.",
                _NODE_DASH,
            ),
        ),
    ),
    Group(
        "flexmig-actions",
        (
            Rule(
                "FlexmigActionFailed",
                'sum by (Hostname, action) (increase(flexmig_actions_total{outcome="failed"}[15m])) > 0',
                "0m",
                "warning",
                "A flexmig {{ $labels.action }} failed on {{ $labels.Hostname }}",
                "{{ $value | humanize }} {{ $labels.action }} action(s) failed in 15 minutes and were rolled back "
                "or left the job stopped: see `flexmig jobs list` and the action_failed events.",
                _ACTIONS_DASH,
            ),
            Rule(
                "FlexmigActionsCancelled",
                'sum by (Hostname, action) (increase(flexmig_actions_total{outcome="cancelled"}[1h])) >= 3',
                "0m",
                "info",
                "flexmig keeps cancelling {{ $labels.action }} on {{ $labels.Hostname }}",
                "{{ $value | humanize }} {{ $labels.action }} actions were cancelled in an hour, usually because "
                "a job did not acknowledge its checkpoint in time (jobs.ack_timeout_s).",
                _ACTIONS_DASH,
            ),
        ),
    ),
)


def rules_document() -> dict[str, object]:
    """The rules file as data (what a YAML parser must read back from :func:`render_rules`)."""
    return {"groups": [{"name": g.name, "rules": [r.document() for r in g.rules]} for g in GROUPS]}


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _lines() -> Iterator[str]:
    yield "# flexmig alerting rules. Generated by dashboards/build.py from dashboards/flexmig_dashboards/alerts.py;"
    yield "# edit that file and regenerate. Load with rule_files in prometheus.yml (docs/metrics.md: Scrape flexmigd"
    yield f'# and load the alert rules). The daemon-down rules expect the scrape job to be named "{JOB}".'
    yield "groups:"
    for g in GROUPS:
        yield f"  - name: {_q(g.name)}"
        yield "    rules:"
        for r in g.rules:
            yield f"      - alert: {r.alert}"
            yield "        expr: |-"
            yield from (f"          {line}" for line in r.expr.splitlines())
            yield f"        for: {r.for_}"
            yield "        labels:"
            yield from (f"          {k}: {_q(v)}" for k, v in r.all_labels().items())
            yield "        annotations:"
            yield from (f"          {k}: {_q(v)}" for k, v in r.annotations().items())


def render_rules() -> str:
    """The rules file's text."""
    return "\n".join(_lines()) + "\n"
