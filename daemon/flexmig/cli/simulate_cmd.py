"""``flexmig simulate``: replay a GPU-cluster trace on a simulated MIG node under one policy and queue discipline.

Prints the figures (or JSON with ``--json``), shows a progress bar on stderr when stderr is a terminal, and with
``--plot`` draws utilization, queue length and fragmentation over time (PNG, SVG or PDF, by the file's suffix).
The trace mapping, the load, the time compression, the disciplines and the policies are described in
docs/replay.md. Moves are charged replay's own costs, those of large training jobs (``flexmig.replay.costs``), not
flexmigd's ``[planner]`` defaults; ``--costs daemon`` starts from those instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from flexmig.errors import TraceError
from flexmig.plan.types import DISCIPLINES, PlannerSettings
from flexmig.replay.costs import REPLAY_SETTINGS

__all__ = ["PLOT_FORMATS", "register", "run"]

PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
"""Plot file suffixes and the format each one is written in."""


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def _efficiency(text: str) -> float:
    value = _positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"an efficiency is at most 1, not {text}")
    return value


def register(sub: Any) -> None:
    """Add the ``simulate`` subcommand."""
    from flexmig.replay.run import POLICIES  # noqa: PLC0415 - keep `flexmig --help` light
    from flexmig.replay.trace import ELASTIC_RULES  # noqa: PLC0415

    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help="replay a GPU-cluster trace on a simulated MIG node", description=__doc__
    )
    p.add_argument("--trace", required=True, type=Path, help="pod-list CSV (Alibaba cluster-trace-gpu-v2023 format)")
    p.add_argument("--node", default="h200x8", help="node spec, e.g. h200x8 (default) or h200x4:3g.71gb@0+4g.71gb@4")
    p.add_argument("--policy", required=True, choices=POLICIES, help="how MIG is managed")
    p.add_argument(
        "--discipline",
        choices=DISCIPLINES,
        default="easy",
        help="queue discipline: easy (default; a reservation for the head, as flexmigd does) or greedy (none)",
    )
    p.add_argument(
        "--malleable",
        action="store_true",
        help="elastic jobs may also run below their nominal compute, down to one rank (static, drain, flex)",
    )
    p.add_argument("--load", type=_positive, metavar="RHO", help="thin the trace to offer RHO x the node's compute")
    p.add_argument("--seed", type=int, default=0, help="seed of the thinning (default 0)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="draw utilization, queue and fragmentation into FILE (.png, .svg or .pdf; needs the plot extra)",
    )
    p.add_argument("--no-resplit", action="store_true", help="flex: never spread or re-split a job")
    p.add_argument("--no-migrate", action="store_true", help="flex: never migrate a running job")
    p.add_argument("--elastic", choices=ELASTIC_RULES, default="whole", help="which jobs may be split (default whole)")
    p.add_argument(
        "--max-runtime", type=_non_negative, default=86400.0, metavar="S", help="cap run times (0: none; default 86400)"
    )
    p.add_argument(
        "--max-gap", type=_positive, default=1800.0, metavar="S", help="with --load: longest gap between arrivals"
    )
    _add_cost_options(p)
    p.set_defaults(func=run)


def _add_cost_options(p: argparse.ArgumentParser) -> None:
    """The action costs the replay starts from, and the options that override single ones."""
    replay_costs = REPLAY_SETTINGS
    p.add_argument(
        "--costs",
        choices=("replay", "daemon"),
        default="replay",
        help="action costs to start from: replay's, for large training jobs (default: checkpoint "
        f"{replay_costs.checkpoint_s:g} s, restart {replay_costs.restart_s:g} s, create/destroy "
        f"{replay_costs.reconfigure_s:g} s, settling {replay_costs.settling_s:g} s, gain margin "
        f"{replay_costs.gain_margin:g}), or flexmigd's [planner] defaults, measured on small examples; the "
        "options below override single costs",
    )
    p.add_argument("--checkpoint-s", type=_non_negative, metavar="S", help="checkpoint time")
    p.add_argument("--restart-s", type=_non_negative, metavar="S", help="restart time after a move")
    p.add_argument("--reconfigure-s", type=_non_negative, metavar="S", help="one instance create/destroy")
    p.add_argument("--settling-s", type=_non_negative, metavar="S", help="no job moves twice within this")
    p.add_argument("--gain-margin", type=_non_negative, metavar="M", help="a move must gain (1 + M) times its cost")
    p.add_argument(
        "--spread-efficiency",
        type=_efficiency,
        metavar="E",
        help=f"speed of a spread job (default {replay_costs.spread_efficiency:g})",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (there is none unless stderr is a terminal)"
    )


def _check_plot(path: Path | None) -> None:
    """Refuse, before replaying anything, a plot file of an unknown format or a plot without matplotlib."""
    if path is None:
        return
    if path.suffix.lower() not in PLOT_FORMATS:
        known = ", ".join(PLOT_FORMATS)
        raise TraceError(f"--plot {path}: unknown format {path.suffix or '(no suffix)'!r}; use one of {known}")
    if importlib.util.find_spec("matplotlib") is None:
        raise TraceError(
            f"--plot {path}: matplotlib is not installed; install flexmig's plot extra (pip install 'flexmig[plot]')"
        )


def run(args: argparse.Namespace) -> int:
    """Replay, then print (and plot)."""
    from flexmig.replay.run import ReplayConfig, prepare, run_policy, static_eligibility  # noqa: PLC0415

    _check_plot(args.plot)
    settings = replace(
        REPLAY_SETTINGS if args.costs == "replay" else PlannerSettings(),
        **{
            name: value
            for name in ("checkpoint_s", "restart_s", "reconfigure_s", "settling_s", "gain_margin", "spread_efficiency")
            if (value := getattr(args, name)) is not None
        },
        resplit=not args.no_resplit,
        migrate=not args.no_migrate,
        discipline=args.discipline,
    )
    config = ReplayConfig(
        trace=args.trace,
        node=args.node,
        load=args.load,
        seed=args.seed,
        max_runtime_s=args.max_runtime,
        max_gap_s=args.max_gap,
        elastic=args.elastic,
        settings=settings,
        malleable=args.malleable,
    )
    prep = prepare(config)
    replays = 0
    if args.policy == "static":
        replays = sum(1 for _, ok in static_eligibility(prep, settings) if ok)
    elif args.policy != "bound":
        replays = 1
    total = 2 * len(prep.jobs) * replays
    label = f"{args.policy} {args.discipline}{' malleable' if args.malleable else ''} {prep.info['node']}"

    def replay_with(progress: Callable[[int], None] | None) -> Any:
        return run_policy(prep, args.policy, settings, progress, malleable=args.malleable)

    if args.no_progress or total == 0 or not sys.stderr.isatty():
        result = replay_with(None)
    else:
        result = _with_progress(label, total, replay_with)
    figures = result.to_json()
    if args.plot is not None:
        if not result.samples:
            raise TraceError(f"policy {args.policy} replays nothing, so there is nothing to plot")
        from flexmig.replay.plot import plot_timeline  # noqa: PLC0415

        fmt = PLOT_FORMATS[args.plot.suffix.lower()]
        plot_timeline(result.samples, prep.capacity, args.plot, title=f"{label}", fmt=fmt)
        figures["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(figures, indent=2, sort_keys=True))
    else:
        _print_table(figures)
    return 0


def _with_progress(label: str, total: int, work: Callable[[Callable[[int], None] | None], Any]) -> Any:
    """``work(advance)`` under a rich progress bar on stderr (a terminal: the caller checked)."""
    from rich.console import Console  # noqa: PLC0415 - only a terminal run needs it
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(file=sys.stderr), transient=False) as bar:
        task = bar.add_task(label, total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)

        return work(advance)


def _print_table(figures: dict[str, Any]) -> None:
    keys = (
        "policy",
        "discipline",
        "malleable",
        "static_layout",
        "jobs",
        "jobs_completed",
        "jobs_unplaceable",
        "makespan_s",
        "mean_jct_s",
        "p95_jct_s",
        "max_jct_s",
        "mean_wait_s",
        "max_wait_s",
        "p95_bounded_slowdown",
        "utilization",
        "fragmentation_mean",
        "migrations",
        "resplits",
        "spread_starts",
        "narrow_starts",
    )
    for key in keys:
        if figures.get(key) is not None:
            print(f"{key:22} {figures[key]}")
    sizes = figures.get("by_size") or {}
    for size in ("share", "whole", "multi"):
        got = sizes.get(size)
        if got:
            print(f"{size + ' jobs':22} {got['jobs']}, mean JCT {got['mean_jct_s']}, max wait {got['max_wait_s']}")
    if figures.get("slowdown_bound_s") is not None:
        print(f"{'slowdown bound (s)':22} {figures['slowdown_bound_s']}")
    if figures.get("plot") is not None:
        print(f"{'plot':22} {figures['plot']}")
