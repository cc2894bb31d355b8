"""flexmig's Prometheus alerting rules (dashboards/rules/flexmig.rules.yml): promtool accepts them, their unit tests
pass under promtool, the YAML says exactly what the Python definition says, and they cover what operators need
to hear about. How they evaluate against a live node: test_dashboards_prometheus.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from flexmig.detect import (
    DEFAULT_DEMAND,
    DemandMix,
    DetectSettings,
    DetectState,
    Observation,
    gpu_fragmentation,
    observe,
)
from flexmig.mig import H200, Layout
from support.dashboards import RULES, RULES_TEST, alerts, metrics, promql
from support.prometheus import PROMTOOL

pytestmark = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool (Debian package prometheus)")

RULES_LIST = [r for g in alerts.GROUPS for r in g.rules]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], check=False, capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.integration
def test_the_rules_file_passes_promtool_check_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(RULES_LIST)} rules found" in done.stdout


@pytest.mark.integration
def test_promtool_check_rules_rejects_a_broken_rule(tmp_path: Path) -> None:
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(RULES.read_text().replace("flexmig_gpu_lost == 1", "flexmig_gpu_lost == (1", 1))
    done = promtool("check", "rules", str(broken))
    assert done.returncode == 1 and "FlexmigGpuLost" in done.stderr


@pytest.mark.integration
def test_the_rules_unit_tests_pass_under_promtool_test_rules() -> None:
    done = promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_unit_tests_exercise_every_alert() -> None:
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert tested == {r.alert for r in RULES_LIST}


def test_the_rules_file_reads_back_as_its_python_definition() -> None:
    assert yaml.safe_load(RULES.read_text()) == alerts.rules_document()


def test_every_alert_waits_a_for_duration_has_a_severity_and_says_what_and_why() -> None:
    for r in RULES_LIST:
        assert re.fullmatch(r"\d+[smh]", r.for_), r.alert
        assert r.severity in {"critical", "warning", "info"}, r.alert
        assert r.summary and len(r.description) >= 60, r.alert
        assert r.alert.startswith("Flexmig"), r.alert


def test_the_rules_cover_underuse_fragmentation_daemon_down_failed_actions_and_sampling_errors() -> None:
    reads = {r.alert: promql.metric_names(r.expr) for r in RULES_LIST}
    expected = {
        "FlexmigMigInstanceIdle": "flexmig_mig_finding",
        "FlexmigMigInstanceUnderused": "flexmig_mig_finding",
        "FlexmigGpuFragmented": "flexmig_gpu_recoverable_compute_slices",
        "FlexmigDaemonDown": "up",
        "FlexmigDaemonAbsent": "up",
        "FlexmigActionFailed": "flexmig_actions_total",
        "FlexmigSamplingErrors": "flexmig_source_errors_total",
        "FlexmigSamplingStalled": "flexmig_last_sweep_timestamp_seconds",
    }
    for alert, metric in expected.items():
        assert metric in reads[alert], alert
    assert 'finding="underused"' in next(r.expr for r in RULES_LIST if r.alert == "FlexmigMigInstanceUnderused")
    assert f'up{{job="{alerts.JOB}"}} == 0' in next(r.expr for r in RULES_LIST if r.alert == "FlexmigDaemonDown")


def test_no_rule_waits_for_a_metric_nobody_exports() -> None:
    planned = metrics.sample_names(exported=False)
    waiting = {r.alert for r in RULES_LIST if promql.metric_names(r.expr) & planned}
    assert waiting == set()  # the action rules read flexmigd's actuator metrics since it exports them


def test_the_fragmentation_rule_tests_feed_the_figures_detection_computes_for_the_demo_and_a_real_case() -> None:
    mix = DemandMix(DEFAULT_DEMAND)
    demo = Layout.of(H200, [("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)])
    real = Layout.of(H200, [("2g.35gb", 0), ("1g.18gb", 4)])
    figures = {
        name: (round(g.external_score, 2), g.recoverable_compute_slices)
        for name, g in (("demo", gpu_fragmentation(0, demo, mix)), ("real", gpu_fragmentation(1, real, mix)))
    }
    assert figures == {"demo": (1.0, 1), "real": (0.4, 4)}
    # under the default settings the demo layout never becomes a finding, the real case does after its window
    state, found = DetectState(), set()
    for now in (0.0, 30.0, 60.0, 90.0):
        state, report = observe(state, Observation(now=now, layouts={0: demo, 1: real}), DetectSettings())
        found |= {f.gpu for f in report.active}
    assert found == {1}
    text = RULES_TEST.read_text()
    for gpu, ratio, recoverable, finding in (("0", "1", "1", "0"), ("1", "0.4", "4", "1")):
        labels = f'{{Hostname="gpu-node-7", gpu="{gpu}"}}'
        assert f'flexmig_gpu_fragmentation_external_ratio{labels}\'\n        values: "{ratio}x30"' in text
        assert f'flexmig_gpu_recoverable_compute_slices{labels}\'\n        values: "{recoverable}x30"' in text
        finding_labels = f'{{Hostname="gpu-node-7", gpu="{gpu}", finding="fragmentation"}}'
        assert f'flexmig_gpu_finding{finding_labels}\'\n        values: "{finding}x30"' in text
