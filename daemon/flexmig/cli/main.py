"""``flexmig``: the command line for people and scripts.

Each subcommand lives in its own module under ``flexmig.cli`` with a ``register(subparsers)`` function; they
are imported lazily by name so that ``flexmig inventory`` never pays for torch or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence
from typing import Any

from flexmig import __version__
from flexmig.errors import FlexmigError

__all__ = ["FlexmigArgumentParser", "PlainHelpFormatter", "build_parser", "main", "plain_text"]

# Subcommand modules, in the order `flexmig --help` lists them.
COMMANDS: tuple[str, ...] = (
    "demo",
    "inventory",
    "layouts",
    "config",
    "events",
    "jobs",
    "simulate",
    "status",
    "plan",
    "standdown",
    "nvml",
    "install",
    "slurm",
    "sim",
)


_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """Help text for a terminal: reST inline literals (the module docstrings' ````flexmig status````) as plain
    text; the first sentence's own name (````flexmig status````: ...) is dropped, since the usage line says it."""
    stripped = re.sub(r"^``flexmig[^`]*``:\s*", "", text.strip())
    if stripped != text.strip():
        stripped = stripped[:1].upper() + stripped[1:]
    return _LITERAL.sub(r"\1", stripped)


class PlainHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with the descriptions and help strings taken from docstrings made plain."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))


class FlexmigArgumentParser(argparse.ArgumentParser):
    """The parser of ``flexmig`` and of every subcommand (argparse makes subparsers of the parent's class), so
    every ``--help`` shows plain text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand registered."""
    parser = FlexmigArgumentParser(prog="flexmig", description="Inspect and manage NVIDIA MIG nodes.")
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
