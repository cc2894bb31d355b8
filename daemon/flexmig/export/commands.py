"""MQTT commands: operators ask a node to migrate, re-split or stop a job (or plan now) through the broker.

Off by default: the listener exists only with ``[mqtt] enabled = true`` and ``commands_enabled = true``, and it
refuses to start without broker credentials (``username`` and ``password_file``), or without TLS to a broker that
is not on loopback unless ``allow_plaintext_password = true`` says so. Topics under ``<prefix>/<node>/``:

* ``commands/<verb>`` (in, QoS 1): one JSON object per command, ``{"id": "...", "args": {...}}``; the verb is the
  topic's last level (``migrate``, ``resplit``, ``stop``, ``plan-now``), so broker ACLs can grant verbs one by one.
* ``commands/result`` (out, QoS 1, not retained): one JSON result per command, carrying the command's ``id``.

Every payload is checked against a strict schema before anything else sees it (``schemas/command.v1.schema.json``
is generated from :data:`VERBS`, see :func:`schema_documents`): at most :data:`MAX_COMMAND_BYTES`, UTF-8 JSON
without duplicate keys or NaN, known fields only, job names and profile names from fixed alphabets; there is no
free-form text, no argv and no path in any command. A valid command is forwarded as a control request line to the
same dispatcher as the control socket (:meth:`flexmig.act.control.ControlServer.dispatch`), so the same argument
checks and the same mode rules apply: in ``observe`` and ``advise`` nothing is executed. Retained commands are
refused (they would run again at every reconnect), repeated IDs are not run twice, and the session is clean, so
commands sent while the daemon was away are not run later. Every refusal is one log line naming the topic and why,
and a result message (an empty payload is no command: it is how a retained message is cleared, and is ignored);
nothing a publisher sends ends the listener.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from flexmig.config import HostPort
from flexmig.errors import ConfigError, FlexmigError
from flexmig.export.broker import BrokerConnection, check_tls_pair, client_arguments
from flexmig.export.cancellation import honour_cancel
from flexmig.export.events import NODE_NAME, Deduplicator, format_time
from flexmig.export.mqtt import backoff_delay, topic_for
from flexmig.mig.catalogue import MODELS

if TYPE_CHECKING:
    from flexmig.config import Config

__all__ = [
    "COMMAND_SCHEMA_VERSION",
    "MAX_COMMAND_BYTES",
    "VERBS",
    "ArgSpec",
    "Command",
    "CommandListener",
    "CommandRefusedError",
    "CommandSettings",
    "CommandStats",
    "Dispatch",
    "VerbSpec",
    "command_listener",
    "parse_command",
    "result_document",
    "schema_documents",
]

log = logging.getLogger(__name__)

COMMAND_SCHEMA_VERSION = 1
MAX_COMMAND_BYTES = 4096
"""The largest payload accepted; a command needs a few hundred bytes at most."""

# Patterns are anchored at both ends; ``(?!\n)`` keeps ``$`` from matching before a trailing newline (which Python
# and PCRE allow), so every JSON Schema implementation and this module agree on every string.
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$(?!\n)"
_JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$(?!\n)"  # job names, as flexmig.jobs.spec accepts them
_PROFILES = tuple(sorted({p.name for m in MODELS for p in m.profiles}))

Dispatch = Callable[[bytes], Awaitable[Mapping[str, Any]]]
"""Runs one control request line and answers ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...,
"type": ...}`` without raising: :meth:`flexmig.act.control.ControlServer.dispatch`."""


# ------------------------------------------------------------------------------------------------- the schema
@dataclass(frozen=True, slots=True)
class ArgSpec:
    """One argument of a verb: its JSON type and constraints (the schema and the checks both come from here)."""

    kind: Literal["string", "integer", "boolean"]
    doc: str
    required: bool = False
    pattern: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None

    def schema(self) -> dict[str, Any]:
        """This argument as JSON Schema."""
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


@dataclass(frozen=True, slots=True)
class VerbSpec:
    """A command verb: the control operation it is forwarded to, and its arguments."""

    name: str
    op: str
    doc: str
    args: Mapping[str, ArgSpec]
    example: Mapping[str, Any]

    def schema(self) -> dict[str, Any]:
        """The whole payload of this verb as JSON Schema."""
        required = [k for k, a in self.args.items() if a.required]
        args: dict[str, Any] = {
            "type": "object",
            "properties": {k: a.schema() for k, a in self.args.items()},
            "additionalProperties": False,
        }
        if required:
            args["required"] = required
        return {
            "description": self.doc,
            "type": "object",
            "properties": {"id": {"$ref": "#/$defs/id"}, "args": args},
            "required": ["id", "args"] if required else ["id"],
            "additionalProperties": False,
            "examples": [dict(self.example)],
        }


_JOB = ArgSpec("string", "the job's name (as in its spec)", required=True, pattern=_JOB_PATTERN)

VERBS: Mapping[str, VerbSpec] = MappingProxyType(
    {
        "migrate": VerbSpec(
            "migrate",
            "jobs.migrate",
            "Checkpoint a running job, move its ranks to other instances (of profile 'to', default: the same) and "
            "resume it there.",
            {"name": _JOB, "to": ArgSpec("string", "MIG profile of the new instances", choices=_PROFILES)},
            {"id": "op-42", "args": {"name": "train", "to": "2g.35gb"}},
        ),
        "resplit": VerbSpec(
            "resplit",
            "jobs.resplit",
            "Checkpoint a running job and restart it over another number of instances (a new world size), within "
            "its spec's ranks.min..ranks.max.",
            {
                "name": _JOB,
                "ranks": ArgSpec("integer", "the new number of ranks", required=True, minimum=1, maximum=64),
                "profile": ArgSpec("string", "MIG profile of each rank's instance", choices=_PROFILES),
            },
            {"id": "op-43", "args": {"name": "train", "ranks": 4}},
        ),
        "stop": VerbSpec(
            "stop",
            "jobs.stop",
            "Stop a running job (it is asked to checkpoint first unless force is true).",
            {"name": _JOB, "force": ArgSpec("boolean", "stop without waiting for a checkpoint")},
            {"id": "op-44", "args": {"name": "train"}},
        ),
        "plan-now": VerbSpec(
            "plan-now",
            "plan",
            "What the planner would do now, with its reasons (the daemon's plan operation); changes nothing.",
            {},
            {"id": "op-45"},
        ),
    }
)
"""The command verbs: the topic level, the control operation, the arguments. Nothing else is accepted."""

_ENVELOPE = frozenset({"id", "args"})


def schema_documents() -> dict[str, dict[str, Any]]:
    """The JSON Schemas published in ``schemas/`` (file name -> document), generated from :data:`VERBS`.

    ``command.v1.schema.json``: the payload on ``commands/<verb>`` must validate against ``#/$defs/<verb>``
    (the top level states the envelope every verb shares). ``command-result.v1.schema.json``: results.
    """
    verbs = ", ".join(VERBS)
    command = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://flexmig.invalid/schemas/command.v1.schema.json",
        "title": "flexmig MQTT command, schema version 1",
        "description": (
            f"Published on <prefix>/<node>/commands/<verb> at QoS 1, not retained, at most {MAX_COMMAND_BYTES} "
            f"bytes of UTF-8 JSON without duplicate keys. Verbs: {verbs}. The payload must validate against "
            "#/$defs/<verb>; this top level is the envelope they share. The result comes on "
            "<prefix>/<node>/commands/result with the same id."
        ),
        "type": "object",
        "properties": {"id": {"$ref": "#/$defs/id"}, "args": {"type": "object"}},
        "required": ["id"],
        "additionalProperties": False,
        "$defs": {
            "id": {
                "description": "chosen by the sender, unique per command; echoed in the result",
                "type": "string",
                "pattern": _ID_PATTERN,
            },
            **{name: verb.schema() for name, verb in VERBS.items()},
        },
    }
    result = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://flexmig.invalid/schemas/command-result.v1.schema.json",
        "title": "flexmig MQTT command result, schema version 1",
        "description": (
            "Published on <prefix>/<node>/commands/result at QoS 1, not retained: one per command received, "
            "whether run or refused. ok is true when the daemon ran the command; otherwise error says why and "
            "type names the kind of refusal."
        ),
        "type": "object",
        "properties": {
            "schema_version": {"const": COMMAND_SCHEMA_VERSION},
            "id": {
                "description": "the command's id; null when the payload had no valid id",
                "anyOf": [{"type": "string", "pattern": _ID_PATTERN}, {"type": "null"}],
            },
            "node": {"type": "string", "pattern": f"^{NODE_NAME.pattern}$"},
            "verb": {
                "description": "the command's verb; null when the topic named no known verb",
                "anyOf": [{"enum": list(VERBS)}, {"type": "null"}],
            },
            "time": {
                "type": "string",
                "format": "date-time",
                "pattern": "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d+)?Z$",
            },
            "ok": {"type": "boolean"},
            "result": {"description": "what the control operation answered (when ok)"},
            "error": {"type": "string", "minLength": 1},
            "type": {
                "description": "CommandRefused (bad payload or topic), DuplicateCommand, Busy, or the daemon's "
                "error type (RequestError, PlanRejectedError, JobSpecError, ...)",
                "type": "string",
                "pattern": "^[A-Za-z][A-Za-z0-9]{0,63}$",
            },
        },
        "required": ["schema_version", "id", "node", "verb", "time", "ok"],
        "additionalProperties": False,
        "if": {"properties": {"ok": {"const": True}}},
        "then": {"required": ["result"], "not": {"required": ["error"]}},
        "else": {"required": ["error", "type"], "not": {"required": ["result"]}},
    }
    return {"command.v1.schema.json": command, "command-result.v1.schema.json": result}


# --------------------------------------------------------------------------------------------------- parsing
class CommandRefusedError(FlexmigError, ValueError):
    """A command payload or topic was refused before anything ran; the message says which field and why."""

    def __init__(self, why: str, command_id: str | None = None) -> None:
        super().__init__(why)
        self.command_id = command_id


@dataclass(frozen=True, slots=True)
class Command:
    """A validated command: its sender-chosen ``id``, the verb, and arguments that passed :data:`VERBS`."""

    id: str
    verb: str
    args: Mapping[str, Any]

    @property
    def op(self) -> str:
        """The control operation it runs."""
        return VERBS[self.verb].op

    def control_line(self) -> bytes:
        """The control request line the dispatcher runs (same format as the control socket)."""
        return json.dumps({"op": self.op, "args": dict(self.args)}, separators=(",", ":")).encode() + b"\n"


def _show(value: object, limit: int = 60) -> str:
    """A short, printable rendering of an untrusted value (repr escapes control characters)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _DuplicateKeyError(ValueError):
    """Two equal keys in one object: parsers disagree on which wins, so neither does."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(f"payload has the key {_show(key)} twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(payload: bytes) -> Any:
    if len(payload) > MAX_COMMAND_BYTES:
        raise CommandRefusedError(f"payload of {len(payload)} bytes is larger than {MAX_COMMAND_BYTES}")
    if not payload:
        raise CommandRefusedError("empty payload")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise CommandRefusedError("payload is not UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise CommandRefusedError("payload is not JSON: nested too deeply") from None
    except _DuplicateKeyError as exc:
        raise CommandRefusedError(str(exc)) from None
    except ValueError as exc:
        raise CommandRefusedError(f"payload is not JSON: {exc}") from None


def _id_of(doc: object) -> str | None:
    """The payload's ``id`` when it is a valid one (so even a refusal can name its command)."""
    if isinstance(doc, dict):
        value = doc.get("id")
        if isinstance(value, str) and re.search(_ID_PATTERN, value):
            return value
    return None


def _check_arg(key: str, spec: ArgSpec, value: Any) -> Any:
    where = f"args.{key}"
    if spec.choices is not None:
        if not isinstance(value, str) or value not in spec.choices:
            raise ValueError(f"{where}: {_show(value)} is not one of {', '.join(spec.choices)}")
        return value
    if spec.kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"{where}: must be true or false, not {_show(value)}")
        return value
    if spec.kind == "integer":
        # JSON Schema's integer is a number without a fractional part (2.0 counts); true/false do not.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: must be an integer, not {_show(value)}")
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            raise ValueError(f"{where}: {_show(value)} is outside {spec.minimum}..{spec.maximum}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}: must be a string, not {_show(value)}")
    if spec.pattern is not None and not re.search(spec.pattern, value):
        raise ValueError(f"{where}: {_show(value)} does not match {spec.pattern}")
    return value


def parse_command(verb: str, payload: bytes) -> Command:
    """Validate one command (``verb`` from the topic, ``payload`` as received) against :data:`VERBS`.

    Pure. Raises :class:`CommandRefusedError` naming the field and the rule; never anything else for any input.
    """
    doc = _loads(payload)
    command_id = _id_of(doc)
    spec = VERBS.get(verb)
    if spec is None:
        raise CommandRefusedError(f"unknown verb {_show(verb)}; known: {', '.join(VERBS)}", command_id)
    if not isinstance(doc, dict):
        raise CommandRefusedError("payload must be a JSON object", command_id)
    unknown = sorted(set(doc) - _ENVELOPE)
    if unknown:
        names = ", ".join(_show(k, 30) for k in unknown[:5])
        raise CommandRefusedError(f"unknown field(s) {names}; a command has only id and args", command_id)
    if "id" not in doc:
        raise CommandRefusedError("id is required")
    if command_id is None:
        raise CommandRefusedError(f"id: {_show(doc['id'])} does not match {_ID_PATTERN}")
    raw_args = doc.get("args", None)
    required = [k for k, a in spec.args.items() if a.required]
    if raw_args is None and "args" not in doc:
        if required:
            raise CommandRefusedError(f"args is required for {verb} ({', '.join(required)})", command_id)
        raw_args = {}
    if not isinstance(raw_args, dict):
        raise CommandRefusedError(f"args must be a JSON object, not {_show(raw_args)}", command_id)
    extra = sorted(set(raw_args) - set(spec.args))
    if extra:
        known = ", ".join(spec.args) or "none"
        names = ", ".join(_show(k, 30) for k in extra[:5])
        raise CommandRefusedError(f"args: unknown argument(s) {names} for {verb} (known: {known})", command_id)
    args: dict[str, Any] = {}
    try:
        for key, arg in spec.args.items():
            if key in raw_args:
                args[key] = _check_arg(key, arg, raw_args[key])
            elif arg.required:
                raise ValueError(f"args.{key} is required for {verb}")
    except ValueError as exc:
        raise CommandRefusedError(str(exc), command_id) from None
    return Command(command_id, verb, MappingProxyType(args))


def result_document(
    node: str,
    command_id: str | None,
    verb: str | None,
    answer: Mapping[str, Any],
    at: float,
) -> dict[str, Any]:
    """The result message for one command: the control answer (``ok``/``result`` or ``ok``/``error``/``type``)
    in the envelope of ``schemas/command-result.v1.schema.json``."""
    doc: dict[str, Any] = {
        "schema_version": COMMAND_SCHEMA_VERSION,
        "id": command_id,
        "node": node,
        "verb": verb if verb in VERBS else None,
        "time": format_time(at),
        "ok": bool(answer.get("ok")),
    }
    if doc["ok"]:
        doc["result"] = answer.get("result")
    else:
        doc["error"] = str(answer.get("error") or "refused")
        kind = str(answer.get("type") or "")
        doc["type"] = kind if re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,63}", kind) else "Error"
    return doc


# -------------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True, slots=True)
class CommandSettings:
    """Where the listener connects and its limits; :meth:`from_config` builds it from ``[mqtt]``.

    Construction refuses (ConfigError naming the ``mqtt.*`` key) anonymous connections, and a password sent
    without TLS to a broker off this machine unless ``allow_plaintext_password``.
    """

    node: str
    broker: HostPort
    username: str | None
    password_file: Path | None
    topic_prefix: str = "flexmig/v1"
    client_id: str = ""
    """Empty: ``flexmig-<node>-commands`` (the publisher uses ``flexmig-<node>``; the broker allows one each)."""
    tls: bool = False
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_plaintext_password: bool = False
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0
    publish_timeout_s: float = 10.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    max_pending: int = 16
    """Commands accepted but not yet run; more are refused as Busy (commands run one at a time)."""
    max_unsent_results: int = 1000
    """Results kept while the broker is away (oldest dropped first)."""
    refusal_log_limit: int = 100
    """At most this many refusal lines per ``refusal_log_window_s``; the rest are counted in the next line."""
    refusal_log_window_s: float = 60.0
    trusted_uids: frozenset[int] | None = None
    """Owners the password file may have (None: root and the current user)."""

    def __post_init__(self) -> None:
        if not NODE_NAME.fullmatch(self.node):
            raise ConfigError(f"MQTT node name {self.node!r} is not one topic level ([A-Za-z0-9][A-Za-z0-9._-]*)")
        if not all(NODE_NAME.fullmatch(level) for level in self.topic_prefix.split("/")):
            raise ConfigError(f"MQTT topic prefix {self.topic_prefix!r}: levels must be [A-Za-z0-9._-], no wildcards")
        if self.client_id and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", self.client_id):
            raise ConfigError(f"MQTT client ID {self.client_id!r}: 1-64 of [A-Za-z0-9._-]")
        if self.username is None or self.password_file is None:
            raise ConfigError(
                "mqtt.commands_enabled: commands need broker credentials (mqtt.username and mqtt.password_file); "
                "an anonymous connection could be anyone's"
            )
        if not self.tls and not self.broker.is_loopback() and not self.allow_plaintext_password:
            raise ConfigError(
                f"mqtt.commands_enabled: the password would cross the network in clear to {self.broker}; "
                "set mqtt.tls = true (or mqtt.allow_plaintext_password = true)"
            )
        check_tls_pair(self)
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ConfigError("MQTT backoff: need 0 < backoff_initial_s <= backoff_max_s")
        if self.max_pending < 1 or self.max_unsent_results < 1 or self.refusal_log_limit < 1:
            raise ConfigError("MQTT commands: max_pending, max_unsent_results and refusal_log_limit must be >= 1")

    @property
    def identifier(self) -> str:
        """The listener's MQTT client ID."""
        return self.client_id or f"flexmig-{self.node}-commands"

    @property
    def base(self) -> str:
        """``<prefix>/<node>/commands``."""
        return topic_for(self.topic_prefix, self.node, "commands")

    @classmethod
    def from_config(
        cls, config: Config, node: str, trusted_uids: Collection[int] | None = None, **limits: Any
    ) -> CommandSettings:
        """Settings from the daemon's validated configuration (``limits`` overrides the fields after TLS)."""
        m = config.mqtt
        connection = BrokerConnection.from_config(m, trusted_uids)
        return cls(
            node=node,
            broker=connection.broker,
            topic_prefix=m.topic_prefix,
            client_id=f"{m.client_id}-commands" if m.client_id else "",
            allow_plaintext_password=m.allow_plaintext_password,
            **connection.login_fields(),
            **limits,
        )


@dataclass(frozen=True, slots=True)
class CommandStats:
    """Counters of the listener (for metrics and ``flexmig status``)."""

    connected: bool
    received: int
    refused: int
    """Refused before running: bad payload or topic, retained, duplicate ID, busy."""
    completed: int
    """Forwarded and answered ok."""
    failed: int
    """Forwarded and answered with an error (the daemon refused it: mode, job state, arguments)."""
    pending: int


@dataclass
class _RefusalLog:
    """One log line per refusal, at most ``limit`` per ``window_s``; the suppressed ones are counted."""

    logger: logging.Logger
    limit: int
    window_s: float
    clock: Callable[[], float]
    _start: float = field(default=-1e300)
    _lines: int = 0
    _suppressed: int = 0

    def line(self, message: str) -> None:
        now = self.clock()
        if now - self._start >= self.window_s:
            self._start, self._lines = now, 0
        if self._lines >= self.limit:
            self._suppressed += 1
            return
        if self._suppressed:
            message += f" ({self._suppressed} earlier refusal(s) not logged)"
            self._suppressed = 0
        self._lines += 1
        self.logger.warning("%s", message)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


# -------------------------------------------------------------------------------------------------- listener
class CommandListener:
    """Receives commands from the broker, validates them, runs them through ``dispatch`` one at a time, and
    publishes each result. Start :meth:`run` as a task of the daemon's TaskGroup; cancel it to stop."""

    def __init__(
        self,
        settings: CommandSettings,
        dispatch: Dispatch,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.settings = settings
        self._dispatch = dispatch
        self._wall = wall
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self._log = logger or log
        self._refusals = _RefusalLog(self._log, settings.refusal_log_limit, settings.refusal_log_window_s, clock)
        self._queue: asyncio.Queue[tuple[str, Command]] = asyncio.Queue(settings.max_pending)
        self._results: deque[bytes] = deque(maxlen=settings.max_unsent_results)
        self._results_ready = asyncio.Event()
        self._seen = Deduplicator(10_000)
        self._connected = self._up = False
        self._last_failure: str | None = None
        self._received = self._refused = self._completed = self._failed = 0
        self.filter = f"{settings.base}/+"
        self.result_topic = f"{settings.base}/result"

    def stats(self) -> CommandStats:
        """Counters as of now."""
        return CommandStats(
            self._connected, self._received, self._refused, self._completed, self._failed, self._queue.qsize()
        )

    # ------------------------------------------------------------------------------------------ the loops
    async def run(self) -> None:
        """Listen until cancelled; broker, network, TLS and credential trouble is logged and retried with backoff."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._worker())
            await self._connect_forever()

    async def _connect_forever(self) -> None:
        s = self.settings
        failures = 0
        while True:
            honour_cancel()
            self._up = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever the network or the broker does, the listener goes on
                text = self._describe(_leaf(exc))
                if text != self._last_failure:  # the same failure again is not logged again
                    self._log.warning("MQTT commands: %s; retrying with backoff", text)
                    self._last_failure = text
            failures = 1 if self._up else failures + 1
            honour_cancel()
            await asyncio.sleep(backoff_delay(failures, s.backoff_initial_s, s.backoff_max_s, self._rng))

    async def _session(self) -> None:
        """One connection: subscribe, then serve messages and publish results until the connection ends."""
        s = self.settings
        client = aiomqtt.Client(
            **client_arguments(s, s.broker, s.identifier, s.connect_timeout_s, tls_what="TLS files"),
            # MQTT 5: a clean start with no session expiry, so commands sent while we were away are not run later.
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=True,
            # Few, small messages that someone waits for: no Nagle delay on results.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )
        # retainAsPublished: a live delivery of a retained publish keeps its flag, so every retained command is
        # refused (3.1.1 clears the flag on live deliveries). noLocal: our own results do not come back.
        options = SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True)
        async with client:
            await client.subscribe(self.filter, options=options, timeout=s.connect_timeout_s)
            honour_cancel()
            self._connected = self._up = True
            self._last_failure = None
            self._log.info(
                "MQTT commands: listening on %s as %s (results on %s)", self.filter, s.identifier, self.result_topic
            )
            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(self._publish_results(client))
                    async for message in client.messages:
                        self._receive(message)
                    raise aiomqtt.MqttError("the broker closed the connection")
            finally:
                self._connected = False

    async def _publish_results(self, client: aiomqtt.Client) -> None:
        timeout = self.settings.publish_timeout_s
        while True:
            self._results_ready.clear()
            while self._results:
                await client.publish(self.result_topic, self._results[0], qos=1, timeout=timeout)
                self._results.popleft()  # only now: the broker has it
                honour_cancel()
            await self._results_ready.wait()

    async def _worker(self) -> None:
        """Run accepted commands one at a time, outside the connection: a broker that goes away does not cancel
        a migration halfway; its result is published once the broker is back."""
        while True:
            topic, command = await self._queue.get()
            try:
                answer = await self._dispatch(command.control_line())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # dispatch never raises by contract; a bug must still not end the listener
                self._log.exception("MQTT command %s on %s: the dispatcher failed", command.id, topic)
                answer = {"ok": False, "error": f"internal error: {exc!r}", "type": "InternalError"}
            honour_cancel()
            if answer.get("ok"):
                self._completed += 1
                self._log.info("MQTT command %s %s on %s: done", command.id, command.verb, topic)
            else:
                self._failed += 1
                self._refusals.line(
                    f"MQTT command {command.id} {command.verb} on {topic} refused by the daemon: "
                    f"{answer.get('error')} ({answer.get('type')})"
                )
            self._post(command.id, command.verb, answer)

    # ------------------------------------------------------------------------------------------ messages
    def _receive(self, message: aiomqtt.Message) -> None:
        topic = message.topic.value
        if topic == self.result_topic:
            return  # our own results come back on the filter: not commands
        self._received += 1
        verb = topic[len(self.settings.base) + 1 :] if topic.startswith(self.settings.base + "/") else ""
        shown = _show(topic, 160)
        raw = message.payload
        payload = bytes(raw) if isinstance(raw, bytes | bytearray) else str(raw or "").encode()
        if not payload:  # no command: how a retained message is cleared (the broker passes the clearing on)
            self._log.debug("MQTT commands: ignored an empty message on %s", shown)
            return
        try:
            command = parse_command(verb, payload)
        except CommandRefusedError as exc:
            self._refuse(shown, exc.command_id, verb, str(exc), "CommandRefused")
            return
        if message.retain:
            self._refuse(
                shown,
                command.id,
                verb,
                "retained commands are refused (they would run again at every reconnect); clear it by publishing "
                "an empty retained message on this topic",
                "CommandRefused",
            )
            return
        if not self._seen.first_time(command.id):
            self._refuse(
                shown, command.id, verb, f"id {command.id} was already received; not run again", "DuplicateCommand"
            )
            return
        try:
            self._queue.put_nowait((shown, command))
        except asyncio.QueueFull:
            self._refuse(
                shown, command.id, verb, f"{self.settings.max_pending} commands are already waiting; try later", "Busy"
            )
            return
        self._log.info("MQTT command %s %s on %s: accepted %s", command.id, verb, shown, dict(command.args))

    def _refuse(self, shown_topic: str, command_id: str | None, verb: str, why: str, kind: str) -> None:
        self._refused += 1
        who = f"MQTT command {command_id}" if command_id else "MQTT command"
        self._refusals.line(f"{who} on {shown_topic} refused: {why}")
        self._post(command_id, verb, {"ok": False, "error": why, "type": kind})

    def _post(self, command_id: str | None, verb: str | None, answer: Mapping[str, Any]) -> None:
        doc = result_document(self.settings.node, command_id, verb, answer, self._wall())
        self._results.append(json.dumps(doc, separators=(",", ":"), default=str).encode())
        self._results_ready.set()

    # ------------------------------------------------------------------------------------------ helpers
    def _describe(self, exc: BaseException) -> str:
        s = self.settings
        text = str(exc) or type(exc).__name__
        if isinstance(exc, aiomqtt.MqttCodeError) and getattr(exc.rc, "value", exc.rc) in {4, 5, 134, 135}:
            return (
                f"broker {s.broker} refused the login of user {s.username!r} ({text}): check mqtt.username and "
                "mqtt.password_file"
            )
        if isinstance(exc, ConfigError):
            return f"cannot connect to {s.broker}: {text}"
        return f"broker {s.broker}: {text}"


def command_listener(
    config: Config,
    node: str,
    dispatch: Dispatch,
    *,
    trusted_uids: Collection[int] | None = None,
    logger: logging.Logger | None = None,
) -> CommandListener | None:
    """The daemon's listener, or None unless ``[mqtt] enabled`` and ``commands_enabled`` are both true.

    Raises ConfigError when commands are enabled without credentials, or with a password in clear off-machine.
    """
    if not (config.mqtt.enabled and config.mqtt.commands_enabled):
        return None
    settings = CommandSettings.from_config(config, node, trusted_uids)
    return CommandListener(settings, dispatch, logger=logger)
