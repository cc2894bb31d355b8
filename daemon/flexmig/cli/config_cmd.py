"""``flexmig config check [FILE]`` and ``flexmig config example``: validate a configuration, print a full one."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flexmig.config import DEFAULT_CONFIG_PATH, DEFERRABLE_KEYS, ConfigFileError, load_config, render_toml

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
    check.add_argument("file", nargs="?", default=str(DEFAULT_CONFIG_PATH), help=f"default {DEFAULT_CONFIG_PATH}")
    check.set_defaults(func=run_check)
    example = actions.add_parser(
        "example",
        help="print a commented configuration with every key at its default",
        description="The output is a valid file: flexmig config example > /etc/flexmig/flexmig.toml",
    )
    example.set_defaults(func=run_example)


def run_check(args: argparse.Namespace) -> int:
    """Load the file exactly as the daemon does; print OK or the problems."""
    try:
        cfg = load_config(args.file)
    except ConfigFileError as exc:
        print(exc, file=sys.stderr)
        n = len(exc.problems)
        if exc.problems and all(p.key in DEFERRABLE_KEYS for p in exc.problems):
            verdict = (
                "flexmigd would start with MQTT publishing off until a reload fixes it (events wait in the outbox)"
            )
        else:
            verdict = "the daemon would refuse this file"
        print(f"flexmig: {args.file}: {n} problem{'s' if n != 1 else ''}; {verdict}", file=sys.stderr)
        return 2
    extras = [f"mode {cfg.mode}"]
    extras.append(f"metrics {cfg.prometheus.listen}" if cfg.prometheus.enabled else "metrics off")
    extras.append(f"mqtt {cfg.mqtt.broker}" if cfg.mqtt.enabled else "mqtt off")
    print(f"{args.file}: OK ({', '.join(extras)})")
    return 0


def run_example(args: argparse.Namespace) -> int:
    """Print the commented default configuration."""
    del args
    sys.stdout.write(render_toml())
    return 0
