"""grafanalib building blocks: the data source and variables every flexmig dashboard shares, panel helpers, and a
grid that lays panels out left to right, row by row.

Every panel and target names its data source through the ``${datasource}`` variable, so one JSON works with
whatever the Prometheus data source is called (UI import or provisioning alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import attr
from grafanalib.core import (
    SORT_ALPHA_ASC,
    SORT_NUMERIC_ASC,
    Annotations,
    Dashboard,
    DashboardLink,
    GridPos,
    RowPanel,
    Stat,
    StateTimeline,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from flexmig_dashboards.promql import GI, GPU, HOST

__all__ = [
    "DS",
    "NEEDS",
    "SCHEMA_VERSION",
    "Grid",
    "Q",
    "annotations",
    "dashboard",
    "datasource_variable",
    "gpu_variable",
    "host_variable",
    "instance_variable",
    "mig_uuid_variable",
    "stat",
    "state_timeline",
    "table",
    "timeseries",
]

DS: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
"""The data-source reference of every panel and target."""
SCHEMA_VERSION = 39
"""Grafana's dashboard model version we write (Grafana 10.3 to 11): no migration runs on load."""
_ALL: dict[str, Any] = {"selected": True, "text": ["All"], "value": ["$__all"]}


# ----------------------------------------------------------------------------------------------- variables


def datasource_variable() -> Template:
    """``$datasource``: any Prometheus data source (the default one when the dashboard opens)."""
    return Template(name="datasource", type="datasource", query="prometheus", label="Data source", default=None)


def _query_variable(name: str, label: str, query: str, sort: int) -> Template:
    t = Template(
        name=name,
        label=label,
        query=query,
        dataSource=DS,
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=2,  # on time-range change: hosts, GPUs and instances come and go
        sort=sort,
    )
    t._current = dict(_ALL)
    return t


def host_variable() -> Template:
    """``$Hostname``: nodes that run flexmigd (``Hostname`` label, as dcgm-exporter before 4.8.3 spells it)."""
    return _query_variable("Hostname", "Host", "label_values(flexmig_node_info, Hostname)", SORT_ALPHA_ASC)


def gpu_variable() -> Template:
    """``$gpu``: NVML indices of the GPUs on the selected hosts."""
    return _query_variable("gpu", "GPU", f"label_values(flexmig_gpu_lost{{{HOST}}}, gpu)", SORT_NUMERIC_ASC)


def instance_variable() -> Template:
    """``$GPU_I_ID``: GPU-instance IDs of the MIG instances on the selected GPUs (repeated on every GPU: the
    ``$mig_uuid`` variable picks one instance)."""
    return _query_variable(
        "GPU_I_ID",
        "MIG instance (GI)",
        f"label_values(flexmig_mig_memory_total_bytes{{{GPU}}}, GPU_I_ID)",
        SORT_NUMERIC_ASC,
    )


def mig_uuid_variable() -> Template:
    """``$mig_uuid``: MIG device UUIDs of the selected instances; unlike the GPU instance ID, which repeats on every
    GPU and node, one UUID names one instance (what ``CUDA_VISIBLE_DEVICES`` takes)."""
    return _query_variable(
        "mig_uuid",
        "MIG device (UUID)",
        f"label_values(flexmig_mig_memory_total_bytes{{{GI}}}, mig_uuid)",
        SORT_ALPHA_ASC,
    )


# ----------------------------------------------------------------------------------------------- annotations

_GRAFANA_BUILTIN: dict[str, Any] = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}
ANNOTATION_WINDOW = "2m"
"""The window each annotation query looks back over: an event marks the graphs for this long (a region)."""


def _annotation(name: str, expr: str, *, title: str, text: str, tags: str, colour: str) -> dict[str, Any]:
    return {
        "datasource": DS,
        "enable": True,
        "hide": False,
        "iconColor": colour,
        "name": name,
        "expr": expr,
        "step": "60s",
        "titleFormat": title,
        "textFormat": text,
        "tagKeys": tags,
        "useValueForTime": False,
    }


def annotations() -> list[dict[str, Any]]:
    """Marks on every graph, from flexmig's own metrics: actions completed, actions that failed or were cancelled
    (``flexmig_actions_total``), and MIG layout changes (``flexmig_gpu_instance_changes_total``: instances created
    or destroyed, by flexmig or anyone else), on the selected hosts."""
    w = ANNOTATION_WINDOW
    return [
        dict(_GRAFANA_BUILTIN),
        _annotation(
            "flexmig actions",
            f'sum by (Hostname, action) (increase(flexmig_actions_total{{{HOST}, outcome="completed"}}[{w}])) > 0',
            title="{{action}} completed",
            text="flexmig on {{Hostname}} completed a {{action}} action",
            tags="Hostname,action",
            colour="blue",
        ),
        _annotation(
            "flexmig actions failed or cancelled",
            f"sum by (Hostname, action, outcome) "
            f'(increase(flexmig_actions_total{{{HOST}, outcome=~"failed|cancelled"}}[{w}])) > 0',
            title="{{action}} {{outcome}}",
            text="a {{action}} action on {{Hostname}} ended {{outcome}} (see flexmig jobs list and the action events)",
            tags="Hostname,action,outcome",
            colour="red",
        ),
        _annotation(
            "MIG layout changes",
            f"sum by (Hostname, gpu, change) (increase(flexmig_gpu_instance_changes_total{{{HOST}}}[{w}])) > 0",
            title="GPU {{gpu}}: MIG instance {{change}}",
            text="the MIG layout of GPU {{gpu}} on {{Hostname}} changed (an instance was {{change}})",
            tags="Hostname,gpu,change",
            colour="purple",
        ),
    ]


# ----------------------------------------------------------------------------------------------- queries


@dataclass(frozen=True, slots=True)
class Q:
    """One query of a panel: PromQL, legend, and whether it is an instant query for a table."""

    expr: str
    legend: str = ""
    instant: bool = False

    def target(self, ref_id: str) -> Target:
        """The grafanalib target with ``ref_id``."""
        return Target(
            expr=self.expr,
            legendFormat=self.legend,
            refId=ref_id,
            instant=self.instant,
            format="table" if self.instant else "time_series",
            datasource=DS,
            intervalFactor=1,
        )


def _targets(queries: Sequence[Q]) -> list[Target]:
    return [q.target(chr(ord("A") + i)) for i, q in enumerate(queries)]


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str = "short",
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    stacked: bool = False,
    bars: bool = False,
    overrides: Sequence[dict[str, Any]] = (),
    thresholds: Sequence[tuple[str, float | None]] = (),
) -> TimeSeries:
    """A time series panel (legend as a table at the bottom, with last and max); ``thresholds`` ((colour, from
    value) pairs) are drawn as dashed lines over shaded bands, as NVIDIA's DCGM dashboard colours its gauges."""
    return TimeSeries(
        thresholds=[{"color": c, "value": v} for c, v in thresholds],
        thresholdsStyleMode="dashed+area" if thresholds else "off",
        title=title,
        maxDataPoints=None,  # Grafana's default: one point per pixel, not grafanalib's 100
        description=description,
        dataSource=DS,
        targets=_targets(queries),
        unit=unit,
        valueMin=min_value,
        valueMax=max_value,
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "max"],
        stacking={"mode": "normal", "group": "A"} if stacked else {"mode": "none"},
        drawStyle="bars" if bars else "line",
        fillOpacity=30 if stacked or bars else 10,
        tooltipMode="multi",
        tooltipSort="desc",
        overrides=list(overrides),
    )


def stat(
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str = "short",
    *,
    thresholds: Sequence[tuple[str, float | None]] = (("green", None),),
    mappings: Sequence[dict[str, Any]] = (),
    no_value: str = "none",
) -> Stat:
    """A stat panel: the last value of each series, coloured by ``thresholds`` ((colour, from value) pairs)."""
    return Stat(
        title=title,
        maxDataPoints=None,  # Grafana's default: one point per pixel, not grafanalib's 100
        description=description,
        dataSource=DS,
        targets=_targets(queries),
        format=unit,
        reduceCalc="lastNotNull",
        thresholds=[{"color": c, "value": v} for c, v in thresholds],
        mappings=list(mappings),
        graphMode="area",
        colorMode="value",
        noValue=no_value,
    )


def table(
    title: str,
    description: str,
    queries: Sequence[Q],
    *,
    rename: dict[str, str] | None = None,
    hide: Sequence[str] = ("Time", "__name__", "UUID", "model_name", "job", "instance"),
    units: dict[str, str] | None = None,
) -> Table:
    """A table of instant queries, one row per label set: the values merged side by side, columns renamed."""
    names = dict(rename or {})
    return Table(
        title=title,
        maxDataPoints=None,  # Grafana's default: one point per pixel, not grafanalib's 100
        description=description,
        dataSource=DS,
        targets=[attr.evolve(t, instant=True, format="table") for t in _targets(queries)],
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": dict.fromkeys(hide, True), "renameByName": names, "indexByName": {}},
            },
        ],
        overrides=[
            {"matcher": {"id": "byName", "options": names.get(col, col)}, "properties": [{"id": "unit", "value": u}]}
            for col, u in sorted((units or {}).items())
        ],
        filterable=True,
    )


def state_timeline(
    title: str, description: str, queries: Sequence[Q], mappings: Sequence[dict[str, Any]], row_height: float = 0.9
) -> StateTimeline:
    """A state timeline: one row per series, coloured by ``mappings`` (value -> text and colour)."""
    return StateTimeline(
        title=title,
        maxDataPoints=None,  # Grafana's default: one point per pixel, not grafanalib's 100
        description=description,
        dataSource=DS,
        targets=_targets(queries),
        mappings=list(mappings),
        rowHeight=row_height,
        mergeValues=True,
        showValue="auto",
        alignValue="center",
        fillOpacity=80,
        colorMode="thresholds",
        thresholds=[{"color": "text", "value": None}],  # values without a mapping
        legendDisplayMode="hidden",
    )


def value_mapping(pairs: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
    """A Grafana value mapping from (value, text, colour) triples."""
    return {
        "type": "value",
        "options": {v: {"text": text, "color": colour, "index": i} for i, (v, text, colour) in enumerate(pairs)},
    }


# ----------------------------------------------------------------------------------------------- needs

NEEDS: dict[str, str] = {
    "detail standard": '`[prometheus] detail = "standard"` (the default) or "full"',
    "detail full": '`[prometheus] detail = "full"`',
    "MQTT": "MQTT (`[mqtt] enabled = true`)",
    "dcgm-exporter": "dcgm-exporter on the node (scraped by Prometheus for the overlays; by flexmigd, with "
    "`[dcgm] enabled = true`, for its own figures)",
    "mode act": 'flexmig acting (`mode = "act"`)',
    "Slurm": "Slurm (`[slurm] enabled = true`)",
}
"""What a row or a dashboard may need beyond flexmigd at ``[prometheus] detail = "minimal"``, and how its
description says so. A row that needs something says it in its title, ``(needs detail full)``, and in its
description, ``Needs `[prometheus] detail = "full"`.``: an operator sees why its panels say "No data", and
tests/dashboards/test_dashboards_prometheus.py holds every empty panel at each detail to it."""


def _needs(title: str, description: str, needs: Sequence[str]) -> tuple[str, str]:
    """``title`` and ``description`` saying what ``needs`` names (keys of :data:`NEEDS`)."""
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise ValueError(f"{title}: unknown needs {unknown}; expected some of {sorted(NEEDS)}")
    if not needs:
        return title, description
    said = "; ".join(NEEDS[n] for n in needs)
    return f"{title} (needs {', '.join(needs)})", f"Needs {said}. {description}".strip()


# ----------------------------------------------------------------------------------------------- layout


@dataclass
class Grid:
    """Places panels on Grafana's 24-column grid: rows of panels left to right, a new line when one is full."""

    panels: list[Any] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _line_h: int = 0

    def row(self, title: str, description: str = "", needs: Sequence[str] = ()) -> None:
        """Start a (non-collapsed) row titled ``title`` on a new line; ``needs`` (keys of :data:`NEEDS`) is what
        its panels need to have data, said in its title and description."""
        self._newline()
        title, description = _needs(title, description, needs)
        self.panels.append(
            RowPanel(title=title, description=description or None, gridPos=GridPos(h=1, w=24, x=0, y=self._y))
        )
        self._y += 1

    def add(self, panel: Any, w: int = 12, h: int = 8) -> None:
        """Place ``panel`` ``w`` columns wide and ``h`` units high after the previous one."""
        if self._x + w > 24:
            self._newline()
        self.panels.append(attr.evolve(panel, gridPos=GridPos(h=h, w=w, x=self._x, y=self._y)))
        self._x += w
        self._line_h = max(self._line_h, h)

    def _newline(self) -> None:
        self._y += self._line_h
        self._x = 0
        self._line_h = 0


def dashboard(
    title: str, uid: str, description: str, grid: Grid, variables: Sequence[Template], *, needs: Sequence[str] = ()
) -> Dashboard:
    """A flexmig dashboard: tagged ``flexmig``, linked to the others, last hour, refreshed every 30 s, with the
    action and layout-change annotations; ``needs`` (keys of :data:`NEEDS`) is what all its panels need."""
    title, description = _needs(title, description, needs)
    return Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["flexmig", "mig", "gpu"],
        timezone="browser",
        refresh="30s",
        time=Time("now-1h", "now"),
        schemaVersion=SCHEMA_VERSION,
        graphTooltip=1,
        links=[
            DashboardLink(
                title="flexmig",
                type="dashboards",
                tags=["flexmig"],
                asDropdown=True,
                includeVars=True,
                keepTime=True,
            )
        ],
        templating=Templating(list=[datasource_variable(), *variables]),
        annotations=Annotations(list=annotations()),
        panels=grid.panels,
    ).auto_panel_ids()
