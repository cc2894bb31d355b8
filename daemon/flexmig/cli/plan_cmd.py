"""``flexmig plan``: what the planner would do on this node now, with each action's reason and estimated cost.

Nothing is changed. From the running daemon (its jobs, queue and a fresh inventory; ``--request`` adds what-if
jobs to its queue for this answer only), or with ``--sim SPEC`` for a simulated node in this process, where the
demo workload's processes block their instances and only ``--request`` jobs are planned for.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from typing import Any

from rich.text import Text

from flexmig.act.client import ControlClient
from flexmig.cli.oneshot import sim_plan_input
from flexmig.cli.operation_args import add_operation_arguments, operation_request
from flexmig.cli.status_cmd import add_source_arguments, console
from flexmig.cli.table import Row, output_width, render_rows, wrap
from flexmig.config import Config
from flexmig.errors import ConfigError, PlanRejectedError
from flexmig.plan import Plan, Planner, validate_plan
from flexmig.service.planning import plan_document, planner_settings

__all__ = ["register", "render", "render_text", "run"]


def register(sub: Any) -> None:
    """Add the ``plan`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "plan", help="what the planner would do now, with reasons and costs (changes nothing)", description=__doc__
    )
    add_source_arguments(p)
    add_operation_arguments(p, "plan")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ask the daemon (or plan for ``--sim``) and print the plan."""
    if args.sim:
        doc = sim_plan(args.sim, args.requests)
    else:
        doc = ControlClient(args.socket, timeout_s=args.timeout).call("plan", **operation_request("plan", args))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        render(doc)
    return 1 if doc.get("error") else 0


def sim_plan(spec: str, requests: list[str]) -> dict[str, Any]:
    """The plan document for the simulated node ``spec`` with ``requests`` queued, with default planner settings."""
    now = time.time()
    try:
        given = sim_plan_input(spec, requests, now)
    except ValueError as exc:
        if isinstance(exc, ConfigError | PlanRejectedError):
            raise
        raise ConfigError(str(exc)) from None
    settings = planner_settings(Config.default().planner)
    error = None
    try:
        plan = Planner(given.state.model, settings).plan(given.state)
        validate_plan(given.state, plan, settings)
    except PlanRejectedError as exc:
        plan, error = Plan(now_s=now), str(exc)
    return plan_document(plan, given, mode="advise", source=f"sim:{spec}", error=error)


def render(doc: Mapping[str, Any]) -> None:
    """Print a plan document for people, fitted to the output's width."""
    console().print(render_text(doc, output_width()))


def render_text(doc: Mapping[str, Any], width: int | None) -> Text:
    """A plan document as text, every line at most ``width`` wide (the reason column wraps)."""
    out = Text()

    def line(text: str, style: str = "") -> None:
        for piece in wrap(text, width):
            out.append(piece + "\n", style=style)

    if doc["source"] == "daemon":
        how = {
            "act": "mode act: the daemon executes plans like this one",
            "advise": "mode advise: published, nothing is changed",
            "observe": "mode observe: the daemon does not plan; this is what it would do",
        }.get(doc["mode"], doc["mode"])
    else:
        how = f"simulated node {doc['source'].removeprefix('sim:')}"
    line(f"plan ({how}): {doc['summary']}", "bold")
    if doc.get("error"):
        line(f"! the planner refused this node state: {doc['error']}", "red")
    if doc["actions"]:
        rows = [
            Row(
                (str(n), a["action"], a["target"], f"{a['cost_s']:.1f}", a["reason"]),
                [f"from {', '.join(a.get('from', ())) or '-'} to {', '.join(a.get('to', ())) or '-'}"]
                if a.get("from") or a.get("to")
                else [],
            )
            for n, a in enumerate(doc["actions"], 1)
        ]
        for text in render_rows(("#", "action", "target", "cost s", "reason"), rows, width):
            out.append(text + "\n")
    for note in doc.get("notes", ()):
        line(f"note: {note}")
    for job in doc.get("running", ()):
        line(f"running: {job['job']} on {', '.join(job['instances'])}")
    started = {a["job"] for a in doc["actions"] if a["action"] == "start"}
    for job in doc.get("pending", ()):
        fate = "started by this plan" if job["job"] in started else "waits"
        line(f"queued: {job['job']} ({job['ranks']} x {job['need']}): {fate}")
    for where, why in doc.get("blocked", {}).items():
        line(f"left alone: {where}: {why}")
    for job, why in doc.get("left_out", {}).items():
        line(f"not planned for: job {job}: {why}")
    out.rstrip()
    return out
