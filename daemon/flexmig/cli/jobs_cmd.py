"""``flexmig jobs``: submit, list, migrate, re-split and stop jobs through the daemon's control socket."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from flexmig.act.client import ControlClient
from flexmig.cli.job_table import render_jobs, where
from flexmig.cli.operation_args import add_operation_arguments, operation_request
from flexmig.cli.table import output_width

__all__ = ["DEFAULT_SOCKET", "connection_options", "register"]

DEFAULT_SOCKET = Path("/run/flexmig/control.sock")
_COMMANDS = (
    ("submit", "jobs.submit", "register a job spec (TOML) and start it"),
    ("list", "jobs.list", "list jobs"),
    ("migrate", "jobs.migrate", "checkpoint a job and move it to other MIG instances"),
    ("resplit", "jobs.resplit", "checkpoint a job and relaunch it with another number of ranks"),
    ("stop", "jobs.stop", "checkpoint and stop a job (--force: SIGTERM without a checkpoint)"),
)
"""``flexmig jobs`` verbs: the verb, its operation (whose row declares its arguments), its help."""


def register(sub: Any) -> None:
    """Add the ``jobs`` subcommand and its actions."""
    p: argparse.ArgumentParser = sub.add_parser(
        "jobs", help="submit, list, migrate, re-split and stop jobs", description=__doc__
    )
    connection_options(p)
    acts = p.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)

    for verb, op, what in _COMMANDS:
        s = acts.add_parser(verb, help=what)
        connection_options(s, after_verb=True)
        add_operation_arguments(s, op)
        if op == "jobs.list":
            s.add_argument("--json", action="store_true", help="print JSON for programs")
        s.set_defaults(func=_RUN[op])


def connection_options(p: argparse.ArgumentParser, *, after_verb: bool = False) -> None:
    """``--socket`` and ``--timeout``, before the action (``flexmig jobs --socket S list``) or, with
    ``after_verb``, after it (``flexmig jobs list --socket S``): there they default to nothing, so that a value
    given before the action stands unless one after it replaces it."""
    socket_default = Path(os.environ.get("FLEXMIG_CONTROL_SOCKET", str(DEFAULT_SOCKET)))
    p.add_argument(
        "--socket",
        type=Path,
        default=argparse.SUPPRESS if after_verb else socket_default,
        help=f"control socket (default $FLEXMIG_CONTROL_SOCKET or {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS if after_verb else 900.0,
        help="seconds the request may wait to begin, behind the action in flight (default 900): past them the "
        "daemon drops it and does nothing; once it has begun, the command waits for its end",
    )


def _client(args: argparse.Namespace) -> ControlClient:
    return ControlClient(args.socket, timeout_s=args.timeout)


def _report(result: dict[str, Any]) -> int:
    """Print one line per action of a plan result; status 0 only if every action completed."""
    for a in result.get("actions", []):
        steps = ", ".join(f"{s['step']} {s['duration_s'] * 1000:.0f} ms" for s in a.get("steps", []))
        line = f"{a['kind']}{' ' + a['job'] if a.get('job') else ''}: {a['outcome']} in {a['duration_s']:.2f} s"
        print(line + (f" ({steps})" if steps else ""))
        if a.get("error"):
            print(f"  {a['error']}")
    return 0 if result.get("ok") else 1


def _submit(args: argparse.Namespace) -> int:
    res = _client(args).call("jobs.submit", **operation_request("jobs.submit", args))
    status = _report(res)
    if res.get("queued"):
        print(f"queued: {res['queued']}; the planner starts it when it fits")
    job = res.get("job") or {}
    if job:
        print(f"job {job['name']}: {job['state']} on {where(job) or '-'}")
    return status


def _list(args: argparse.Namespace) -> int:
    jobs = _client(args).call("jobs.list")
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print("no jobs")
        return 0
    for line in render_jobs(jobs, output_width()):  # the table flexmig status prints
        print(line)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    return _report(_client(args).call("jobs.migrate", **operation_request("jobs.migrate", args)))


def _resplit(args: argparse.Namespace) -> int:
    return _report(_client(args).call("jobs.resplit", **operation_request("jobs.resplit", args)))


def _stop(args: argparse.Namespace) -> int:
    return _report(_client(args).call("jobs.stop", **operation_request("jobs.stop", args)))


_RUN = {
    "jobs.submit": _submit,
    "jobs.list": _list,
    "jobs.migrate": _migrate,
    "jobs.resplit": _resplit,
    "jobs.stop": _stop,
}
