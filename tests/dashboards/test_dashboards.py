"""The Grafana dashboards under dashboards/: generated from their grafanalib definitions, checked in byte for byte,
every query valid PromQL over metrics flexmig (or dcgm-exporter, or Prometheus) really has, laid out on Grafana's
grid, and filtered by host, GPU and MIG instance. What they show against a live node: test_dashboards_prometheus.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flexmig.metrics import families as catalogue
from support.dashboards import (
    DASHBOARDS,
    NEEDS_SAID,
    RULES,
    STATIC_VALUES,
    alerts,
    all_panels,
    annotation_queries,
    build,
    committed,
    declared_needs,
    metrics,
    panel_queries,
    promql,
    promtool_parse_errors,
    variable_queries,
)
from support.prometheus import PROMTOOL

needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool (Debian package prometheus)")
DASHBOARD_FILES = ("flexmig-actions.json", "flexmig-daemon.json", "flexmig-instance.json", "flexmig-node.json")
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


# ------------------------------------------------------------------------------------------- generation


def test_regenerating_gives_the_committed_files_byte_for_byte() -> None:
    generated = build.outputs()
    assert sorted(p.name for p in generated if p.suffix == ".json") == sorted(DASHBOARD_FILES)
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(DASHBOARD_FILES), "a JSON without definition"
    for path, text in generated.items():
        assert path.read_bytes() == text.encode(), f"{path} differs from its definition: run dashboards/build.py"


@pytest.mark.integration
def test_grafanalib_generate_dashboard_writes_the_same_bytes(tmp_path: Path) -> None:
    tool = Path(sys.executable).with_name("generate-dashboard")
    for definition in build.definitions():
        out = tmp_path / build.json_path(definition).name
        done = subprocess.run(
            [str(tool), "-o", str(out), str(definition)],
            check=False,
            env={**os.environ, "PYTHONPATH": str(DASHBOARDS)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert out.read_bytes() == build.json_path(definition).read_bytes(), definition.name


@pytest.mark.integration
def test_build_check_fails_naming_a_stale_file_and_writes_nothing(tmp_path: Path) -> None:
    copy = tmp_path / "dashboards"
    shutil.copytree(DASHBOARDS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    script = [sys.executable, str(copy / "build.py"), "--check"]
    assert subprocess.run(script, check=False, capture_output=True, timeout=60).returncode == 0
    stale = copy / "flexmig-node.json"
    stale.write_text(stale.read_text().replace("flexmig: node overview", "edited by hand"))
    done = subprocess.run(script, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "flexmig-node.json is stale" in done.stderr
    assert "edited by hand" in stale.read_text()


# ------------------------------------------------------------------------------------------- queries


@pytest.mark.integration
@needs_promtool
def test_every_panel_query_and_variable_selector_parses_with_promtool(tmp_path: Path) -> None:
    exprs = {q.id: promql.substitute(q.expr, STATIC_VALUES) for q in [*panel_queries(), *annotation_queries()]}
    for board, var, selector, _ in variable_queries():
        exprs[f"{board}: variable {var}"] = promql.substitute(selector, STATIC_VALUES)
    assert len(exprs) > 100
    assert promtool_parse_errors(exprs, tmp_path, PROMTOOL) == ""


@pytest.mark.integration
@needs_promtool
def test_the_promtool_check_reports_a_broken_query_by_its_panel(tmp_path: Path) -> None:
    errors = promtool_parse_errors({"board.json: Broken panel: A": "sum(rate(x[5m])"}, tmp_path, PROMTOOL)
    assert "Broken panel" in errors and "parse error" in errors


def test_every_metric_a_query_reads_is_in_the_catalogue() -> None:
    known = metrics.by_sample_name()
    used = {q.id: promql.metric_names(q.expr) for q in [*panel_queries(), *annotation_queries()]}
    used |= {f"{b}: variable {v}": promql.metric_names(s) for b, v, s, _ in variable_queries()}
    used |= {f"rule {r.alert}": promql.metric_names(r.expr) for g in alerts.GROUPS for r in g.rules}
    unknown = {where: sorted(names - known.keys()) for where, names in used.items() if names - known.keys()}
    assert unknown == {}
    assert all(names for names in used.values()), "a query that reads no metric"


def test_every_variable_a_query_uses_is_defined_on_its_dashboard() -> None:
    for name, board in committed().items():
        defined = {v["name"] for v in board["templating"]["list"]} | GRAFANA_BUILTINS
        for q in panel_queries():
            if q.dashboard == name:
                assert promql.variables_in(q.expr) <= defined, q.id
        for var in board["templating"]["list"]:
            assert promql.variables_in(var["query"]) <= defined, f"{name}: variable {var['name']}"


def test_every_dashboard_filters_by_host_and_the_instance_dashboard_by_gpu_and_instance() -> None:
    boards = committed()
    for name, board in boards.items():
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:2] == ["datasource", "Hostname"], name
    instance = [v["name"] for v in boards["flexmig-instance.json"]["templating"]["list"]]
    assert instance == ["datasource", "Hostname", "gpu", "GPU_I_ID", "mig_uuid"]
    for q in [*panel_queries(), *annotation_queries()]:
        assert "$Hostname" in q.expr, q.id
        if q.dashboard == "flexmig-instance.json" and not q.panel.startswith("annotation "):
            assert '$gpu"' in q.expr and '$GPU_I_ID"' in q.expr and '$mig_uuid"' in q.expr, q.id


def test_the_mig_uuid_variable_lists_the_uuids_of_the_selected_gpu_instances() -> None:
    # from a family every detail exports, so the variables list the instances at minimal too
    board = committed()["flexmig-instance.json"]
    (var,) = [v for v in board["templating"]["list"] if v["name"] == "mig_uuid"]
    assert catalogue.by_name("flexmig_mig_memory_total_bytes").level == "minimal"
    assert var["query"] == (
        "label_values(flexmig_mig_memory_total_bytes"
        '{Hostname=~"$Hostname", gpu=~"$gpu", GPU_I_ID=~"$GPU_I_ID"}, mig_uuid)'
    )


def test_every_dashboard_marks_actions_and_layout_changes_from_flexmig_s_own_metrics() -> None:
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for name, board in committed().items():
        marks = {a["name"]: a for a in board["annotations"]["list"] if not a.get("builtIn")}
        assert set(marks) == {"flexmig actions", "flexmig actions failed or cancelled", "MIG layout changes"}, name
        assert all(a["datasource"] == ref and a["enable"] and a["titleFormat"] for a in marks.values()), name
        assert "flexmig_actions_total" in promql.metric_names(marks["flexmig actions"]["expr"])
        assert "flexmig_gpu_instance_changes_total" in promql.metric_names(marks["MIG layout changes"]["expr"])


def test_temperature_and_power_panels_carry_the_thresholds_of_nvidia_s_dcgm_dashboard() -> None:
    board = committed()["flexmig-node.json"]
    panels = {p["title"]: p for p in all_panels(board)}

    def steps(title: str) -> list[tuple[str, float | None]]:
        return [(s["color"], s["value"]) for s in panels[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]]

    for title in ("Temperature", "Hottest GPU"):
        assert steps(title) == [("green", None), ("#EAB839", 83), ("red", 87)], title
    for title in ("Power draw, share of the limit", "Power draw of the limit"):
        assert steps(title) == [("green", None), ("#EAB839", 0.75), ("red", 0.92)], title
    for title in ("Temperature", "Power draw, share of the limit"):
        assert panels[title]["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed+area"


def test_the_variables_default_to_all_of_each_multi_value() -> None:
    for name, board in committed().items():
        for var in board["templating"]["list"][1:]:
            assert var["multi"] and var["includeAll"] and var["allValue"] == ".*", f"{name}: {var['name']}"
            assert var["current"]["value"] == ["$__all"]
            assert var["refresh"] == 2, "hosts, GPUs and instances come and go: refresh on time range change"


def test_activity_and_memory_panels_overlay_dcgm_series_of_both_naming_eras_joined_on_the_instance() -> None:
    overlays = {
        "SM active": {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"},
        "SM occupancy": {"DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"},
        "DRAM active": {"DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO"},
        "Tensor active": {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"},
        "Graphics engine active": {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"},
        "Memory used": {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES"},
    }
    queries = [q for q in panel_queries() if q.dashboard == "flexmig-instance.json"]
    for title, dcgm in overlays.items():
        mine = [q for q in queries if q.panel == title]
        ours = [q for q in mine if any(n.startswith("flexmig_mig_") for n in promql.metric_names(q.expr))]
        theirs = [q for q in mine if dcgm <= promql.metric_names(q.expr)]
        assert ours and len(theirs) == 1, title
        assert "on(Hostname, gpu, GPU_I_ID)" in theirs[0].expr
        assert '"Hostname", "$1", "hostname"' in theirs[0].expr, "dcgm-exporter >= 4.8.3 spells it hostname"


def test_the_slice_map_draws_each_of_the_eight_memory_slices_of_every_gpu() -> None:
    slices = [q for q in panel_queries() if q.panel.startswith("Slice map")]
    assert [q.expr for q in slices] == [promql.slice_occupant(s) for s in range(8)]
    board = committed()["flexmig-node.json"]
    (panel,) = [p for p in all_panels(board) if p["title"].startswith("Slice map")]
    assert panel["type"] == "state-timeline"
    shown = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {shown[v]["text"] for v in ("0", "1", "2", "3", "4", "7")} == {"free", "1g", "2g", "3g", "4g", "7g"}


# ------------------------------------------------------------------------------------------- layout


def test_panels_have_unique_ids_and_sit_on_the_24_column_grid_without_overlap() -> None:
    for name, board in committed().items():
        panels = list(all_panels(board))
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), name
        cells: set[tuple[int, int]] = set()
        for p in panels:
            pos = p["gridPos"]
            assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, (name, p["title"])
            mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
            assert not mine & cells, (name, p["title"], "overlaps another panel")
            cells |= mine


def test_every_panel_and_target_reads_the_datasource_variable() -> None:
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for name, board in committed().items():
        (ds,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        for var in board["templating"]["list"][1:]:
            assert var["datasource"] == ref
        for p in all_panels(board):
            if p["type"] == "row":
                continue
            assert p["datasource"] == ref, (name, p["title"])
            assert p["targets"] and all(t["datasource"] == ref for t in p["targets"]), (name, p["title"])


def test_panels_are_core_grafana_10_and_11_panels_with_titles_and_descriptions() -> None:
    core = {"row", "timeseries", "stat", "table", "state-timeline"}
    for name, board in committed().items():
        assert board["schemaVersion"] == 39 and board["uid"] == name.removesuffix(".json")
        for p in all_panels(board):
            assert p["type"] in core, (name, p["title"], p["type"])
            assert p["title"]
            if p["type"] != "row":
                assert p["description"], (name, p["title"])


def test_dashboard_uids_match_the_links_in_the_alert_annotations() -> None:
    uids = {board["uid"] for board in committed().values()}
    links = {r.dashboard.removeprefix("/d/") for g in alerts.GROUPS for r in g.rules if r.dashboard}
    assert links <= uids


# ------------------------------------------------------------------------------------------- catalogue


def test_the_catalogue_lists_each_metric_once_and_all_are_exported_now() -> None:
    families = [(m.family, m.kind) for m in metrics.METRICS]
    assert len(families) == len(set(families))
    assert metrics.planned() == ()  # the actuator's action and job metrics are flexmigd's since it runs the actuator
    assert {m.family for m in metrics.METRICS if m.source == "actuator"} == {
        "flexmig_actions",
        "flexmig_action_duration_seconds",
        "flexmig_job_downtime_seconds",
        "flexmig_actions_in_progress",
        "flexmig_jobs",
    }


def test_every_metric_in_the_catalogue_is_read_by_a_dashboard_or_a_rule() -> None:
    used = set().union(*(promql.metric_names(q.expr) for q in [*panel_queries(), *annotation_queries()]))
    used |= set().union(*(promql.metric_names(r.expr) for g in alerts.GROUPS for r in g.rules))
    unused = [m.family for m in metrics.METRICS if not set(m.names) & used]
    assert unused == []


def test_metric_names_reads_names_not_functions_labels_keywords_or_durations() -> None:
    expr = (
        'sum by (Hostname, le) (rate(flexmig_x_bucket{a="b", c=~"$d"}[5m] offset 1h)) '
        "/ on(Hostname) group_left(gpu) max_over_time(flexmig_y[1d]) "
        'and bool up or label_replace(z, "a", "$1", "b", "c")'
    )
    assert promql.metric_names(expr) == {"flexmig_x_bucket", "flexmig_y", "up", "z"}


def test_substitute_fills_every_variable_and_names_a_missing_one() -> None:
    done = promql.substitute('rate(x{h=~"$Hostname", g=~"${gpu}"}[$__rate_interval])', STATIC_VALUES)
    assert done == 'rate(x{h=~"gpu-node-7", g=~"0"}[1m])'
    assert (
        promql.substitute('label_replace(x, "a", "$1", "b", "(.+)")', {}) == 'label_replace(x, "a", "$1", "b", "(.+)")'
    )
    with pytest.raises(KeyError, match=r"\$node"):
        promql.substitute("x{n=~'$node'}", STATIC_VALUES)


# ------------------------------------------------------------------------------------------- provisioning


def test_the_dashboard_provider_reads_the_folder_the_docs_copy_the_json_to() -> None:
    doc = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards" / "flexmig.yaml").read_text())
    (provider,) = doc["providers"]
    assert doc["apiVersion"] == 1 and provider["type"] == "file"
    folder = provider["options"]["path"]
    docs = (DASHBOARDS.parent / "docs" / "metrics.md").read_text()
    assert f"dashboards/flexmig-*.json {folder}/" in docs
    assert "dashboards/provisioning/dashboards/flexmig.yaml /etc/grafana/provisioning/dashboards/" in docs


def test_the_datasource_file_provisions_a_prometheus() -> None:
    doc = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    (ds,) = doc["datasources"]
    assert doc["apiVersion"] == 1 and ds["type"] == "prometheus" and ds["url"].startswith("http")
    assert ds["jsonData"]["timeInterval"], "$__rate_interval needs the scrape interval"


@pytest.mark.integration
@needs_promtool
def test_the_example_prometheus_configuration_passes_promtool_with_the_rules(tmp_path: Path) -> None:
    text = (DASHBOARDS / "provisioning" / "prometheus" / "prometheus.yml").read_text()
    doc = yaml.safe_load(text)
    assert doc["scrape_configs"][0]["job_name"] == alerts.JOB
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/flexmig.rules.yml", str(RULES)))
    done = subprocess.run(
        [PROMTOOL, "check", "config", str(config)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and f"{sum(len(g.rules) for g in alerts.GROUPS)} rules found" in done.stdout


def test_the_dashboards_are_valid_json_for_the_grafana_import_dialog() -> None:
    for name in DASHBOARD_FILES:
        board = json.loads((DASHBOARDS / name).read_text())
        assert board["id"] is None and board["title"].startswith("flexmig: "), name


@pytest.mark.integration
@needs_promtool
def test_duration_and_downtime_panels_draw_a_gap_not_nan_for_an_action_that_did_not_run(tmp_path: Path) -> None:
    # every histogram query of the actions dashboard, over a node where each action ran once long ago: nothing in
    # the window, so promtool must see an empty result (a NaN sample would fail the expectation)
    queries = [
        q
        for q in panel_queries()
        if {n for n in promql.metric_names(q.expr) if n.endswith(("_bucket", "_sum", "_count"))}
    ]
    assert len(queries) >= 5
    series = []
    for family in ("flexmig_action_duration_seconds", "flexmig_job_downtime_seconds"):
        labels = 'Hostname="gpu-node-7", action="migrate"'
        series += [{"series": f'{family}_bucket{{{labels}, le="{le}"}}', "values": "1x30"} for le in ("0.5", "+Inf")]
        series += [{"series": f"{family}_sum{{{labels}}}", "values": "0.3x30"}]
        series += [{"series": f"{family}_count{{{labels}}}", "values": "1x30"}]
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": promql.substitute(q.expr, STATIC_VALUES), "eval_time": "20m", "exp_samples": []}
                for q in queries
            ],
        }
    ]
    path = tmp_path / "nan.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_need_a_row_or_dashboard_names_is_known_and_said_in_its_description() -> None:
    # a row that needs something says it in its title, (needs a, b), and in its description: the test at each detail
    # (test_dashboards_prometheus.py) excuses an empty panel only by such a declaration
    needs = importlib.import_module("flexmig_dashboards.panels").NEEDS  # grafanalib's module: untyped, not checked
    assert set(needs) == set(NEEDS_SAID), "the generator's needs and the tests' vocabulary differ"
    declared = 0
    for name, board in committed().items():
        places = [(board["title"], board.get("description") or "")]
        places += [(p["title"], p.get("description") or "") for p in board["panels"] if p["type"] == "row"]
        for title, description in places:
            if "(needs " not in title:
                assert not description.startswith("Needs "), f"{name}: {title!r} says a need its title does not"
                continue
            named = {n.strip() for n in title.split("(needs ", 1)[1].split(")", 1)[0].split(",")}
            assert named <= set(needs), f"{name}: {title!r} names an unknown need"
            assert declared_needs(title, description) == named, f"{name}: {title!r}: its description does not say it"
            declared += 1
    assert declared >= 5


def test_a_need_counts_only_when_the_title_and_the_description_both_say_it() -> None:
    said = 'Needs `[prometheus] detail = "full"`; dcgm-exporter on the node. Activity.'
    assert declared_needs("Activity (needs detail full, dcgm-exporter)", said) == {"detail full", "dcgm-exporter"}
    assert declared_needs("Activity (needs detail full)", "Activity.") == set()
    assert declared_needs("Activity", said) == set()
    assert declared_needs("Activity (needs detail standard)", said) == set()
