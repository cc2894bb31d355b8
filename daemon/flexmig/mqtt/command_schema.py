"""MQTT command payloads: the verbs, their arguments, the published JSON Schemas, and the checks (pure, no I/O).

A command is one JSON object, ``{"id": "...", "args": {...}}``, published on ``<prefix>/<node>/commands/<verb>``;
the verb is the topic's last level (``migrate``, ``resplit``, ``stop``, ``plan-now``). The verbs are the rows of
:data:`flexmig.act.operation_table.OPERATIONS` that name one, with the arguments those rows offer to MQTT and their
stricter checks (:data:`VERBS`). Every payload is checked against a strict schema before anything else sees it
(``schemas/command.v1.schema.json`` is generated from :data:`VERBS`, see :func:`schema_documents`): at most
:data:`MAX_COMMAND_BYTES`, UTF-8 JSON without duplicate keys or NaN, known fields only, job names and profile names
from fixed alphabets; there is no free-form text, no argv and no path in any command. A valid :class:`Command`
becomes a control request line (:meth:`Command.control_line`); :func:`result_document` is the envelope of every
answer. The listener that receives them is :mod:`flexmig.mqtt.commands`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from flexmig.act.operation_table import ID_PATTERN, OPERATIONS, Arg
from flexmig.errors import CommandRefusedError
from flexmig.mqtt.events import NODE_NAME, format_time

__all__ = [
    "COMMAND_SCHEMA_VERSION",
    "MAX_COMMAND_BYTES",
    "VERBS",
    "Command",
    "CommandRefusedError",
    "VerbSpec",
    "parse_command",
    "printable",
    "result_document",
    "schema_documents",
]

COMMAND_SCHEMA_VERSION = 1
MAX_COMMAND_BYTES = 4096
"""The largest payload accepted; a command needs a few hundred bytes at most."""


# ------------------------------------------------------------------------------------------------- the schema
@dataclass(frozen=True, slots=True)
class VerbSpec:
    """A command verb: the control operation it is forwarded to, and its arguments (a row of the operation table,
    as MQTT sees it)."""

    name: str
    op: str
    doc: str
    args: Mapping[str, Arg]
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


VERBS: Mapping[str, VerbSpec] = MappingProxyType(
    {
        op.verb: VerbSpec(op.verb, op.name, op.doc, op.mqtt_args(), op.example)
        for op in OPERATIONS.values()
        if op.verb is not None
    }
)
"""The command verbs: the topic level, the control operation, the arguments. Nothing else is accepted."""

_ENVELOPE = frozenset({"id", "args"})


def schema_documents() -> dict[str, dict[str, Any]]:
    """The JSON Schemas published in ``schemas/`` (file name -> document), generated from :data:`VERBS`.

    ``command.v1.schema.json``: the payload on ``commands/<verb>`` must validate against ``#/$defs/<verb>``
    (the top level states the envelope every verb shares). ``command-result.v1.schema.json``: results.
    """
    return {"command.v1.schema.json": _command_schema(), "command-result.v1.schema.json": _result_schema()}


def _command_schema() -> dict[str, Any]:
    """The command envelope, with one ``$defs`` entry per verb."""
    verbs = ", ".join(VERBS)
    return {
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
                "pattern": ID_PATTERN,
            },
            **{name: verb.schema() for name, verb in VERBS.items()},
        },
    }


def _result_schema() -> dict[str, Any]:
    """A command's result: ``result`` when ok, ``error`` and ``type`` when not."""
    return {
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
                "anyOf": [{"type": "string", "pattern": ID_PATTERN}, {"type": "null"}],
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


# --------------------------------------------------------------------------------------------------- parsing
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

    def control_line(self, deadline_s: float | None = None) -> bytes:
        """The control request line the dispatcher runs (same format as the control socket), with ``deadline_s``
        (how long it may still wait to begin: :mod:`flexmig.act.deadline`) when given."""
        request: dict[str, Any] = {"op": self.op, "args": dict(self.args)}
        if deadline_s is not None:
            request["deadline_s"] = deadline_s
        return json.dumps(request, separators=(",", ":")).encode() + b"\n"


def printable(value: object, limit: int = 60) -> str:
    """A short, printable rendering of an untrusted value (repr escapes control characters)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _DuplicateKeyError(ValueError):
    """Two equal keys in one object: parsers disagree on which wins, so neither does."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(f"payload has the key {printable(key)} twice")
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
        if isinstance(value, str) and re.search(ID_PATTERN, value):
            return value
    return None


def _check_arg(key: str, spec: Arg, value: Any) -> Any:
    where = f"args.{key}"
    if spec.choices is not None:
        if not isinstance(value, str) or value not in spec.choices:
            raise ValueError(f"{where}: {printable(value)} is not one of {', '.join(spec.choices)}")
        return value
    if spec.kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"{where}: must be true or false, not {printable(value)}")
        return value
    if spec.kind == "integer":
        # JSON Schema's integer is a number without a fractional part (2.0 counts); true/false do not.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: must be an integer, not {printable(value)}")
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            raise ValueError(f"{where}: {printable(value)} is outside {spec.minimum}..{spec.maximum}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}: must be a string, not {printable(value)}")
    if spec.pattern is not None and not re.search(spec.pattern, value):
        raise ValueError(f"{where}: {printable(value)} does not match {spec.pattern}")
    return value


def parse_command(verb: str, payload: bytes) -> Command:
    """Validate one command (``verb`` from the topic, ``payload`` as received) against :data:`VERBS`.

    Pure. Raises :class:`CommandRefusedError` naming the field and the rule; never anything else for any input.
    """
    doc = _loads(payload)
    command_id = _id_of(doc)
    spec = VERBS.get(verb)
    if spec is None:
        raise CommandRefusedError(f"unknown verb {printable(verb)}; known: {', '.join(VERBS)}", command_id)
    if not isinstance(doc, dict):
        raise CommandRefusedError("payload must be a JSON object", command_id)
    unknown = sorted(set(doc) - _ENVELOPE)
    if unknown:
        names = ", ".join(printable(k, 30) for k in unknown[:5])
        raise CommandRefusedError(f"unknown field(s) {names}; a command has only id and args", command_id)
    if "id" not in doc:
        raise CommandRefusedError("id is required")
    if command_id is None:
        raise CommandRefusedError(f"id: {printable(doc['id'])} does not match {ID_PATTERN}")
    raw_args = doc.get("args", None)
    required = [k for k, a in spec.args.items() if a.required]
    if raw_args is None and "args" not in doc:
        if required:
            raise CommandRefusedError(f"args is required for {verb} ({', '.join(required)})", command_id)
        raw_args = {}
    if not isinstance(raw_args, dict):
        raise CommandRefusedError(f"args must be a JSON object, not {printable(raw_args)}", command_id)
    extra = sorted(set(raw_args) - set(spec.args))
    if extra:
        known = ", ".join(spec.args) or "none"
        names = ", ".join(printable(k, 30) for k in extra[:5])
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
