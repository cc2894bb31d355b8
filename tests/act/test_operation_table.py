"""The operation table is the one declaration of the control operations: every row has its handler, its CLI command
and (if any) its MQTT verb; the socket, the CLI and MQTT serve exactly its rows; its checks keep the socket's
refusals."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import flexmig
from flexmig.act.operation_table import DAEMON_OPERATIONS, JOBS_OPERATIONS, OPERATIONS, Operation, bind
from flexmig.act.operations import JobsApi
from flexmig.cli.main import build_parser
from flexmig.cli.operation_args import CLIENT_OPTIONS, add_operation_arguments, operation_request
from flexmig.errors import RequestError
from flexmig.mqtt.command_schema import VERBS
from flexmig.service import DaemonControl

CLI = Path(flexmig.__file__).resolve().parent / "cli"
SERVERS: list[tuple[type, tuple[Operation[Any], ...]]] = [
    (JobsApi, JOBS_OPERATIONS),
    (DaemonControl, DAEMON_OPERATIONS),
]


@pytest.mark.parametrize(("server", "op"), [(s, op) for s, rows in SERVERS for op in rows], ids=list(OPERATIONS))
def test_each_row_picks_an_async_method_of_the_object_that_serves_its_family(server: type, op: Operation[Any]) -> None:
    method = op.handler(server)  # the class: the row's handler picks the (unbound) method
    assert asyncio.iscoroutinefunction(method), f"{op.name}: {method!r} is not a coroutine function"


def test_every_row_belongs_to_one_family() -> None:
    rows: list[Operation[Any]] = [*JOBS_OPERATIONS, *DAEMON_OPERATIONS]
    assert [op.name for op in rows] == list(OPERATIONS)


@pytest.mark.parametrize("op", [op for op in OPERATIONS.values() if op.cli], ids=lambda op: op.name)
def test_each_rows_cli_command_exists_and_sends_that_operation(op: Operation[Any]) -> None:
    assert op.cli is not None
    words = op.cli.split()[1:]
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_:  # --help of a command that exists exits 0; of one that does not, 2
        parser.parse_args([*words, "--help"])
    assert exit_.value.code == 0, f"{op.cli}: no such command"
    calls = {m.group(1) for p in CLI.glob("*_cmd.py") for m in re.finditer(r'\.call\(\s*"([^"]+)"', p.read_text())}
    assert op.name in calls, f"no CLI module calls {op.name!r}"


def test_the_cli_calls_no_operation_outside_the_table() -> None:
    calls = {m.group(1) for p in CLI.glob("*.py") for m in re.finditer(r'\.call\(\s*"([^"]+)"', p.read_text())}
    assert calls <= set(OPERATIONS), calls - set(OPERATIONS)


def test_the_mqtt_verbs_are_the_rows_with_a_verb_and_offer_only_their_mqtt_arguments() -> None:
    assert {v: s.op for v, s in VERBS.items()} == {op.verb: op.name for op in OPERATIONS.values() if op.verb}
    for verb, spec in VERBS.items():
        op = OPERATIONS[spec.op]
        assert dict(spec.args) == {k: a for k, a in op.args.items() if a.mqtt}, verb
        assert spec.doc == op.doc and spec.example == op.example


def test_a_path_or_free_text_never_reaches_mqtt() -> None:
    offered = [(op.name, k) for op in OPERATIONS.values() if op.verb for k, a in op.mqtt_args().items()]
    free = [
        (name, k)
        for name, k in offered
        if OPERATIONS[name].args[k].kind == "string"
        and OPERATIONS[name].args[k].pattern is None
        and OPERATIONS[name].args[k].choices is None
    ]
    assert free == [], "every string MQTT may send has a fixed alphabet"
    assert "jobs.submit" not in {s.op for s in VERBS.values()}, "a path is not reachable from the network"


def test_bind_serves_exactly_the_rows_of_each_owner_and_refuses_a_missing_handler() -> None:
    class Partial:
        async def status_request(self, args: Mapping[str, Any]) -> Any:
            return dict(args)

    with pytest.raises(AttributeError, match="plan_request"):
        bind(DAEMON_OPERATIONS, Partial())  # type: ignore[misc]  # what mypy refuses, start refuses too


# ------------------------------------------------------------------------------------------------ the CLI
def command_parser(op: Operation[Any]) -> argparse.ArgumentParser:
    """The parser of ``op``'s ``flexmig`` command."""
    assert op.cli is not None
    parser: argparse.ArgumentParser = build_parser()
    for word in op.cli.split()[1:]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def undeclared(parser: argparse.ArgumentParser, op: Operation[Any]) -> set[str]:
    """The arguments ``parser`` takes that are neither ``op``'s row's nor the client's own."""
    dests = {a.dest for a in parser._actions if not isinstance(a, argparse._SubParsersAction)}
    return dests - set(op.args) - set(CLIENT_OPTIONS) - {"func"}


@pytest.mark.parametrize("op", [op for op in OPERATIONS.values() if op.cli], ids=lambda op: op.name)
def test_the_cli_declares_no_argument_that_the_row_does_not(op: Operation[Any]) -> None:
    parser = command_parser(op)
    assert undeclared(parser, op) == set()
    taken = {a.dest for a in parser._actions}
    assert set(op.args) <= taken, f"{op.cli} lacks {set(op.args) - taken}"


def test_an_argument_the_table_does_not_declare_is_caught() -> None:
    op = OPERATIONS["jobs.stop"]
    parser = argparse.ArgumentParser()
    add_operation_arguments(parser, op.name)
    assert undeclared(parser, op) == set()
    parser.add_argument("--grace", type=float)  # a CLI-only knob the daemon would never see
    assert undeclared(parser, op) == {"grace"}


def test_the_cli_sends_what_the_row_checks() -> None:
    parser = command_parser(OPERATIONS["jobs.resplit"])
    args = parser.parse_args(["train", "--ranks", "3", "--in-place"])
    request = operation_request("jobs.resplit", args)
    assert request == {"name": "train", "ranks": 3, "in_place": True}
    assert OPERATIONS["jobs.resplit"].check(request) == {**request, "profile": None}
    submit = command_parser(OPERATIONS["jobs.submit"]).parse_args(["spec.toml"])
    assert operation_request("jobs.submit", submit) == {"path": str(Path("spec.toml").absolute())}


# ------------------------------------------------------------------------------------------------ the checks
def check(op: str, args: Mapping[str, Any]) -> dict[str, Any]:
    return OPERATIONS[op].check(args)


@pytest.mark.parametrize(
    ("op", "args", "message"),
    [
        ("jobs.list", {"x": 1}, "unknown arguments: x"),
        ("jobs.migrate", {"name": "a", "b": 1, "a": 2}, "unknown arguments: a, b"),
        ("status", {"verbose": True}, "status takes no arguments, got verbose"),
        ("jobs.submit", {}, "argument 'path' is required"),
        ("jobs.submit", {"path": ""}, "argument 'path' must be a non-empty string"),
        ("jobs.submit", {"path": "/a\x00b"}, "argument 'path' must be a non-empty string"),
        ("jobs.submit", {"path": "/" + "a" * 4096}, "argument 'path' must be a non-empty string"),
        ("jobs.migrate", {"name": "a", "to": None}, "argument 'to' must be a non-empty string"),
        ("jobs.resplit", {"name": "a", "ranks": True}, "argument 'ranks' must be an integer"),
        ("jobs.resplit", {"name": "a", "ranks": 2.0}, "argument 'ranks' must be an integer"),
        ("jobs.stop", {"name": "a", "force": "yes"}, "argument 'force' must be true or false"),
        ("standdown", {"dry_run": 1}, "'stop_jobs' and 'dry_run' must be true or false"),
        ("plan", {"requests": "3g.71gb"}, "'requests' must be a list of at most 16 strings"),
        ("plan", {"requests": ["1g.18gb"] * 17}, "'requests' must be a list of at most 16 strings"),
        ("plan", {"requests": ["x" * 65]}, "each request must be a string like 3g.71gb or 2x1g.18gb"),
        ("plan", {"requests": [3]}, "each request must be a string like 3g.71gb or 2x1g.18gb"),
    ],
)
def test_a_bad_argument_is_refused_with_the_sockets_message(op: str, args: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError) as info:
        check(op, args)
    assert str(info.value) == message


def test_absent_optional_arguments_get_their_defaults_so_handlers_never_guess() -> None:
    assert check("jobs.stop", {"name": "a"}) == {"name": "a", "force": False}
    assert check("jobs.migrate", {"name": "a"}) == {"name": "a", "to": None, "in_place": False}
    assert check("standdown", {}) == {"stop_jobs": False, "dry_run": False}
    assert check("plan", {"requests": ["2x1g.18gb"]}) == {"requests": ["2x1g.18gb"]}


def test_acting_rows_are_those_that_may_change_the_node() -> None:
    assert {op.name for op in OPERATIONS.values() if op.acting} == {
        "jobs.submit",
        "jobs.migrate",
        "jobs.resplit",
        "jobs.stop",
        "standdown",
    }
