"""``flexmig config check [FILE]`` and ``flexmig config example``: validate a configuration, print a full one."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flexmig.config import DEFAULT_CONFIG_PATH, DEFERRABLE_KEYS, Config, ConfigFileError, load_config, render_toml

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
