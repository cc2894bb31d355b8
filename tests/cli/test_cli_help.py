"""What ``flexmig --help`` and every subcommand's help show people, and where options may go.

Help texts come from module docstrings written in reST: a terminal gets plain text, without the double backquotes
(````flexmig inventory````) or a regular expression of a key's grammar; ``--socket`` and ``--timeout`` of
``flexmig jobs`` work before the action and after it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.cli.main import build_parser, plain_text

_REGEX_BITS = re.compile(r"\{\d*,\d*\}|\[A-Z|\[a-z|\\d|\(\?|\[\^")


def parsers(parser: argparse.ArgumentParser, name: str = "flexmig") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


ALL = list(parsers(build_parser()))


def test_every_subcommand_is_reached() -> None:
    names = {name for name, _ in ALL}
    assert {"flexmig demo", "flexmig status", "flexmig jobs list", "flexmig config check", "flexmig layouts"} <= names


@pytest.mark.parametrize(("name", "parser"), ALL, ids=[name for name, _ in ALL])
def test_help_is_plain_text(name: str, parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert "``" not in text, text
    assert not _REGEX_BITS.search(text), text
    assert ":func:" not in text and ":class:" not in text


def test_a_docstring_becomes_a_sentence_without_its_command_name() -> None:
    assert plain_text("``flexmig status``: GPUs and ``--json`` output.") == "GPUs and --json output."
    assert plain_text("Replays ``trace``.") == "Replays trace."


@pytest.mark.parametrize(
    ("argv", "socket", "timeout"),
    [
        (["jobs", "--socket", "/a", "list"], "/a", 900.0),
        (["jobs", "list", "--socket", "/b", "--timeout", "5"], "/b", 5.0),
        (["jobs", "--socket", "/a", "--timeout", "7", "stop", "j", "--socket", "/b"], "/b", 7.0),
        (["jobs", "submit", "/spec.toml", "--socket", "/c"], "/c", 900.0),
    ],
)
def test_jobs_takes_socket_and_timeout_before_or_after_the_action(
    argv: list[str], socket: str, timeout: float
) -> None:
    args = build_parser().parse_args(argv)
    assert (args.socket, args.timeout) == (Path(socket), timeout)
