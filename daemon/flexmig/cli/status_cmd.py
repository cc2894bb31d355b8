"""``flexmig status``: GPUs, MIG instances, activity, processes and jobs, fragmentation and findings.

From the running daemon over its control socket (the daemon answers from its latest sweep and detection report;
no NVML call), or with ``--sim SPEC`` from one look at a simulated node in this process. ``--watch`` keeps a live
view of it, refreshed every few seconds on the terminal's alternate screen (as nvitop and htop do), fitted to its
height as well as its width: where the whole view does not fit, the instances' UUIDs, then the GPUs' UUIDs and the
actions, then the instance tables, findings and jobs are summarised, the node's line first. The output fits the
terminal, 80 columns included: each MIG device's UUID goes on a line of its own under its instance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from flexmig.act.client import ControlClient
from flexmig.cli.job_table import render_jobs
from flexmig.cli.jobs_cmd import DEFAULT_SOCKET
from flexmig.cli.oneshot import sim_snapshot
from flexmig.cli.table import Row, output_width, render_rows, wrap
from flexmig.detect.findings import finding_docs
from flexmig.errors import ConfigError, FlexmigError
from flexmig.status import status_document

__all__ = ["add_source_arguments", "console", "fetch", "register", "render", "render_text", "run", "watch"]

_GIB = 1 << 30


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """``--sim``, ``--socket``, ``--timeout`` and ``--json``: shared by ``status`` and ``plan``."""
    p.add_argument("--sim", metavar="SPEC", help="look at a simulated node in this process instead of the daemon")
    p.add_argument(
        "--socket",
        type=Path,
        default=Path(os.environ.get("FLEXMIG_CONTROL_SOCKET", str(DEFAULT_SOCKET))),
        help=f"the daemon's control socket (default $FLEXMIG_CONTROL_SOCKET or {DEFAULT_SOCKET})",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the daemon (default 30)")
    p.add_argument("--json", action="store_true", help="print JSON for programs")


def register(sub: Any) -> None:
    """Add the ``status`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "status", help="GPUs, instances, activity, jobs, fragmentation and findings", description=__doc__
    )
    add_source_arguments(p)
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="S",
        help="a live view, refreshed every S seconds (default 2) until Ctrl-C; with --json, one document a line",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Fetch (or, with ``--sim``, compute) the status document and print it; with ``--watch``, again and again."""
    if args.watch is not None:
        if not 0.1 <= args.watch <= 3600:
            raise ConfigError(f"--watch {args.watch:g}: the refresh interval must be 0.1-3600 seconds")
        return watch(args)
    doc = fetch(args)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        console().print(render_text(doc, output_width()))
    return 0


def fetch(args: argparse.Namespace) -> dict[str, Any]:
    """The status document: from the daemon, or from one look at the simulated node ``--sim``."""
    if args.sim:
        snap, report = sim_snapshot(args.sim)
        return status_document(snap, report, source=f"sim:{args.sim}", mode=None)
    doc: dict[str, Any] = ControlClient(args.socket, timeout_s=args.timeout).call("status")
    return doc


def watch(args: argparse.Namespace) -> int:
    """Show the status again every ``--watch`` seconds until Ctrl-C (status 0). While the daemon cannot be reached
    the last view stays, under a line that says so, and it is asked again at the next refresh."""
    out = console()
    if args.json or not out.is_terminal:
        try:
            while True:
                try:
                    doc = fetch(args)
                except FlexmigError as exc:
                    print(f"flexmig status: {exc}", file=sys.stderr, flush=True)
                else:
                    if args.json:
                        print(json.dumps(doc, separators=(",", ":")), flush=True)
                    else:
                        out.print(render_text(doc, output_width()))
                        out.print()
                time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
    last: dict[str, Any] | None = None
    try:
        # The terminal's alternate screen, as nvitop and htop use: each refresh replaces the view, nothing goes to
        # the scrollback, and the terminal is as it was when the watch ends.
        with Live(console=out, auto_refresh=False, screen=True, redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                problem = None
                try:
                    last = fetch(args)
                except FlexmigError as exc:
                    problem = str(exc)
                width, height = out.size.width, out.size.height
                alarm = wrap(f"! {problem}", width) if problem is not None else []
                room = max(1, height - 1 - len(alarm))  # the footer's line, the problem's
                view = render_text(last, width, room) if last is not None else Text()
                footer = Text(f"every {args.watch:g} s, Ctrl-C to quit", style="dim")
                parts = [Text("\n".join(alarm), style="red")] if alarm else []
                live.update(Text("\n").join([*parts, view, footer]), refresh=True)
                time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def console() -> Console:
    """A console for people: colour on a terminal; lines are fitted by the renderers, never re-wrapped here."""
    return Console(highlight=False, soft_wrap=True)


def _gib(n: Any) -> str:
    return "n/a" if n is None else f"{n / _GIB:.1f}"


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _processes(inst: Mapping[str, Any]) -> str:
    procs = inst.get("processes")
    if procs is None:
        shown = "n/a"
    else:
        shown = ", ".join(f"{p['pid']} ({_gib(p.get('gpu_memory_bytes'))} GiB)" for p in procs) or "-"
    return f"job {inst['job']}: {shown}" if inst.get("job") else shown


#: How much of the view is summarised, from nothing (0) to everything but the header and each GPU's line (5):
#: 1 drops the instances' MIG UUIDs and keeps the last three actions, 2 drops the GPUs' UUIDs and keeps one line of
#: actions, 3 lists each GPU's instances on a line or two and the findings on one, 4 counts each GPU's instances on
#: one line and the jobs on another, 5 leaves only each GPU's own line.
SUMMARY_LEVELS = 6
#: Shown where slice maps are: how to read ``[11113333]``.
SLICE_MAP_LEGEND = "slice map: one digit per memory slice, the size (g) of its instance; . free"


class _View:
    """Lines of the view being built, each fitted to ``width``."""

    def __init__(self, width: int | None) -> None:
        self.width = width
        self.lines: list[Text] = []

    def line(self, text: str, style: str = "", more: str = "  ") -> None:
        for piece in wrap(text, self.width, more=more):
            self.lines.append(Text(piece, style=style))

    def rows(self, rendered: list[str]) -> None:
        self.lines += [Text(r) for r in rendered]


def _head(view: _View, doc: Mapping[str, Any]) -> None:
    """The node's line, an unavailable actuator, the node's fragmentation, and the slice map's legend."""
    mode = doc.get("mode") or "-"
    view.line(
        f"{doc['node']}  source {doc['source']}  mode {mode}  driver {doc.get('driver_version') or 'n/a'}  "
        f"{len(doc['gpus'])} GPU(s)  sweep {doc['time']}",
        "bold",
    )
    if doc.get("actuator_unavailable"):
        view.line(f"! actuator unavailable: {doc['actuator_unavailable']}", "yellow")
    cgroups = doc.get("job_cgroups")
    if mode == "act" and isinstance(cgroups, Mapping) and not cgroups.get("base") and cgroups.get("off"):
        view.line(
            f"! no job cgroups ({cgroups['off']}): a job's processes that leave its process group are found by "
            "their environment only",
            "yellow",
        )
    frag = doc.get("fragmentation")
    if frag:
        creatable = ", ".join(f"{n}x {p}" for p, n in frag["creatable"].items() if n) or "nothing"
        view.line(
            f"node: {frag['free_compute_slices']} free compute / {frag['free_memory_slices']} free memory slices, "
            f"external fragmentation {frag['external_score']:.2f}, {frag['stranded_compute_slices']} stranded "
            f"compute slice(s); creatable now: {creatable}"
        )
    if any(g.get("slice_map") for g in doc["gpus"]):
        view.line(SLICE_MAP_LEGEND, "dim")


def _gpu_title(g: Mapping[str, Any]) -> str:
    if g["lost"]:
        state = "GPU IS LOST"
    elif g["mig"] is None:
        state = "no MIG"
    else:
        state = f"MIG {'on' if g['mig'] else 'off'}"
    title = f"GPU {g['index']}: {g['model']}  {state}"
    if g.get("slice_map"):
        title += f"  [{g['slice_map']}]"
    if g.get("external_fragmentation") is not None:
        title += (
            f"  free {g['free_compute_slices']}c/{g['free_memory_slices']}m"
            f"  fragmentation {g['external_fragmentation']:.2f}"
        )
    return title


_INSTANCE_HEADERS = ("GI", "CI", "profile", "slices", "memory GiB", "SM", "idle s", "processes")


def _gpu(view: _View, g: Mapping[str, Any], level: int) -> None:
    """One GPU: its line, its UUID, its findings, and its instances as a table (or, summarised, a line)."""
    view.line(_gpu_title(g), "bold red" if g["lost"] else "bold")
    if level < 2:
        view.line(f"  {g['uuid']}")
    if g.get("findings"):
        view.line(f"  finding: {', '.join(g['findings'])}", "yellow", more="    ")
    if not g["instances"] or level >= 5:
        return
    if level == 4:
        busy = [i.get("sm_active") for i in g["instances"] if i.get("job") or i.get("processes")]
        sms = sorted(x for x in busy if x is not None)
        spread = f" (SM {_pct(sms[0])}-{_pct(sms[-1])})" if sms else ""
        idle = len(g["instances"]) - len(busy)
        view.line(f"  {len(g['instances'])} instance(s): {len(busy)} busy{spread}, {idle} idle")
        return
    if level == 3:
        shown = [
            f"{i['profile']}@{i['start']} {i.get('job') or ('-' if not i.get('processes') else 'busy')}"
            f" {_pct(i.get('sm_active'))}"
            for i in g["instances"]
        ]
        view.line(f"  {len(shown)} instance(s): " + ", ".join(shown), more="    ")
        return
    rows = []
    for i in g["instances"]:
        idle = i.get("idle_s")
        details = [i["uuid"] or "(no MIG device UUID)"] if level == 0 else []
        if i.get("findings"):
            details.append(f"finding: {', '.join(i['findings'])}")
        cells = (
            str(i["gpu_instance_id"]),
            str(i["compute_instance_id"]),
            i["profile"],
            f"{i['start']}:{i['memory_slices']}",
            f"{_gib(i.get('memory_used_bytes'))}/{_gib(i.get('memory_total_bytes'))}",
            _pct(i.get("sm_active")),
            "-" if idle is None else f"{idle:.0f}",
            _processes(i),
        )
        rows.append(Row(cells, details))
    view.rows(render_rows(_INSTANCE_HEADERS, rows, view.width))


def _findings(view: _View, doc: Mapping[str, Any], level: int) -> None:
    """The active findings, each with where docs/detection.md explains it."""
    found = doc.get("findings") or []
    if not found:
        return
    if level >= 3:
        kinds = sorted({f["kind"] for f in found})
        view.line(f"findings: {len(found)} ({', '.join(kinds)}; docs/detection.md)", "bold")
        return
    view.line("findings", "bold")
    for f in found:
        where = f"GPU {f['gpu']}" + (f" {f['profile']}@{f['start']}" if "start" in f else "")
        view.line(f"  {f['kind']} {where}: {f['reason']} ({finding_docs(f['kind'])})", more="    ")


def _jobs(view: _View, doc: Mapping[str, Any], level: int) -> None:
    """The job table (the one ``flexmig jobs list`` prints)."""
    jobs = doc.get("jobs") or []
    if not jobs:
        return
    if level >= 4:
        states = Counter(j["state"] for j in jobs)
        view.line(f"jobs: {len(jobs)} (" + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + ")", "bold")
        return
    view.line("jobs", "bold")
    view.rows(render_jobs(jobs, view.width))


def _actions(view: _View, doc: Mapping[str, Any], level: int) -> None:
    """The recent actions: all of them, the last three, or one line."""
    recent = doc.get("recent_actions") or []
    if not recent:
        return
    head = f"recent actions ({doc.get('actions_in_progress', 0)} in progress)"
    shown = recent if level == 0 else recent[:3] if level == 1 else []
    if not shown:
        a = recent[0]
        view.line(f"{head}: {len(recent)}, the last #{a['action_id']} {a['action']}: {a['state']}", "bold")
        return
    view.line(head, "bold")
    for a in shown:
        who = f" {a['job']}" if a.get("job") else ""
        error = f" ({a['error']})" if a.get("error") else ""
        view.line(f"  #{a['action_id']} {a['action']}{who}: {a['state']}{error}", more="    ")


def _view(doc: Mapping[str, Any], width: int | None, level: int) -> list[Text]:
    view = _View(width)
    _head(view, doc)
    for g in doc["gpus"]:
        _gpu(view, g, level)
    _findings(view, doc, level)
    _jobs(view, doc, level)
    _actions(view, doc, level)
    return view.lines


def render_text(doc: Mapping[str, Any], width: int | None, height: int | None = None) -> Text:
    """A status document for people, every line at most ``width`` wide (None: lines as long as they are); with
    ``height``, at most that many lines: the less important parts are summarised first (:data:`SUMMARY_LEVELS`),
    the node's line and each GPU's line stay, and what still does not fit is cut with a line that says so."""
    lines: list[Text] = []
    for level in range(SUMMARY_LEVELS):
        lines = _view(doc, width, level)
        if height is None or len(lines) <= height:
            break
    if height is not None and len(lines) > height:
        cut = len(lines) - height + 1
        lines = [*lines[: height - 1], Text(f"... {cut} more line(s): a taller terminal shows them", style="dim")]
    return Text("\n").join(lines)


def render(doc: Mapping[str, Any]) -> None:
    """Print a status document for people, fitted to the output's width."""
    console().print(render_text(doc, output_width()))
