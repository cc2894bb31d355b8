"""The dashboards, alert rules and documented joins against a real Prometheus that scraped simulated nodes.

One stack for the module: ``flexmigd --sim h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6`` (``dash-node``, the demo layout;
its demo workload keeps the figures moving) and a second node ``flexmigd --sim h200x2:2g.35gb@4+1g.18gb@2``
(``dash-node-2``: a layout a repack would improve, and GPU instance 5 on GPU 0 and 1 like the first node's, so a
join on ``gpu`` and ``GPU_I_ID`` alone finds duplicates), both with MQTT on (a real mosquitto), detection windows
short enough for findings to appear within seconds, and dcgm-exporter on: one stand-in per node serving
dcgm-exporter's format (4.8.x: legacy field names, lowercase ``hostname``, its ``UUID``, ``pci_bus_id`` and
``device`` labels) for the same simulated GPUs, computed from the same deterministic workload, since the real
dcgm-exporter needs a GPU. Beside them a third flexmigd in mode act (``dash-node-act``, a simulated H200) keeps
submitting, migrating, re-splitting and stopping a job, so the actions dashboard has live actions to show; its
panels are queried for that host. Prometheus (1 s scrapes, OpenMetrics negotiated) scrapes all five, as job
``flexmig`` and ``dcgm-exporter``, and evaluates dashboards/rules/flexmig.rules.yml.

Every panel query then runs through Prometheus's HTTP API with the dashboard variables set to the first host,
GPU and MIG instance the variables' own queries return (the acting node's host for queries of the actuator's
metrics), and must return data. The only queries excused would be those that read a metric nobody exports yet
(``exported=False`` in the catalogue; none today); the test checks the catalogue against the live exposition in
both directions, so such a query is excused only while its metric is really absent, and the skip names it.

Beside them, three flexmigds on issue 45's node (``h200x2:3g.71gb@4+2g.35gb@0+1g.18gb@2+1g.18gb@3``), one per
``[prometheus] detail`` (``minimal``, ``standard`` by default, ``full``) with every other setting at its default but
detection's windows (no MQTT, no dcgm-exporter, observe mode): with the variables at *All* on each, a panel query
that stays empty must sit in a row or dashboard whose title and description declare a need (dashboards/
flexmig_dashboards/panels.py's NEEDS) that is why it is empty, and every per-GPU and per-instance family the
catalogue (and so docs/metrics.md's levels table) promises at that detail must reach Prometheus.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics import parser as om_parser

from flexmig import sim
from flexmig.metrics import families as catalogue
from flexmig.metrics.families import Level
from flexmig.nvml import Nvml
from flexmig.sim.workload import SyntheticWorkload
from support.dashboards import (
    DASHBOARDS,
    RULES,
    PanelQuery,
    annotation_queries,
    declared_needs,
    metrics,
    panel_queries,
    promql,
    render,
    variable_queries,
)
from support.flexmigd import ActNode, JobCycler, RunningDaemon, running_daemon
from support.jobs import kill_ranks
from support.mosquitto import MOSQUITTO, Mosquitto
from support.prometheus import PROMETHEUS, SPEC, api, http_get, prometheus, query
from support.wait import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus (Debian package prometheus)"),
    pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="mosquitto (Debian package mosquitto)"),
]

NODE = "dash-node"
NODE_2 = "dash-node-2"  # longer than NODE, so the $Hostname variable's first value stays NODE
SPEC_2 = "h200x2:2g.35gb@4+1g.18gb@2"  # a repack makes room for a 4g: recoverable 4 of 7 compute slices per GPU
ACT_NODE = "dash-node-act"  # longer than NODE, too
LEVEL_SPEC = "h200x2:3g.71gb@4+2g.35gb@0+1g.18gb@2+1g.18gb@3"  # issue 45's node: every slice held, four sizes
LEVEL_NODES = {level: f"{NODE}-{level}" for level in catalogue.LEVELS}  # longer than NODE, too
WHILE_FRAGMENTED = {"flexmig_gpu_finding_duration_seconds"}  # series only while a GPU is fragmented
DATA_S = 45.0  # the bound on waiting for one query's data (rate windows need a few scrapes)
WINDOWS = {"__rate_interval": "5s", "__interval": "1s", "__range": "1m"}
MIB = 1024 * 1024
# What Prometheus 2.42 sends when it scrapes: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


# ------------------------------------------------------------------------------------- dcgm-exporter stand-in


@dataclass(frozen=True)
class SimInstance:
    """A MIG instance of the simulated node, as dcgm-exporter labels it."""

    gpu: int
    gpu_uuid: str
    model: str
    gi: int
    profile: str
    start: int
    memory_bytes: int
    pci_bus_id: str


def sim_instances(spec: str) -> list[SimInstance]:
    """The instances flexmigd will create for ``spec`` (the simulator is deterministic in spec and seed)."""
    node = sim.install(spec)
    try:
        with Nvml.open() as nvml:  # the bus IDs as NVML reports them, which is where dcgm-exporter gets them
            buses = {g.index: g.pci_bus_id or "" for g in nvml.inventory().gpus}
        return [
            SimInstance(
                g.index, g.uuid, g.model.name, gi.id, gi.profile.name, gi.start, gi.memory_bytes, buses[g.index]
            )
            for g in node.gpus()
            for gi in g.gpu_instances
        ]
    finally:
        sim.uninstall()


def dcgm_exposition(instances: list[SimInstance], hostname: str, now: float) -> str:
    """What dcgm-exporter 4.8.x prints for these instances at ``now``: the demo workload's figures (the same
    pure functions of time flexmigd's simulator uses), legacy field names, its identity labels in its order
    (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``GPU_I_PROFILE``, ``GPU_I_ID``, ``hostname``)."""
    workload = SyntheticWorkload(seed=0)
    rows: dict[str, list[str]] = {}
    for i in instances:
        role = workload.role(i.gpu, i.start, i.profile)
        act = role.activity(now)
        used_mib = int(role.memory_fraction(now) * i.memory_bytes) // MIB
        labels = (
            f'gpu="{i.gpu}",UUID="{i.gpu_uuid}",pci_bus_id="{i.pci_bus_id}",device="nvidia{i.gpu}",'
            f'modelName="{i.model}",'
            f'GPU_I_PROFILE="{i.profile}",GPU_I_ID="{i.gi}",hostname="{hostname}",DCGM_FI_DRIVER_VERSION="570.124.06"'
        )
        for name, value in (
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", act.sm),
            ("DCGM_FI_PROF_SM_ACTIVE", act.sm),
            ("DCGM_FI_PROF_SM_OCCUPANCY", act.occupancy),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", act.tensor),
            ("DCGM_FI_PROF_DRAM_ACTIVE", act.dram),
            ("DCGM_FI_DEV_FB_USED", used_mib),
            ("DCGM_FI_DEV_FB_FREE", i.memory_bytes // MIB - used_mib),
        ):
            rows.setdefault(name, []).append(f"{name}{{{labels}}} {value}")
    lines = []
    for name, samples in rows.items():
        lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def serve_text(render: Callable[[], str]) -> Iterator[int]:
    """An HTTP server on a free loopback port answering every GET with ``render()``; yields the port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="dcgm-exporter stand-in", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# ------------------------------------------------------------------------------------------------ the stack


@dataclass(frozen=True)
class Stack:
    """The running stack: Prometheus's port, the flexmigds, and the metric families each exporter exposes."""

    prometheus: int
    daemon: RunningDaemon
    second: RunningDaemon
    flexmigd_families: frozenset[str]
    dcgm_names: frozenset[str]
    act: ActNode
    instances: int  # MIG instances of the two observed nodes (each has a dcgm-exporter stand-in)


def families(exposition: str) -> frozenset[str]:
    """Sample names of every family an exposition declares (``# TYPE``), whether or not it has samples yet."""
    out: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            if kind == "counter":  # written as x_total or x, depending on the client's version
                out.add(family if family.endswith("_total") else f"{family}_total")
            elif kind == "histogram":
                out.update(f"{family}_{part}" for part in ("bucket", "sum", "count"))
            else:
                out.add(family)
    return frozenset(out)


def write_config(path: Path, broker: str, dcgm_port: int, outbox: Path, node: str = NODE) -> Path:
    path.write_text(
        f'node_name = "{node}"\n'
        '[prometheus]\ndetail = "full"\n'  # the dashboards show every family at full (standard leaves some out)
        f'[mqtt]\nenabled = true\nbroker = "{broker}"\noutbox = "{outbox}"\n'
        f'[dcgm]\nenabled = true\nurl = "http://127.0.0.1:{dcgm_port}/metrics"\n'
        # findings within seconds: the idle instances, the oversized light job, the fragmented GPUs
        "[detect]\nunderuse_window_s = 1\nunderuse_exit_window_s = 1\noversize_window_s = 1\n"
        "fragmentation_window_s = 0\n"
    )
    path.chmod(0o600)
    return path


def write_level_config(path: Path, level: Level) -> Path:
    """A configuration that leaves everything at its default but the node's name, the detail (none written for
    the default, ``standard``) and detection's windows (findings within seconds, as above)."""
    detail = "" if level == "standard" else f'[prometheus]\ndetail = "{level}"\n'
    path.write_text(
        f'node_name = "{LEVEL_NODES[level]}"\n{detail}'
        "[detect]\nunderuse_window_s = 1\nunderuse_exit_window_s = 1\noversize_window_s = 1\n"
        "fragmentation_window_s = 0\n"
    )
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def level_nodes(work: Path) -> Iterator[dict[Level, RunningDaemon]]:
    """One flexmigd per detail level on issue 45's node, otherwise at the default configuration."""
    with contextlib.ExitStack() as stack:
        nodes = {}
        for level in catalogue.LEVELS:
            home = work / f"level-{level}"
            home.mkdir()
            config = write_level_config(home / "flexmig.toml", level)
            nodes[level] = stack.enter_context(running_daemon(home, LEVEL_SPEC, config))
        yield nodes


@pytest.fixture(scope="module")
def stack(broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("dashboards")
    instances, instances_2 = sim_instances(SPEC), sim_instances(SPEC_2)
    with (
        serve_text(lambda: dcgm_exposition(instances, NODE, time.monotonic())) as dcgm_port,
        serve_text(lambda: dcgm_exposition(instances_2, NODE_2, time.monotonic())) as dcgm_port_2,
    ):
        config = write_config(work / "flexmig.toml", broker.address, dcgm_port, work / "outbox.sqlite3")
        second = work / "second"
        second.mkdir()
        config_2 = write_config(second / "flexmig.toml", broker.address, dcgm_port_2, second / "outbox.sqlite3", NODE_2)
        with (
            running_daemon(work, SPEC, config) as daemon,
            running_daemon(second, SPEC_2, config_2) as daemon_2,
            acting_node(work / "act") as act,
            level_nodes(work) as levels,
        ):
            dcgm_targets = [f"127.0.0.1:{dcgm_port}", f"127.0.0.1:{dcgm_port_2}"]
            observed = (daemon, daemon_2, *levels.values())
            flexmig_targets = [f"127.0.0.1:{d.port}" for d in observed] + [f"127.0.0.1:{act.port}"]
            jobs = {"flexmig": flexmig_targets, "dcgm-exporter": dcgm_targets}
            with prometheus(work, jobs, rule_files=[RULES]) as port:
                wait_until(
                    lambda: len(query(port, "up == 1")) == 8, 60, "all eight targets up in Prometheus", every_s=0.2
                )
                # the families flexmigd declares once detection, MQTT and DCGM have all reported
                for d, node in ((daemon, NODE), (daemon_2, NODE_2)):
                    wait_until(
                        functools.partial(reported, d, node),
                        60,
                        f"{node}'s findings, MQTT and DCGM families",
                        every_s=0.2,
                    )
                dcgm_text = dcgm_exposition(instances, NODE, time.monotonic())
                yield Stack(
                    port,
                    daemon,
                    daemon_2,
                    families(daemon.metrics()),
                    families(dcgm_text),
                    act,
                    len(instances) + len(instances_2),
                )


def reported(daemon: RunningDaemon, node: str) -> bool:
    """True once ``daemon`` exports detection's, the MQTT publisher's and the DCGM source's series."""
    text = daemon.metrics()
    wanted = ("flexmig_mig_finding{", f'flexmig_mqtt_connected{{Hostname="{node}"}} 1.0', "flexmig_dcgm_up{")
    return all(f in text for f in wanted)


@contextlib.contextmanager
def acting_node(work: Path) -> Iterator[ActNode]:
    """A flexmigd in mode act on a simulated H200 whose job is moved around without pause (see the docstring)."""
    work.mkdir(mode=0o755)
    node = ActNode(work, "h200", node_name=ACT_NODE).start()
    cycler = JobCycler(node)
    cycler.start()
    try:
        wait_until(lambda: cycler.cycles >= 2, 60, "two rounds of actions", every_s=0.2)
        yield node
    finally:
        cycler.stop()
        try:
            assert node.stop() == 0
        finally:
            kill_ranks(node.journal, base=work)


@pytest.fixture(scope="module")
def values(stack: Stack) -> dict[str, str]:
    """Each dashboard variable set to the first value its own query returns (hosts, then GPUs, then instances),
    plus Grafana's interval variables sized for 1 s scrapes."""
    chosen: dict[str, str] = dict(WINDOWS)
    for name in ("Hostname", "gpu", "GPU_I_ID", "mig_uuid"):
        (selector, label) = next((s, lab) for _, v, s, lab in variable_queries() if v == name)
        path, match = f"label/{label}/values", promql.substitute(selector, chosen)
        found = wait_until(
            functools.partial(api, stack.prometheus, path, **{"match[]": match}),
            DATA_S,
            f"values of ${name}",
            every_s=0.2,
        )
        chosen[name] = sorted(found, key=lambda v: (len(v), v))[0]
    return chosen


# ------------------------------------------------------------------------------------------------ tests


def test_the_catalogue_says_which_metrics_flexmigd_exports(stack: Stack) -> None:
    exported = metrics.sample_names(exported=True, source="flexmigd")
    assert exported - stack.flexmigd_families == set(), "listed as exported, not in flexmigd's exposition"
    planned = metrics.sample_names(exported=False)
    assert planned & stack.flexmigd_families == set(), "flexmigd exports these now: mark them exported=True"
    legacy = {n for n in metrics.sample_names(source="dcgm-exporter") if not n.endswith(("_RATIO", "_BYTES"))}
    assert legacy <= stack.dcgm_names, "the stand-in serves every pre-4.9 field the dashboards overlay"


def test_the_variables_list_the_simulated_node_its_gpus_and_instances(stack: Stack, values: dict[str, str]) -> None:
    assert values["Hostname"] == NODE
    assert values["gpu"] == "0"
    match = f'flexmig_mig_memory_slices{{gpu="0", Hostname="{NODE}"}}'
    gis = api(stack.prometheus, "label/GPU_I_ID/values", **{"match[]": match})
    ids = sorted((str(i.gi) for i in sim_instances(SPEC) if i.gpu == 0), key=int)  # the driver's choice
    assert sorted(gis, key=int) == ids
    assert values["GPU_I_ID"] == ids[0]
    match = f'flexmig_mig_memory_slices{{gpu="0", GPU_I_ID="{ids[0]}", Hostname="{NODE}"}}'
    assert api(stack.prometheus, "label/mig_uuid/values", **{"match[]": match}) == [values["mig_uuid"]]
    assert values["mig_uuid"].startswith("MIG-")


@pytest.mark.parametrize("q", panel_queries(), ids=lambda q: q.id)
def test_every_panel_query_returns_data(stack: Stack, values: dict[str, str], q: PanelQuery) -> None:
    # dcgm-exporter's names of either era count as scraped: an overlay reads both, the stand-in serves one
    scraped = stack.flexmigd_families | metrics.sample_names(source="dcgm-exporter") | {"up", "scrape_duration_seconds"}
    missing = promql.metric_names(q.expr) - scraped
    if missing:
        planned = metrics.sample_names(exported=False)
        assert missing <= planned, f"{q.id}: reads {sorted(missing)}, which nobody exports and nothing plans"
        pytest.skip(f"reads {', '.join(sorted(missing))}: not exported by flexmigd yet (the actuator's, planned)")
    if promql.metric_names(q.expr) & metrics.sample_names(source="actuator"):
        values = {**values, "Hostname": ACT_NODE}  # the node that acts
    elif promql.metric_names(q.expr) & WHILE_FRAGMENTED:
        values = {**values, "Hostname": NODE_2}  # the demo layout is no fragmentation finding; NODE_2's GPUs are
    promql_text = promql.substitute(q.expr, values)
    result = wait_until(
        lambda: query(stack.prometheus, promql_text), DATA_S, f"data for {q.id}: {promql_text}", every_s=0.2
    )
    # never NaN: a mean or quantile of an action that did not run in the window is a gap, not 0/0
    assert all(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in result), result


def test_the_alert_rules_evaluate_without_errors_on_the_live_node(stack: Stack) -> None:
    def evaluated() -> list[dict[str, object]]:
        groups = api(stack.prometheus, "rules", type="alert")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules) else []

    rules = wait_until(evaluated, DATA_S, "every alert rule evaluated", every_s=0.2)
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert bad == {}


def test_the_fragmentation_alert_goes_pending_where_a_repack_pays_and_not_on_the_demo_layout(stack: Stack) -> None:
    # dash-node-2's GPUs hold 2g@4 + 1g@2: a repack makes room for a 4g (4 recoverable compute slices); the demo
    # layout of dash-node (3g@0 + 2g@4 + 1g@6) recovers a single slice, which is no finding; on dash-node's GPU 0
    # the 3g and the 1g run nothing (the demo workload's idle role)
    def pending() -> set[tuple[str, str, str, str]]:
        alerts = query(stack.prometheus, 'ALERTS{alertstate="pending"}')
        return {
            (a["metric"]["alertname"], a["metric"].get("Hostname", ""), a["metric"].get("gpu", ""),
             a["metric"].get("GPU_I_ID", ""))
            for a in alerts
        }  # fmt: skip

    idle_ids = {i.start: str(i.gi) for i in sim_instances(SPEC) if i.gpu == 0}  # the driver's IDs, by start
    want = {
        ("FlexmigGpuFragmented", NODE_2, "0", ""),
        ("FlexmigGpuFragmented", NODE_2, "1", ""),
        ("FlexmigMigInstanceIdle", NODE, "0", idle_ids[0]),
        ("FlexmigMigInstanceIdle", NODE, "0", idle_ids[6]),
    }
    wait_until(lambda: want <= pending(), DATA_S, f"pending alerts {sorted(want)}", every_s=0.2)
    recoverable = {
        r["metric"]["Hostname"]: float(r["value"][1])
        for r in query(
            stack.prometheus,
            f'max by (Hostname) (flexmig_gpu_recoverable_compute_slices{{Hostname=~"{NODE}|{NODE_2}"}})',
        )
    }
    assert recoverable == {NODE: 1.0, NODE_2: 4.0}
    fragmented = query(stack.prometheus, f'flexmig_gpu_finding{{Hostname="{NODE}", finding="fragmentation"}} == 1')
    assert fragmented == []
    assert not {a for a in pending() if a[0] == "FlexmigGpuFragmented" and a[1] == NODE}
    assert not {a for a in pending() if a[0] == "FlexmigDaemonDown"}


def test_every_scrape_of_flexmigd_is_healthy_and_negotiates_openmetrics(stack: Stack) -> None:
    def scraped_twice() -> list[dict[str, Any]]:
        targets = api(stack.prometheus, "targets", state="active")["activeTargets"]
        ours = [t for t in targets if t["labels"]["job"] == "flexmig"]
        return ours if len(ours) == 6 and all(t["lastScrape"].startswith("2") for t in ours) else []

    targets = wait_until(scraped_twice, DATA_S, "six scraped flexmigd targets", every_s=0.2)
    assert {(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets} == {
        (t["scrapeUrl"], "up", "") for t in targets
    }
    # Prometheus asks for OpenMetrics first: what each daemon answers it is valid OpenMetrics
    for t in targets:
        body, content_type = scrape_as_prometheus(t["scrapeUrl"])
        assert content_type.startswith("application/openmetrics-text"), content_type
        assert body.endswith("# EOF\n")
        list(om_parser.text_string_to_metric_families(body))  # type: ignore[no-untyped-call]


def scrape_as_prometheus(url: str) -> tuple[str, str]:
    """The body and content type of ``url`` fetched with the Accept header Prometheus 2.42 sends."""
    request = urllib.request.Request(url, headers={"Accept": PROMETHEUS_ACCEPT})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read().decode(), str(resp.headers["Content-Type"])


def documented_joins() -> list[str]:
    """The PromQL blocks of docs/metrics.md's "Joining with dcgm-exporter" section."""
    text = (DASHBOARDS.parent / "docs" / "metrics.md").read_text()
    section = text.split("## Joining with dcgm-exporter", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```promql\n(.*?)```", section, flags=re.DOTALL)


def test_the_documented_dcgm_joins_give_one_series_per_instance_of_both_nodes(stack: Stack) -> None:
    joins = documented_joins()
    assert len(joins) == 3

    def joined(expr: str) -> list[dict[str, Any]]:
        result = query(stack.prometheus, expr)
        return result if len(result) == stack.instances else []

    for expr in joins:
        result = wait_until(
            functools.partial(joined, expr), DATA_S, f"{stack.instances} joined series for {expr}", every_s=0.2
        )
        keys = {(r["metric"]["Hostname"], r["metric"]["gpu"], r["metric"]["GPU_I_ID"]) for r in result}
        assert len(keys) == stack.instances, expr
        assert {h for h, _, _ in keys} == {NODE, NODE_2}, expr


def test_a_join_on_gpu_and_gpu_instance_alone_fails_on_two_nodes(stack: Stack) -> None:
    naive = "flexmig_mig_sm_active_ratio - on(gpu, GPU_I_ID) group_left DCGM_FI_PROF_SM_ACTIVE"
    url = f"http://127.0.0.1:{stack.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": naive})

    def refused() -> str:
        try:
            http_get(url)
        except urllib.error.HTTPError as exc:
            return str(json.loads(exc.read())["error"])
        return ""

    error = wait_until(refused, DATA_S, "Prometheus refusing the naive join", every_s=0.2)
    assert "duplicate series" in error, error


@pytest.mark.parametrize("q", annotation_queries(), ids=lambda q: q.id)
def test_every_annotation_query_marks_what_happened_on_the_acting_node(
    stack: Stack, values: dict[str, str], q: PanelQuery
) -> None:
    if "failed|cancelled" in q.expr:
        pytest.skip("no action fails or is cancelled on the acting node; promtool parses this query")
    promql_text = promql.substitute(q.expr, {**values, "Hostname": ACT_NODE})
    result = wait_until(
        lambda: query(stack.prometheus, promql_text), DATA_S, f"data for {q.id}: {promql_text}", every_s=0.2
    )
    assert all(float(r["value"][1]) > 0 for r in result), result


# ------------------------------------------------------------------------------------------------ detail levels

_LEVEL_OF = {n: f.level for f in catalogue.FAMILIES for n in f.samples}
_WHEN_OF = {n: f.when for f in catalogue.FAMILIES for n in f.samples}
_FEATURE_SAYS = {"MQTT": ("[mqtt]", "MQTT commands"), "Slurm": ("[slurm]",), "dcgm-exporter": ("[dcgm]",)}


def need_explains(need: str, names: frozenset[str], detail: str) -> bool:
    """Whether ``need`` (what a row or dashboard declares) is why a query reading ``names`` has no data on a node at
    ``detail`` with every other setting at its default (no MQTT, no dcgm-exporter, observe mode, no Slurm)."""
    if need.startswith("detail "):
        rank = catalogue.LEVELS.index(detail)
        above = {n for n in names if n in _LEVEL_OF and catalogue.LEVELS.index(_LEVEL_OF[n]) > rank}
        zeros = catalogue.ZEROS_FROM  # a 0/1 finding family whose zeros wait for a higher level is empty here
        above |= {n for n in names if n in zeros and catalogue.LEVELS.index(zeros[n]) > rank}
        return catalogue.LEVELS.index(need.split()[1]) > rank and bool(above)
    if need == "dcgm-exporter" and any(n.startswith("DCGM_") for n in names):
        return True
    if need == "mode act":
        return bool(names & metrics.sample_names(source="actuator"))
    return any(key in _WHEN_OF.get(n, "") for n in names for key in _FEATURE_SAYS.get(need, ()))


def unexplained(q: PanelQuery, detail: str) -> str:
    """Empty when ``q``'s row or dashboard declares a need that explains its having no data at ``detail``; else why
    not (what they declare)."""
    names = promql.metric_names(q.expr)
    declared = declared_needs(q.row, q.row_description) | declared_needs(q.board, q.board_description)
    if any(need_explains(n, names, detail) for n in declared):
        return ""
    return f"{q.id}: no data at detail {detail!r}; its row and dashboard declare {sorted(declared) or 'nothing'}"


@pytest.mark.parametrize("detail", catalogue.LEVELS)
def test_at_each_detail_every_panel_query_has_data_or_its_row_says_what_it_needs(stack: Stack, detail: Level) -> None:
    # the node of issue 45 at each detail, every other setting at its default, the variables at All (as the
    # dashboards open); a query that stays empty must sit in a row or dashboard whose title and description say
    # what it needs, and that need must be why (a family above this detail, a feature that is off)
    values = {**WINDOWS, "Hostname": LEVEL_NODES[detail], "gpu": ".*", "GPU_I_ID": ".*", "mig_uuid": ".*"}
    todo = {q.id: (q, promql.substitute(q.expr, values)) for q in panel_queries()}
    empty = set(todo)

    def settled() -> bool:
        empty.difference_update({i for i in empty if query(stack.prometheus, todo[i][1])})
        return not [i for i in empty if unexplained(todo[i][0], detail)]

    with contextlib.suppress(AssertionError):  # past the bound: the assertion below names what stayed empty
        wait_until(settled, DATA_S, f"panel data at detail {detail}", every_s=0.5)
    bad = [why for i in sorted(empty) if (why := unexplained(todo[i][0], detail))]
    assert not bad, "\n".join(bad)


_CONDITIONAL = ("with `", "while ", "for processes", "once an activity source")
"""Families whose series wait for a feature that is off on the level nodes, or for a finding or process."""


@pytest.mark.parametrize("detail", catalogue.LEVELS)
def test_a_real_prometheus_scrapes_what_docs_metrics_promises_at_each_detail(stack: Stack, detail: Level) -> None:
    # docs/metrics.md's levels table is the catalogue's (tests/metrics); here each level's families reach Prometheus
    rank = catalogue.LEVELS.index(detail)
    per_device = [f for f in catalogue.FAMILIES if f.labels[: len(catalogue.GPU_LABELS)] == catalogue.GPU_LABELS]
    only_active = {n for n, z in catalogue.ZEROS_FROM.items() if catalogue.LEVELS.index(z) > rank}
    promised = {n for f in per_device if catalogue.LEVELS.index(f.level) <= rank and f.name not in only_active
                and not f.when.startswith(_CONDITIONAL) for n in f.samples}  # fmt: skip
    above = {n for f in per_device if catalogue.LEVELS.index(f.level) > rank for n in f.samples}
    selector = f'{{Hostname="{LEVEL_NODES[detail]}", __name__=~"flexmig_(gpu|mig)_.*"}}'

    def scraped() -> set[str]:
        got = {r["metric"]["__name__"] for r in query(stack.prometheus, f"count by (__name__) ({selector})")}
        return got if promised <= got else set()

    try:
        got = wait_until(scraped, DATA_S, f"every family promised at {detail} in Prometheus", every_s=0.5)
    except AssertionError:
        series = query(stack.prometheus, f"count by (__name__) ({selector})")
        missing = promised - {r["metric"]["__name__"] for r in series}
        raise AssertionError(f"promised at {detail}, not in Prometheus: {sorted(missing)}") from None
    assert got & above == set(), f"above {detail}, though scraped from a node at {detail}"
    if detail == "standard":
        assert "flexmig_gpu_power_limit_watts" in got


def test_the_slice_map_renders_from_prometheus_without_grafana(stack: Stack, tmp_path: Path) -> None:
    # dashboards/render.py, which drew the README's picture: one band per GPU and memory slice of the demo node
    out = tmp_path / "slice-map.png"
    title = "Slice map: memory slices 0-7 of each GPU"
    board = DASHBOARDS / "flexmig-node.json"

    def drawn() -> int:
        n = int(render.render(f"http://127.0.0.1:{stack.prometheus}", board, title, out,
                              variables={"Hostname": NODE}, minutes=1))  # fmt: skip
        return n if n == 2 * 8 else 0

    wait_until(drawn, DATA_S, "the slice map's 16 series", every_s=0.5)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match="no panel 'Nope'"):
        render.render(f"http://127.0.0.1:{stack.prometheus}", board, "Nope", out)
