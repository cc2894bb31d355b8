"""``flexmig``: the command line for people and scripts.

Each subcommand lives in its own module under ``flexmig.cli`` with a ``register(subparsers)`` function; they
are imported lazily by name so that ``flexmig inventory`` never pays for torch or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from flexmig import __version__
from flexmig.errors import FlexmigError

__all__ = ["build_parser", "main"]

# Subcommand modules, in the order `flexmig --help` lists them.
COMMANDS: tuple[str, ...] = (
    "inventory",
    "layouts",
    "config",
    "events",
    "jobs",
    "simulate",
    "status",
    "plan",
    "nvml",
    "slurm",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="flexmig", description="Inspect and manage NVIDIA MIG nodes.")
    parser.add_argument("--version", action="version", version=f"flexmig {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"flexmig.cli.{name}_cmd")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flexmig`` console script; returns the exit status.

    Errors of ours print as one line on stderr with status 2 (bad input) or 1 (the node refused); anything else is
    a bug and keeps its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except FlexmigError as exc:
        print(f"flexmig: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `flexmig layouts h200 | head`: the reader left; say nothing more.
        sys.stderr.close()
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
