"""``flexmig config check [FILE]``, ``config example`` and ``config keys``: validate a configuration, print a full
commented one, list the keys (``--markdown``: the reference table of docs/configuration.md)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from flexmig.config import (
    DEFAULT_CONFIG_PATH,
    DEFERRABLE_KEYS,
    Config,
    ConfigFileError,
    applies_at_next_start,
    iter_keys,
    load_config,
    render_keys_markdown,
    render_toml,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``config`` subcommand with its ``check`` and ``example`` actions."""
    p: argparse.ArgumentParser = sub.add_parser(
        "config", help="check a configuration file or print a commented example", description=__doc__
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="validate a configuration file (permissions included) as the daemon would",
        description="Exit 0 with one line 'FILE: OK (mode ...)' or exit 2 with every problem as FILE:LINE: KEY: why.",
    )
    check.add_argument(
        "file",
        nargs="?",
        help=f"default {DEFAULT_CONFIG_PATH}; where it does not exist, flexmigd starts on its built-in defaults",
    )
    check.set_defaults(func=run_check)
    example = actions.add_parser(
        "example",
        help="print a commented configuration with every key at its default",
        description="The output is a valid file: flexmig config example > /etc/flexmig/flexmig.toml",
    )
    example.set_defaults(func=run_example)
    keys = actions.add_parser(
        "keys",
        help="list every key with its default, when a reload applies it, and what it does",
        description="The reference of docs/configuration.md, generated from the schema flexmigd validates with.",
    )
    keys.add_argument("--markdown", action="store_true", help="as the Markdown table of docs/configuration.md")
    keys.set_defaults(func=run_keys)


def run_check(args: argparse.Namespace) -> int:
    """Load the file exactly as the daemon does; print OK or the problems.

    Without a file argument, the default file is checked where it exists; where it does not, flexmigd (which
    reads it only if it exists) starts on its built-in defaults, and that is what this says, with status 0.
    """
    if args.file is None and not DEFAULT_CONFIG_PATH.exists():
        print(
            f"{DEFAULT_CONFIG_PATH}: no such file; flexmigd starts on its built-in defaults "
            f"({_summary(Config.default())}); flexmig config example prints them as a file"
        )
        return 0
    file = DEFAULT_CONFIG_PATH if args.file is None else args.file
    try:
        cfg = load_config(file)
    except ConfigFileError as exc:
        print(exc, file=sys.stderr)
        n = len(exc.problems)
        if exc.problems and all(p.key in DEFERRABLE_KEYS for p in exc.problems):
            verdict = (
                "flexmigd would start with MQTT publishing off until a reload fixes it (events wait in the outbox)"
            )
        else:
            verdict = "flexmigd would refuse to start with this file, and a reload would keep the running one"
        print(f"flexmig: {file}: {n} problem{'s' if n != 1 else ''}; {verdict}", file=sys.stderr)
        return 2
    print(f"{file}: OK ({_summary(cfg)})")
    return 0


def _summary(cfg: Config) -> str:
    """``mode observe, metrics 127.0.0.1:9400, mqtt off``: what a configuration makes the daemon do first."""
    extras = [f"mode {cfg.mode}"]
    extras.append(f"metrics {cfg.prometheus.listen}" if cfg.prometheus.enabled else "metrics off")
    extras.append(f"mqtt {cfg.mqtt.broker}" if cfg.mqtt.enabled else "mqtt off")
    return ", ".join(extras)


def run_example(args: argparse.Namespace) -> int:
    """Print the commented default configuration."""
    del args
    sys.stdout.write(render_toml())
    return 0


def run_keys(args: argparse.Namespace) -> int:
    """Print every key (a Markdown table with ``--markdown``, else one block per key)."""
    if args.markdown:
        sys.stdout.write(render_keys_markdown())
        return 0
    for key, value, meta in iter_keys(Config.default()):
        shown = "unset" if value is None else repr(value)
        reload = "next start" if applies_at_next_start(key) else "at once"
        print(f"{key} = {shown}  ({reload})")
        print(textwrap.fill(" ".join(str(meta.get("doc", "")).replace("``", "").split()), 100,
                            initial_indent="    ", subsequent_indent="    "))  # fmt: skip
    return 0
