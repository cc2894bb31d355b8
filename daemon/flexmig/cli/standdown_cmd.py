"""``flexmig standdown``: give every GPU back its baseline layout, then stop acting.

The baseline is a configuration of a mig-parted file (``[baseline] mig_parted_file`` and ``mig_parted_config``),
the node's static layout. Each GPU that does not hold the baseline's MIG devices is re-laid to them, keeping the
instances that already fit; a GPU where that would destroy an instance running a process flexmig cannot account
for (of no job it registered), or a GPU instance without a compute instance, is left as it is, and so is one
where a job of flexmig's runs, unless ``--stop-jobs`` has the job checkpoint and stop first. flexmig never
changes MIG mode. Afterwards the daemon is in mode observe (until a reload or restart brings back the configured
mode). ``--dry-run`` says what it would do, in any mode, and changes nothing. Exit status 0 when every GPU the
baseline names is at it, 1 otherwise (each GPU's reason is printed), 2 for a bad request.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from flexmig.act.client import ControlClient
from flexmig.cli.jobs_cmd import connection_options
from flexmig.cli.operation_args import add_operation_arguments, operation_request

__all__ = ["register", "render", "run"]


def register(sub: Any) -> None:
    """Add the ``standdown`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "standdown", help="restore the baseline layout (a mig-parted configuration), then stop acting",
        description=__doc__,
    )  # fmt: skip
    connection_options(p)
    add_operation_arguments(p, "standdown")
    p.add_argument("--json", action="store_true", help="print JSON for programs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ask the daemon to stand down (or what it would do) and print each GPU's outcome."""
    doc = ControlClient(args.socket, timeout_s=args.timeout).call("standdown", **operation_request("standdown", args))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join(render(doc)))
    return 0 if doc.get("ok") else 1


def render(doc: dict[str, Any]) -> list[str]:
    """The answer for people, one line per GPU."""
    head = "stand-down (dry run, nothing changed)" if doc["dry_run"] else "stand-down"
    lines = [f"{head} to {doc['baseline']}"]
    for g in doc["gpus"]:
        state = g["state"]
        words = {"restore": "would be restored", "restored": "restored"}.get(state, state)
        line = f"  GPU {g['gpu']}: {words}"
        if state in ("restore", "restored", "failed") and g.get("target"):
            line += f" to {g['target']}"
            changes = []
            if g.get("stop"):
                changes.append(f"stop {', '.join(g['stop'])}")
            if g.get("destroy"):
                changes.append(f"destroy {', '.join(g['destroy'])}")
            if g.get("create"):
                changes.append(f"create {', '.join(g['create'])}")
            if changes:
                line += f" ({'; '.join(changes)})"
        if g.get("why") and state not in ("restore", "restored"):
            line += f": {g['why']}"
        lines.append(line)
    if not doc["dry_run"]:
        lines.append(
            f'mode {doc["mode"]}: the daemon no longer plans; set mode = "observe" in its configuration to keep it '
            "so after a restart"
        )
    return lines
