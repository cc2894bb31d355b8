"""``flexmig status``: GPUs, MIG instances, activity, processes and jobs, fragmentation and findings.

From the running daemon over its control socket (the daemon answers from its latest sweep and detection report;
no NVML call), or with ``--sim SPEC`` from one look at a simulated node in this process.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from flexmig.act.client import ControlClient
from flexmig.cli.jobs_cmd import DEFAULT_SOCKET
from flexmig.wiring.oneshot import sim_snapshot
from flexmig.wiring.status import status_document

__all__ = ["add_source_arguments", "console", "register", "render", "run"]

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Fetch (or, with ``--sim``, compute) the status document and print it."""
    if args.sim:
        snap, report = sim_snapshot(args.sim)
        doc = status_document(snap, report, source=f"sim:{args.sim}", mode=None)
    else:
        doc = ControlClient(args.socket, timeout_s=args.timeout).call("status")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        render(doc)
    return 0


def console() -> Console:
    """A console for people; wide enough for the tables when the output is not a terminal."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


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


def render(doc: Mapping[str, Any]) -> None:
    """Print a status document as tables for people."""
    out = console()
    mode = doc.get("mode") or "-"
    out.print(
        f"[bold]{doc['node']}[/bold]  source {doc['source']}  mode {mode}  driver {doc.get('driver_version') or 'n/a'}"
        f"  sweep {doc['time']}  {len(doc['gpus'])} GPU(s)"
    )
    if doc.get("actuator_unavailable"):
        out.print(f"[yellow]! actuator unavailable: {doc['actuator_unavailable']}[/yellow]")
    frag = doc.get("fragmentation")
    if frag:
        creatable = ", ".join(f"{n}x {p}" for p, n in frag["creatable"].items() if n) or "nothing"
        out.print(
            f"node: {frag['free_compute_slices']} free compute / {frag['free_memory_slices']} free memory slices, "
            f"external fragmentation {frag['external_score']:.2f}, {frag['stranded_compute_slices']} stranded "
            f"compute slice(s); creatable now: {creatable}"
        )
    for g in doc["gpus"]:
        if g["lost"]:
            state = "[red]GPU IS LOST[/red]"
        elif g["mig"] is None:
            state = "no MIG"
        else:
            state = f"MIG {'on' if g['mig'] else 'off'}"
        title = f"GPU {g['index']}: {g['model']}  {g['uuid']}  {state}"
        if g.get("slice_map"):
            title += f"  [{g['slice_map']}]"
        if g.get("external_fragmentation") is not None:
            title += (
                f"  free {g['free_compute_slices']}c/{g['free_memory_slices']}m"
                f"  fragmentation {g['external_fragmentation']:.2f}"
            )
        if g.get("findings"):
            title += f"  [yellow]finding: {', '.join(g['findings'])}[/yellow]"
        table = Table(title=title, title_justify="left")
        for col in ("GI", "CI", "profile", "placement", "MIG device UUID", "memory GiB", "SM", "idle s", "processes"):
            table.add_column(col, no_wrap=True)
        table.add_column("findings")
        for i in g["instances"]:
            idle = i.get("idle_s")
            table.add_row(
                str(i["gpu_instance_id"]),
                str(i["compute_instance_id"]),
                i["profile"],
                f"{i['start']}:{i['memory_slices']}",
                i["uuid"],
                f"{_gib(i.get('memory_used_bytes'))} / {_gib(i.get('memory_total_bytes'))}",
                _pct(i.get("sm_active")),
                "-" if idle is None else f"{idle:.0f}",
                _processes(i),
                ", ".join(i.get("findings", ())),
            )
        out.print(table)
    if doc.get("findings"):
        out.print("[bold]findings[/bold]")
        for f in doc["findings"]:
            where = f"GPU {f['gpu']}" + (f" {f['profile']}@{f['start']}" if "start" in f else "")
            out.print(f"  {f['kind']:<13} {where}: {f['reason']}")
    jobs = doc.get("jobs") or []
    if jobs:
        table = Table(title="jobs", title_justify="left")
        for col in ("name", "state", "ranks", "gen", "ack step", "instances", "error"):
            table.add_column(col)
        for j in jobs:
            ack = j["last_ack"]["step"] if j.get("last_ack") else "-"
            where = ", ".join(f"gpu{i['gpu']}:{i['profile']}@{i['start']}" for i in j.get("instances", ()))
            table.add_row(
                j["name"],
                j["state"],
                str(j["ranks"]),
                str(j["generation"]),
                str(ack),
                where or "-",
                j.get("error") or "",
            )
        out.print(table)
    recent = doc.get("recent_actions") or []
    if recent:
        out.print(f"[bold]recent actions[/bold] ({doc.get('actions_in_progress', 0)} in progress)")
        for a in recent:
            who = f" {a['job']}" if a.get("job") else ""
            out.print(
                f"  #{a['action_id']} {a['action']}{who}: {a['state']}" + (f" ({a['error']})" if a.get("error") else "")
            )
