"""The arguments of the ``flexmig`` commands that call a control operation, generated from its row of
:data:`flexmig.act.operation_table.OPERATIONS` (as the MQTT command schema is): the CLI declares none of its own.

A required string is a positional argument; any other argument an option named after it (``in_place``:
``--in-place``; a boolean is a flag, an integer takes one, a list of strings is given once per item), with the row's
description as its help, unless the row's :class:`~flexmig.act.operation_table.CliForm` says otherwise. Options that
are the client's own (where the socket is, how long to wait, how to print the answer) are listed in
:data:`CLIENT_OPTIONS`; ``tests/act/test_operation_table.py`` allows no other.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from flexmig.act.operation_table import OPERATIONS, Arg

__all__ = ["CLIENT_OPTIONS", "add_operation_arguments", "operation_request"]

CLIENT_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        "help": "argparse's own",
        "socket": "where the daemon listens",
        "timeout": "how long to wait for the daemon",
        "json": "how the answer is printed",
        "watch": "how often flexmig status asks again",
        "sim": "ask a simulated node in this process instead of the daemon",
    }
)
"""Options of the operation commands that the client keeps (never sent to the daemon), each with why."""


def _flag(key: str, arg: Arg) -> str | None:
    """The option of ``key`` (None: positional)."""
    if arg.cli is not None and arg.cli.flag is not None:
        return arg.cli.flag
    if arg.kind == "string" and arg.required:
        return None
    return "--" + key.replace("_", "-")


def add_operation_arguments(parser: argparse.ArgumentParser, op: str) -> None:
    """Declare the arguments of operation ``op`` on ``parser`` (each stored under its row's key)."""
    for key, arg in OPERATIONS[op].args.items():
        metavar = arg.cli.metavar if arg.cli is not None else None
        flag = _flag(key, arg)
        if flag is None:
            parser.add_argument(key, metavar=metavar or key.upper(), help=arg.doc)
        elif arg.kind == "boolean":
            parser.add_argument(flag, dest=key, action="store_true", help=arg.doc)
        elif arg.kind == "strings":
            parser.add_argument(flag, dest=key, metavar=metavar, action="append", default=[], help=arg.doc)
        else:
            kind = int if arg.kind == "integer" else str
            parser.add_argument(flag, dest=key, metavar=metavar, type=kind, required=arg.required, help=arg.doc)


def operation_request(op: str, args: argparse.Namespace) -> dict[str, Any]:
    """The arguments of ``op`` as parsed into ``args``, to send: those given (a flag only when set; the row's check
    fills in the rest), a local file as an absolute path."""
    out: dict[str, Any] = {}
    for key, arg in OPERATIONS[op].args.items():
        value = getattr(args, key)
        if value is None or value is False:
            continue
        if arg.cli is not None and arg.cli.local_path:
            value = str(Path(value).absolute())
        out[key] = value
    return out
