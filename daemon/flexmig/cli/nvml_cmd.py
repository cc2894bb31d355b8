"""``flexmig nvml record OUT.json``: capture, read-only, how this machine's driver answers every NVML call the
simulator implements, for each GPU and each MIG device; the first thing to run when a GPU machine is at hand.

The document feeds ``--sim recording:OUT.json`` (or ``--sim-from OUT.json``), a simulated node that answers the
same, so tests and demos can run against what a real H100/H200 said.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from flexmig.errors import ConfigError
from flexmig.nvml.record import record
from flexmig.sim import install, uninstall
from flexmig.sim.recorded import PREFIX

__all__ = ["register", "run_record", "summary"]


def register(sub: Any) -> None:
    """Add the ``nvml`` subcommand and its ``record`` verb."""
    p: argparse.ArgumentParser = sub.add_parser(
        "nvml", help="talk to NVML directly (record how the driver answers)", description=__doc__
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    r = verbs.add_parser(
        "record",
        help="record, read-only, every answer of the driver into a JSON file",
        description="Walk the driver read-only (no MIG mode change, no instance created or destroyed, no "
        "setting) and write how it answers each NVML call the simulator implements, for every GPU and MIG device.",
    )
    r.add_argument("out", metavar="OUT.json", help="where to write the recording ('-' for standard output)")
    r.add_argument("--force", action="store_true", help="replace OUT.json if it exists")
    source = r.add_mutually_exclusive_group()
    source.add_argument("--sim", metavar="SPEC", help="record a simulated node instead of the driver")
    source.add_argument(
        "--sim-from", metavar="FILE", type=Path, help="record a simulated node built from an earlier recording"
    )
    r.set_defaults(func=run_record)


def summary(doc: dict[str, Any]) -> str:
    """One line on what a recording holds."""
    calls = [doc["system"], *(g["calls"] for g in doc["gpus"])]
    calls += [d["calls"] for g in doc["gpus"] for d in g["mig_devices"]]
    answers = [a for table in calls for a in table.values()]
    errors = sum(1 for a in answers if "error" in a)
    migs = sum(len(g["mig_devices"]) for g in doc["gpus"])
    return (
        f"{len(doc['gpus'])} GPU(s), {migs} MIG device(s), {len(answers)} calls: "
        f"{len(answers) - errors} answered, {errors} errors"
    )


def _write(out: str, text: str, force: bool) -> None:
    if out == "-":
        sys.stdout.write(text)
        return
    path = Path(out)
    if path.exists() and not force:
        raise ConfigError(f"{path} exists; pass --force to replace it")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc}") from exc


def run_record(args: argparse.Namespace) -> int:
    """Record the driver (or a simulated node) and write the document."""
    spec = args.sim if args.sim is not None else (None if args.sim_from is None else f"{PREFIX}{args.sim_from}")
    if args.out != "-" and Path(args.out).exists() and not args.force:
        raise ConfigError(f"{args.out} exists; pass --force to replace it")
    if spec is not None:
        install(spec)
    try:
        doc = record(progress=lambda what: print(f"recording {what}", file=sys.stderr))
    finally:
        if spec is not None:
            uninstall()
    _write(args.out, json.dumps(doc, indent=1, sort_keys=True) + "\n", args.force)
    where = "standard output" if args.out == "-" else args.out
    print(f"flexmig nvml record: {summary(doc)}; written to {where}", file=sys.stderr)
    return 0
