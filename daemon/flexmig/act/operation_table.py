"""The control operations, declared once: name, arguments, who may call them, read-only or acting, and the handler.

Every control request, whoever sends it, names one operation of :data:`OPERATIONS`:

* the **control socket** (:mod:`flexmig.act.control`) serves every operation; its handlers are bound here
  (:func:`bind`), each behind the argument checks of its row, so a handler only ever sees arguments that passed them;
* the **CLI** calls them through the socket (``cli``: the ``flexmig`` command that does);
* **MQTT** offers the rows with a ``verb`` (``commands/<verb>``): :mod:`flexmig.mqtt.command_schema` derives its
  verbs, their stricter checks (fixed alphabets, ranges) and the published ``schemas/command.v1.schema.json`` from
  this table, and forwards a valid command to the same dispatcher as the socket.

An **acting** operation changes the node: the daemon runs it under its action lock (no planning round meanwhile) and
refuses it while stopping. Each row's ``handler`` picks the method that runs it from the object serving its family,
typed by one Protocol per family: :class:`JobsOps` for the rows of :data:`JOBS_OPERATIONS` (the jobs API,
:class:`flexmig.act.operations.JobsApi`, which ``python -m flexmig.actuatord`` serves too), :class:`DaemonOps` for
those of :data:`DAEMON_OPERATIONS` (operations that need the running daemon: its snapshot, its planner, its mode;
served by the service layer above ``act``). mypy holds each server to its family's Protocol, and an editor follows a
row's ``handler`` to the Protocol's method and from there to its implementations.

The CLI's arguments for an operation are generated from its row (``flexmig.cli.operation_args``): a required
string is a positional argument, every other argument an option named after it (``in_place``: ``--in-place``),
unless the row's :attr:`Arg.cli` says otherwise.

``python -m flexmig.act.operation_table --markdown`` prints the table for ``docs/architecture.md`` (a test keeps
them equal).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Literal, Protocol, TypeVar

from flexmig.act.control import Handler
from flexmig.errors import RequestError
from flexmig.mig.catalogue import MODELS

__all__ = [
    "DAEMON_OPERATIONS",
    "ID_PATTERN",
    "JOBS_OPERATIONS",
    "JOB_PATTERN",
    "OPERATIONS",
    "Arg",
    "ArgKind",
    "CliForm",
    "DaemonOps",
    "JobsOps",
    "Operation",
    "bind",
    "handler_name",
    "markdown",
]

ArgKind = Literal["string", "integer", "boolean", "strings"]
"""An argument's JSON type: a string, an integer, true/false, or a list of strings."""
Args = Mapping[str, Any]
"""An operation's arguments, checked against its row (defaults filled in)."""


class JobsOps(Protocol):
    """The jobs API's operations (:class:`flexmig.act.operations.JobsApi`): one method per row of
    :data:`JOBS_OPERATIONS`."""

    async def submit(self, args: Args) -> dict[str, Any]:
        """``jobs.submit``."""
        ...

    async def list_jobs(self, args: Args) -> list[dict[str, Any]]:
        """``jobs.list``."""
        ...

    async def migrate(self, args: Args) -> dict[str, Any]:
        """``jobs.migrate``."""
        ...

    async def resplit(self, args: Args) -> dict[str, Any]:
        """``jobs.resplit``."""
        ...

    async def stop(self, args: Args) -> dict[str, Any]:
        """``jobs.stop``."""
        ...


class DaemonOps(Protocol):
    """The running daemon's operations: one method per row of :data:`DAEMON_OPERATIONS` (served by the service
    layer above ``act``, which holds the snapshot, the planner and the mode)."""

    async def status_request(self, args: Args) -> dict[str, Any]:
        """``status``."""
        ...

    async def plan_request(self, args: Args) -> dict[str, Any]:
        """``plan``."""
        ...

    async def standdown_request(self, args: Args) -> dict[str, Any]:
        """``standdown``."""
        ...


F = TypeVar("F")
"""A handler family: the Protocol of the object that serves some rows."""

# Patterns are anchored at both ends; ``(?!\n)`` keeps ``$`` from matching before a trailing newline (which Python
# and PCRE allow), so every JSON Schema implementation and the checks agree on every string.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$(?!\n)"
"""An MQTT command's ``id``."""
JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$(?!\n)"
"""Job names, as :mod:`flexmig.jobspec.spec` accepts them."""
_PROFILES = tuple(sorted({p.name for m in MODELS for p in m.profiles}))
_MAX_STR = 4096
_MAX_REQUESTS = 16


@dataclass(frozen=True, slots=True)
class CliForm:
    """How the ``flexmig`` command takes an argument, beside the default form.

    ``flag``: the option's name (``--request`` for a list given once per item); ``metavar``: what its help calls the
    value; ``local_path``: a file named on the caller's side, sent as an absolute path.
    """

    flag: str | None = None
    metavar: str | None = None
    local_path: bool = False


@dataclass(frozen=True, slots=True)
class Arg:
    """One argument of an operation.

    Every caller's value is checked for its ``kind`` (strings: non-empty, at most ``max_len`` characters, no NUL;
    ``strings``: a list of at most ``max_items`` such strings). ``pattern``, ``choices``, ``minimum`` and
    ``maximum`` are the network's stricter checks: MQTT commands (and the published schema) must meet them too;
    the local socket, whose callers are the daemon's owner and root, gets the operation's own, clearer refusals
    instead (an unknown profile is named against this node's GPU model). ``mqtt=False`` keeps the argument off
    MQTT altogether. ``invalid`` (and ``invalid_item``) replace the default message for a bad value.
    """

    kind: ArgKind
    doc: str
    required: bool = False
    default: Any = None
    pattern: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    mqtt: bool = True
    max_len: int = _MAX_STR
    max_items: int | None = None
    invalid: str | None = None
    invalid_item: str | None = None
    cli: CliForm | None = None
    """How the ``flexmig`` command takes it, where the default form (see the module docstring) will not do."""

    def schema(self) -> dict[str, Any]:
        """This argument as JSON Schema (what an MQTT command must meet)."""
        out: dict[str, Any] = {"description": self.doc}
        if self.choices is not None:
            out["enum"] = list(self.choices)
            return out
        out["type"] = self.kind
        if self.pattern is not None:
            out["pattern"] = self.pattern
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out

    def check(self, key: str, value: Any) -> Any:
        """``value`` if it is a valid ``key``, else RequestError with the message the control socket has always
        given for it."""
        if self.kind == "integer":
            if not isinstance(value, int) or isinstance(value, bool):
                raise RequestError(self.invalid or f"argument {key!r} must be an integer")
        elif self.kind == "boolean":
            if not isinstance(value, bool):
                raise RequestError(self.invalid or f"argument {key!r} must be true or false")
        elif self.kind == "strings":
            if not isinstance(value, list) or (self.max_items is not None and len(value) > self.max_items):
                raise RequestError(self.invalid or f"argument {key!r} must be a list of strings")
            if not all(self._string(item) for item in value):
                raise RequestError(self.invalid_item or f"each of {key!r} must be a non-empty string")
        elif not self._string(value):
            raise RequestError(self.invalid or f"argument {key!r} must be a non-empty string")
        return value

    def _string(self, value: Any) -> bool:
        return isinstance(value, str) and 0 < len(value) <= self.max_len and "\x00" not in value


@dataclass(frozen=True)  # not slots: typing sets __orig_class__ on Operation[F](...), which slots refuse
class Operation(Generic[F]):
    """One control operation: one row of :data:`OPERATIONS` (see the module docstring for each column)."""

    name: str
    doc: str
    args: Mapping[str, Arg]
    acting: bool
    handler: Callable[[F], Handler]
    """The method of the object serving the row's family (:class:`JobsOps`, :class:`DaemonOps`) that runs it,
    given the checked arguments."""
    cli: str | None = None
    """The ``flexmig`` command that calls it (None: no command does)."""
    verb: str | None = None
    """The MQTT command verb (``<prefix>/<node>/commands/<verb>``); None: not callable from the network."""
    example: Mapping[str, Any] = field(default_factory=dict)
    """An MQTT command payload for the verb (the published schema's example)."""
    unknown: str = "unknown arguments: {names}"
    """The refusal of arguments it does not take (``{names}``: theirs, sorted)."""

    @property
    def callers(self) -> tuple[str, ...]:
        """Who may call it: ``socket`` always, ``cli`` and ``mqtt`` when a command or a verb says so."""
        return ("socket", *(("cli",) if self.cli else ()), *(("mqtt",) if self.verb else ()))

    def mqtt_args(self) -> Mapping[str, Arg]:
        """The arguments an MQTT command may carry."""
        return MappingProxyType({k: a for k, a in self.args.items() if a.mqtt})

    def check(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments with defaults filled in, or RequestError naming the first one that is wrong."""
        extra = set(args) - set(self.args)
        if extra:
            raise RequestError(self.unknown.format(names=", ".join(sorted(extra))))
        out: dict[str, Any] = {}
        for key, arg in self.args.items():
            if key in args:  # an explicit null is a bad value, not an absent argument: it must not pick the default
                out[key] = arg.check(key, args[key])
            elif arg.required:
                raise RequestError(f"argument {key!r} is required")
            else:
                out[key] = arg.default
        return out


def _table(*rows: Operation[Any]) -> Mapping[str, Operation[Any]]:
    return MappingProxyType({op.name: op for op in rows})


_FLAGS = "'stop_jobs' and 'dry_run' must be true or false"
_PROFILE = CliForm(metavar="PROFILE")
_JOB = Arg("string", "the job's name (as in its spec)", required=True, pattern=JOB_PATTERN)
_IN_PLACE = Arg(
    "boolean",
    "allow the move to restart the job on (or over) the instances it runs on, cold, when nothing else fits; "
    "without it such a move is refused and nothing is moved",
    default=False,
)

JOBS_OPERATIONS: tuple[Operation[JobsOps], ...] = (
    Operation[JobsOps](
        "jobs.submit",
        "Register a job spec (the absolute path of a TOML file the daemon reads) and start it, or queue it until it "
        "fits.",
        {
            "path": Arg(
                "string",
                "absolute path of the job spec",
                required=True,
                mqtt=False,
                cli=CliForm(metavar="FILE", local_path=True),
            )
        },
        acting=True,
        handler=lambda jobs: jobs.submit,
        cli="flexmig jobs submit",
    ),
    Operation[JobsOps](
        "jobs.list",
        "The journalled jobs, with what is true now laid over each (state, ranks, instances, last checkpoint).",
        {},
        acting=False,
        handler=lambda jobs: jobs.list_jobs,
        cli="flexmig jobs list",
    ),
    Operation[JobsOps](
        "jobs.migrate",
        "Checkpoint a running job, move its ranks to other instances (of profile 'to', default: the same) and "
        "resume it there.",
        {
            "name": _JOB,
            "to": Arg("string", "MIG profile of the new instances", choices=_PROFILES, cli=_PROFILE),
            "in_place": _IN_PLACE,
        },
        acting=True,
        handler=lambda jobs: jobs.migrate,
        cli="flexmig jobs migrate",
        verb="migrate",
        example={"id": "op-42", "args": {"name": "train", "to": "2g.35gb"}},
    ),
    Operation[JobsOps](
        "jobs.resplit",
        "Checkpoint a running job and restart it over another number of instances (a new world size), within "
        "its spec's ranks.min..ranks.max.",
        {
            "name": _JOB,
            "ranks": Arg(
                "integer", "the new number of ranks", required=True, minimum=1, maximum=64, cli=CliForm(metavar="N")
            ),
            "profile": Arg("string", "MIG profile of each rank's instance", choices=_PROFILES, cli=_PROFILE),
            "in_place": _IN_PLACE,
        },
        acting=True,
        handler=lambda jobs: jobs.resplit,
        cli="flexmig jobs resplit",
        verb="resplit",
        example={"id": "op-43", "args": {"name": "train", "ranks": 4}},
    ),
    Operation[JobsOps](
        "jobs.stop",
        "Stop a running job (it is asked to checkpoint first unless force is true).",
        {"name": _JOB, "force": Arg("boolean", "stop without waiting for a checkpoint", default=False)},
        acting=True,
        handler=lambda jobs: jobs.stop,
        cli="flexmig jobs stop",
        verb="stop",
        example={"id": "op-44", "args": {"name": "train"}},
    ),
)
"""The jobs API's rows (:class:`JobsOps`), in the order ``docs/architecture.md`` lists them."""

DAEMON_OPERATIONS: tuple[Operation[DaemonOps], ...] = (
    Operation[DaemonOps](
        "status",
        "The status document: GPUs, instances, activity, jobs, fragmentation and findings, from the latest sweep "
        "and the journal (no NVML call).",
        {},
        acting=False,
        handler=lambda daemon: daemon.status_request,
        cli="flexmig status",
        unknown="status takes no arguments, got {names}",
    ),
    Operation[DaemonOps](
        "plan",
        "What the planner would do now, with its reasons (the daemon's plan operation); changes nothing.",
        {
            "requests": Arg(
                "strings",
                "extra demand to plan for, each [Nx]PROFILE",
                default=(),
                mqtt=False,
                max_len=64,
                max_items=_MAX_REQUESTS,
                invalid=f"'requests' must be a list of at most {_MAX_REQUESTS} strings",
                invalid_item="each request must be a string like 3g.71gb or 2x1g.18gb",
                cli=CliForm(flag="--request", metavar="[Nx]PROFILE"),
            )
        },
        acting=False,
        handler=lambda daemon: daemon.plan_request,
        cli="flexmig plan",
        verb="plan-now",
        example={"id": "op-45"},
    ),
    Operation[DaemonOps](
        "standdown",
        "Give every GPU back its baseline layout (a mig-parted configuration), then switch to mode observe; "
        "dry_run only says what it would do.",
        {
            "stop_jobs": Arg("boolean", "stop the jobs in the way", default=False, mqtt=False, invalid=_FLAGS),
            "dry_run": Arg(
                "boolean", "change nothing, say what would be done", default=False, mqtt=False, invalid=_FLAGS
            ),
        },
        acting=True,
        handler=lambda daemon: daemon.standdown_request,
        cli="flexmig standdown",
    ),
)
"""The running daemon's rows (:class:`DaemonOps`)."""

OPERATIONS: Mapping[str, Operation[Any]] = _table(*JOBS_OPERATIONS, *DAEMON_OPERATIONS)
"""Every control operation, in the order ``docs/architecture.md`` lists them."""


def bind(
    rows: Sequence[Operation[F]],
    target: F,
    wrap: Callable[[Operation[F], Handler], Handler] | None = None,
) -> dict[str, Handler]:
    """The handlers of ``rows`` (one family's): ``target``'s method each row's ``handler`` picks (``wrap(op,
    method)`` in its place when given: the daemon serializes the acting ones), behind the row's argument checks.

    AttributeError if ``target`` lacks one (mypy says so first): a row without its handler is a bug found at start,
    not a refusal at the first request."""
    out: dict[str, Handler] = {}
    for op in rows:
        method = op.handler(target)
        out[op.name] = _checked(op, method if wrap is None else wrap(op, method))
    return out


def _checked(op: Operation[Any], handler: Handler) -> Handler:
    async def run(args: Mapping[str, Any]) -> Any:
        return await handler(op.check(args))

    return run


class _Names:
    """Stands in for a family's server to read which method a row's ``handler`` picks."""

    def __getattr__(self, name: str) -> str:
        return name


def handler_name(op: Operation[Any]) -> str:
    """``Protocol.method`` of the handler of ``op`` (for the table in ``docs/architecture.md``)."""
    family = "JobsOps" if op in JOBS_OPERATIONS else "DaemonOps"
    return f"{family}.{op.handler(_Names())}"


def markdown() -> str:
    """The operations as a Markdown table (for ``docs/architecture.md``)."""
    lines = [
        "| operation | arguments | callers | acts | handler |",
        "|---|---|---|---|---|",
    ]
    for op in OPERATIONS.values():
        args = ", ".join(f"`{k}`" if a.required else f"`{k}`?" for k, a in op.args.items()) or "none"
        who = [f"`{op.cli}`" if c == "cli" else f"MQTT `{op.verb}`" if c == "mqtt" else c for c in op.callers]
        lines.append(
            f"| `{op.name}` | {args} | {', '.join(who)} | {'yes' if op.acting else 'no'} | `{handler_name(op)}` |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flexmig.act.operation_table --markdown``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["--markdown"]:
        print("usage: python -m flexmig.act.operation_table --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
