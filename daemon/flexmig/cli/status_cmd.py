"""``flexmig status``: GPUs, MIG instances, activity, processes and jobs, fragmentation and findings.

From the running daemon over its control socket (the daemon answers from its latest sweep and detection report;
no NVML call), or with ``--sim SPEC`` from one look at a simulated node in this process. ``--watch`` keeps a live
view of it, refreshed every few seconds. The output fits the terminal, 80 columns included: each MIG device's UUID
goes on a line of its own under its instance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from flexmig.act.client import ControlClient
from flexmig.cli.jobs_cmd import DEFAULT_SOCKET
from flexmig.cli.table import Row, output_width, render_rows, wrap
from flexmig.errors import ConfigError, FlexmigError
from flexmig.status import status_document
from flexmig.wiring.oneshot import sim_snapshot

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
        with Live(console=out, auto_refresh=False, transient=False, vertical_overflow="visible") as live:
            while True:
                problem = None
                try:
                    last = fetch(args)
                except FlexmigError as exc:
                    problem = str(exc)
                width = out.size.width
                view = render_text(last, width) if last is not None else Text()
                footer = f"every {args.watch:g} s, Ctrl-C to quit"
                if problem is not None:
                    view = Text.assemble(Text("\n".join(wrap(f"! {problem}", width)) + "\n", style="red"), view)
                live.update(Text.assemble(view, Text("\n" + footer, style="dim")), refresh=True)
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


def render_text(doc: Mapping[str, Any], width: int | None) -> Text:
    """A status document for people, every line at most ``width`` wide (None: lines as long as they are)."""
    out = Text()

    def line(text: str, style: str = "", more: str = "  ") -> None:
        for piece in wrap(text, width, more=more):
            out.append(piece + "\n", style=style)

    mode = doc.get("mode") or "-"
    line(
        f"{doc['node']}  source {doc['source']}  mode {mode}  driver {doc.get('driver_version') or 'n/a'}  "
        f"{len(doc['gpus'])} GPU(s)  sweep {doc['time']}",
        "bold",
    )
    if doc.get("actuator_unavailable"):
        line(f"! actuator unavailable: {doc['actuator_unavailable']}", "yellow")
    frag = doc.get("fragmentation")
    if frag:
        creatable = ", ".join(f"{n}x {p}" for p, n in frag["creatable"].items() if n) or "nothing"
        line(
            f"node: {frag['free_compute_slices']} free compute / {frag['free_memory_slices']} free memory slices, "
            f"external fragmentation {frag['external_score']:.2f}, {frag['stranded_compute_slices']} stranded "
            f"compute slice(s); creatable now: {creatable}"
        )
    headers = ("GI", "CI", "profile", "slices", "memory GiB", "SM", "idle s", "processes")
    for g in doc["gpus"]:
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
        line(title, "bold red" if g["lost"] else "bold")
        line(f"  {g['uuid']}")
        if g.get("findings"):
            line(f"  finding: {', '.join(g['findings'])}", "yellow", more="    ")
        rows = []
        for i in g["instances"]:
            idle = i.get("idle_s")
            details = [i["uuid"] or "(no MIG device UUID)"]
            if i.get("findings"):
                details.append(f"finding: {', '.join(i['findings'])}")
            rows.append(
                Row(
                    (
                        str(i["gpu_instance_id"]),
                        str(i["compute_instance_id"]),
                        i["profile"],
                        f"{i['start']}:{i['memory_slices']}",
                        f"{_gib(i.get('memory_used_bytes'))}/{_gib(i.get('memory_total_bytes'))}",
                        _pct(i.get("sm_active")),
                        "-" if idle is None else f"{idle:.0f}",
                        _processes(i),
                    ),
                    details,
                )
            )
        if rows:
            for text in render_rows(headers, rows, width):
                out.append(text + "\n")
    if doc.get("findings"):
        line("findings", "bold")
        for f in doc["findings"]:
            where = f"GPU {f['gpu']}" + (f" {f['profile']}@{f['start']}" if "start" in f else "")
            line(f"  {f['kind']} {where}: {f['reason']}", more="    ")
    jobs = doc.get("jobs") or []
    if jobs:
        line("jobs", "bold")
        rows = []
        for j in jobs:
            ack = j["last_ack"]["step"] if j.get("last_ack") else "-"
            where = ", ".join(f"gpu{i['gpu']}:{i['profile']}@{i['start']}" for i in j.get("instances", ()))
            rows.append(
                Row(
                    (j["name"], j["state"], str(j["ranks"]), str(j["generation"]), str(ack), where or "-"),
                    [f"error: {j['error']}"] if j.get("error") else [],
                )
            )
        for text in render_rows(("name", "state", "ranks", "gen", "ack step", "instances"), rows, width):
            out.append(text + "\n")
    recent = doc.get("recent_actions") or []
    if recent:
        line(f"recent actions ({doc.get('actions_in_progress', 0)} in progress)", "bold")
        for a in recent:
            who = f" {a['job']}" if a.get("job") else ""
            error = f" ({a['error']})" if a.get("error") else ""
            line(f"  #{a['action_id']} {a['action']}{who}: {a['state']}{error}", more="    ")
    out.rstrip()
    return out


def render(doc: Mapping[str, Any]) -> None:
    """Print a status document for people, fitted to the output's width."""
    console().print(render_text(doc, output_width()))
