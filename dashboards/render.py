#!/usr/bin/env python3
"""Render one panel of a committed dashboard to a PNG from a real Prometheus's data, without Grafana.

    python dashboards/render.py --prometheus http://127.0.0.1:9090 --dashboard flexmig-node.json \\
        --panel "Slice map: memory slices 0-7 of each GPU" --var Hostname=gpu-node-7 --minutes 5 -o slice-map.png

Each target of the panel runs as a range query over the last ``--minutes`` (``--step`` apart), with the dashboard's
variables filled in by ``--var NAME=VALUE`` and every other one at *All*, and is drawn as Grafana draws it: a state
timeline as one band per series, coloured by the panel's value mappings; any other panel as lines. The README's
picture of the slice map comes from it; it also shows a node's dashboards where no Grafana is at hand. Needs
matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # flexmig_dashboards lives beside this script
    sys.path.insert(0, str(HERE))

from flexmig_dashboards.promql import substitute  # noqa: E402

ALL = ".*"
VARIABLES = ("Hostname", "gpu", "GPU_I_ID", "mig_uuid")
"""The dashboards' query variables: at *All* unless ``--var`` sets them."""
_LEGEND = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")

Series = tuple[str, list[tuple[float, float]]]
"""A series' legend and its (unix time, value) points."""


def find_panel(board: Mapping[str, Any], title: str) -> dict[str, Any]:
    """The panel titled ``title`` (rows' nested panels included); ValueError naming the titles there are."""
    panels = [p for top in board.get("panels", []) for p in (top, *top.get("panels", []))]
    for p in panels:
        if p.get("title") == title:
            return dict(p)
    titles = ", ".join(repr(p.get("title")) for p in panels if p.get("type") != "row")
    raise ValueError(f"no panel {title!r} in {board.get('title')!r}; its panels: {titles}")


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """Grafana's legend format filled in (``{{gpu}}`` -> the series' ``gpu``); the labels when it is empty."""
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """The matrix Prometheus answers for ``expr``; RuntimeError with its error when it refuses."""
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    with urllib.request.urlopen(f"{prometheus.rstrip('/')}/api/v1/query_range?{params}", timeout=30) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    return list(body["data"]["result"])


def panel_series(
    prometheus: str, panel: Mapping[str, Any], values: Mapping[str, str], *, start: float, end: float, step: float
) -> list[Series]:
    """Every series of every target of ``panel`` between ``start`` and ``end``, legends filled in."""
    out: list[Series] = []
    for target in panel.get("targets", []):
        expr = substitute(target["expr"], values)
        for r in query_range(prometheus, expr, start, end, step):
            points = [(float(t), float(v)) for t, v in r["values"]]
            out.append((legend(target.get("legendFormat", ""), r["metric"]), points))
    return out


def _natural(text: str) -> list[tuple[int, str]]:
    """A sort key that puts ``gpu 2`` before ``gpu 10``."""
    return [(int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", text)]


def _colours(panel: Mapping[str, Any]) -> dict[float, tuple[str, str]]:
    """Value -> (text, colour) from the panel's value mappings."""
    out: dict[float, tuple[str, str]] = {}
    for mapping in panel.get("mappings", []) or panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        for value, opt in mapping.get("options", {}).items():
            out[float(value)] = (str(opt.get("text", value)), str(opt.get("color", "grey")))
    return out


def draw(panel: Mapping[str, Any], series: Sequence[Series], out: Path, step: float) -> None:
    """Write ``series`` as ``panel`` shows them to the PNG ``out``."""
    import matplotlib  # noqa: PLC0415  (the plot extra: only this command needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ordered = sorted(series, key=lambda s: _natural(s[0]))
    t0 = min((p[0][0] for _, p in ordered if p), default=0.0)
    timeline = panel.get("type") == "state-timeline"
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(ordered) + 1.4 if timeline else 4.5), dpi=100)
    if timeline:
        colours = _colours(panel)
        for row, (_, points) in enumerate(reversed(ordered)):
            for t, v in points:
                _, colour = colours.get(v, (f"{v:g}", "lightgrey"))
                ax.broken_barh([(t - t0, step)], (row - 0.45, 0.9), facecolors=colour, edgecolors="none")
        ax.set_yticks(range(len(ordered)), [name for name, _ in reversed(ordered)], fontsize=7)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, c in colours.values()]
        ax.legend(handles, [t for t, _ in colours.values()], loc="upper center", bbox_to_anchor=(0.5, -0.18),
                  ncol=len(colours), fontsize=8, frameon=False)  # fmt: skip
    else:
        for name, points in ordered:
            ax.plot([t - t0 for t, _ in points], [v for _, v in points], label=name, linewidth=1)
        ax.legend(fontsize=7, loc="best")
    ax.set_title(str(panel.get("title", "")), fontsize=10)
    ax.set_xlabel("seconds from the first point", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def render(
    prometheus: str,
    dashboard: Path,
    title: str,
    out: Path,
    *,
    variables: Mapping[str, str] | None = None,
    minutes: float = 5.0,
    step: float = 1.0,
    end: float | None = None,
) -> int:
    """Render panel ``title`` of ``dashboard`` to ``out``; the number of series drawn."""
    board = json.loads(dashboard.read_text(encoding="utf-8"))
    panel = find_panel(board, title)
    finish = time.time() if end is None else end
    values = dict.fromkeys(VARIABLES, ALL)
    values |= {"__interval": f"{step:g}s", "__rate_interval": f"{max(4 * step, 1):g}s", "__range": f"{minutes:g}m"}
    values |= dict(variables or {})
    series = panel_series(prometheus, panel, values, start=finish - minutes * 60, end=finish, step=step)
    draw(panel, series, out, step)
    return len(series)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and render; exit status 2 on a bad argument or a refused query."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus's URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--dashboard", required=True, help="a dashboard JSON (a name under dashboards/, or a path)")
    parser.add_argument("--panel", required=True, help="the panel's title")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="a dashboard variable")
    parser.add_argument("--minutes", type=float, default=5.0, help="how far back (default 5)")
    parser.add_argument("--step", type=float, default=1.0, help="seconds between points (default 1)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    dashboard = Path(args.dashboard) if Path(args.dashboard).exists() else HERE / args.dashboard
    try:
        variables = dict(v.split("=", 1) for v in args.var)
    except ValueError:
        parser.error(f"--var takes NAME=VALUE, got {args.var}")
    if not 0 < args.minutes <= 24 * 60 or not 0 < args.step <= 3600:
        parser.error("--minutes must be in (0, 1440] and --step in (0, 3600]")
    try:
        n = render(args.prometheus, dashboard, args.panel, args.out, variables=variables, minutes=args.minutes,
                   step=args.step)  # fmt: skip
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {n} series")
    return 0


if __name__ == "__main__":
    sys.exit(main())
