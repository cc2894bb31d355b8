"""MQTT commands without a broker: the strict payload checks, the published schemas, the result envelope, and the
settings that refuse to listen anonymously or send a password in clear."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from flexmig.config import Config, HostPort, MqttConfig, parse_config
from flexmig.errors import ConfigError
from flexmig.mqtt.command_schema import (
    MAX_COMMAND_BYTES,
    VERBS,
    CommandRefusedError,
    parse_command,
    result_document,
    schema_documents,
)
from flexmig.mqtt.commands import CommandSettings, command_listener

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
COMMAND_SCHEMA = json.loads((SCHEMAS / "command.v1.schema.json").read_text())
RESULT_SCHEMA = json.loads((SCHEMAS / "command-result.v1.schema.json").read_text())


def verb_validator(verb: str) -> jsonschema.Draft202012Validator:
    schema = {**COMMAND_SCHEMA, "$ref": f"#/$defs/{verb}"}
    return jsonschema.Draft202012Validator(schema)


RESULTS = jsonschema.Draft202012Validator(RESULT_SCHEMA, format_checker=jsonschema.FormatChecker())


async def no_dispatch(line: bytes) -> dict[str, Any]:
    raise AssertionError("nothing is dispatched in these tests")


# ------------------------------------------------------------------------------------------------ schemas
def test_the_published_schemas_are_the_ones_the_code_enforces() -> None:
    for name, doc in schema_documents().items():
        jsonschema.Draft202012Validator.check_schema(doc)
        on_disk = json.loads((SCHEMAS / name).read_text())
        assert on_disk == doc, (
            f"schemas/{name} is stale; regenerate with: python -c 'import json; from flexmig.mqtt.command_schema "
            f'import schema_documents as d; [open(f"schemas/{{n}}", "w").write(json.dumps(s, indent=2) + '
            f'"\\n") for n, s in d().items()]\''
        )


@pytest.mark.parametrize("verb", list(VERBS))
def test_each_verbs_example_is_valid_and_forwarded_to_its_control_operation(verb: str) -> None:
    example = VERBS[verb].example
    verb_validator(verb).validate(example)
    command = parse_command(verb, json.dumps(example).encode())
    assert command.id == example["id"]
    assert json.loads(command.control_line()) == {"op": VERBS[verb].op, "args": example.get("args", {})}


def test_the_verbs_are_exactly_migrate_resplit_stop_and_plan_now() -> None:
    assert {v: s.op for v, s in VERBS.items()} == {
        "migrate": "jobs.migrate",
        "resplit": "jobs.resplit",
        "stop": "jobs.stop",
        "plan-now": "plan",
    }, "jobs.submit takes a path: it is not reachable from the network"


def test_an_integral_number_of_ranks_is_an_integer_as_json_schema_says() -> None:
    command = parse_command("resplit", b'{"id": "a", "args": {"name": "j", "ranks": 2.0}}')
    assert command.args["ranks"] == 2 and isinstance(command.args["ranks"], int)


# ------------------------------------------------------------------------------------------------ refusals
REFUSALS = [
    ("migrate", b"x" * (MAX_COMMAND_BYTES + 1), "larger than 4096"),
    ("migrate", b"", "empty payload"),
    ("migrate", b"\xff\xfe", "not UTF-8"),
    ("migrate", b"migrate train", "not JSON"),
    ("migrate", b"[" * 3000, "nested too deeply"),
    ("migrate", b'{"id": NaN}', "NaN is not JSON"),
    ("migrate", b'{"id": "a", "id": "b", "args": {"name": "j"}}', "the key 'id' twice"),
    ("migrate", b'{"id": "a", "args": {"name": "j", "name": "k"}}', "the key 'name' twice"),
    ("migrate", b'["id", "a"]', "must be a JSON object"),
    ("migrate", b'{"id": "a", "args": {"name": "j"}, "cmd": "reboot"}', "unknown field(s) 'cmd'"),
    ("migrate", b'{"args": {"name": "j"}}', "id is required"),
    ("migrate", b'{"id": "a;reboot", "args": {"name": "j"}}', "id: 'a;reboot' does not match"),
    ("migrate", b'{"id": "x", "args": {"name": "j"}, "verb": "stop"}', "unknown field(s) 'verb'"),
    ("reboot", b'{"id": "a"}', "unknown verb 'reboot'; known: migrate, resplit, stop, plan-now"),
    ("result", b'{"id": "a"}', "unknown verb 'result'"),
    ("submit", b'{"id": "a", "args": {"path": "/etc/flexmig/jobs/x.toml"}}', "unknown verb 'submit'"),
    ("migrate", b'{"id": "a"}', "args is required for migrate (name)"),
    ("migrate", b'{"id": "a", "args": ["j"]}', "args must be a JSON object"),
    ("migrate", b'{"id": "a", "args": {"name": "j", "argv": ["/bin/sh"]}}', "unknown argument(s) 'argv'"),
    ("migrate", b'{"id": "a", "args": {"name": "j", "path": "/tmp/x"}}', "unknown argument(s) 'path'"),
    ("migrate", b'{"id": "a", "args": {"name": "j; rm -rf /"}}', "args.name: 'j; rm -rf /' does not match"),
    ("migrate", b'{"id": "a", "args": {"name": "../../etc"}}', "args.name: '../../etc' does not match"),
    ("migrate", b'{"id": "a", "args": {"name": "j\\n"}}', "args.name: 'j\\n' does not match"),
    ("migrate", b'{"id": "a", "args": {"name": 7}}', "args.name: must be a string, not 7"),
    ("migrate", b'{"id": "a", "args": {"name": "j", "to": "9g.1tb"}}', "args.to: '9g.1tb' is not one of"),
    ("resplit", b'{"id": "a", "args": {"name": "j"}}', "args.ranks is required for resplit"),
    ("resplit", b'{"id": "a", "args": {"name": "j", "ranks": 0}}', "args.ranks: 0 is outside 1..64"),
    ("resplit", b'{"id": "a", "args": {"name": "j", "ranks": 1e300}}', "is outside 1..64"),
    ("resplit", b'{"id": "a", "args": {"name": "j", "ranks": true}}', "args.ranks: must be an integer, not True"),
    ("resplit", b'{"id": "a", "args": {"name": "j", "ranks": "2"}}', "args.ranks: must be an integer, not '2'"),
    ("resplit", b'{"id": "a", "args": {"name": "j", "ranks": 2.5}}', "must be an integer, not 2.5"),
    ("stop", b'{"id": "a", "args": {"name": "j", "force": "yes"}}', "args.force: must be true or false"),
    ("plan-now", b'{"id": "a", "args": {"gpu": 0}}', "unknown argument(s) 'gpu' for plan-now (known: none)"),
]


@pytest.mark.parametrize(("verb", "payload", "why"), REFUSALS)
def test_a_bad_command_is_refused_naming_the_field_and_the_rule(verb: str, payload: bytes, why: str) -> None:
    with pytest.raises(CommandRefusedError) as info:
        parse_command(verb, payload)
    assert why in str(info.value)
    # Rules on the bytes (size, encoding, duplicate keys) are stated in the schema's description; the rest in it.
    if verb in VERBS and not payload.startswith((b"[", b"x", b"\xff")) and payload and "twice" not in why:
        try:
            doc = json.loads(payload)
        except ValueError:
            return
        assert not verb_validator(verb).is_valid(doc), "the published schema refuses it too"


def test_a_refusal_carries_the_commands_id_when_it_had_a_valid_one() -> None:
    with pytest.raises(CommandRefusedError) as info:
        parse_command("migrate", b'{"id": "op-7", "args": {"name": "j", "to": "bogus"}}')
    assert info.value.command_id == "op-7"
    with pytest.raises(CommandRefusedError) as info:
        parse_command("migrate", b'{"id": "op 7", "args": {"name": "j"}}')
    assert info.value.command_id is None


# ------------------------------------------------------------------------------------------------ results
@pytest.mark.parametrize(
    "answer",
    [
        {"ok": True, "result": {"plan_id": 3, "ok": True, "actions": []}},
        {"ok": False, "error": "mode is 'observe': ...", "type": "PlanRejectedError"},
        {"ok": False, "error": "no job named 'x'", "type": "RequestError"},
        {"ok": False, "error": "weird", "type": "not a type name!"},
    ],
)
def test_results_follow_the_published_result_schema(answer: dict[str, Any]) -> None:
    for command_id, verb in (("op-1", "migrate"), (None, None), ("op-2", "reboot")):
        doc = result_document("node-1", command_id, verb, answer, 1_700_000_000.0)
        RESULTS.validate(doc)
        assert doc["id"] == command_id and doc["ok"] is answer["ok"]
        assert doc["verb"] == (verb if verb in VERBS else None), "an unknown verb is not echoed"
    if not answer["ok"]:
        shown = result_document("n", None, None, answer, 0.0)["type"]
        assert shown == (answer["type"] if answer["type"].isidentifier() else "Error"), "types are names, not text"


# ------------------------------------------------------------------------------------------------ settings
def settings(**kw: Any) -> CommandSettings:
    base: dict[str, Any] = {
        "node": "node-1",
        "broker": HostPort("127.0.0.1", 1883),
        "username": "node-1",
        "password_file": Path("/etc/flexmig/mqtt.password"),
    }
    return CommandSettings(**{**base, **kw})


def test_commands_refuse_an_anonymous_connection() -> None:
    with pytest.raises(ConfigError, match="commands need broker credentials"):
        settings(username=None, password_file=None)
    with pytest.raises(ConfigError, match="commands need broker credentials"):
        settings(password_file=None)
    with pytest.raises(ConfigError, match="commands need broker credentials"):
        settings(username=None)


def test_commands_refuse_a_password_in_clear_to_another_machine_unless_told() -> None:
    remote = HostPort("mqtt.lan", 1883)
    with pytest.raises(ConfigError, match=r"would cross the network in clear to mqtt\.lan:1883; set mqtt\.tls = true"):
        settings(broker=remote)
    assert settings(broker=remote, tls=True).tls
    assert settings(broker=remote, allow_plaintext_password=True).allow_plaintext_password
    assert settings(broker=HostPort("::1", 1883)).broker.is_loopback()


def test_topics_and_client_id_are_the_nodes_own() -> None:
    s = settings(topic_prefix="site/a")
    assert s.base == "site/a/node-1/commands" and s.identifier == "flexmig-node-1-commands"
    with pytest.raises(ConfigError, match="topic prefix"):
        settings(topic_prefix="site/+")
    with pytest.raises(ConfigError, match="node name"):
        settings(node="a/b")


def test_commands_are_off_unless_mqtt_and_commands_are_both_enabled(tmp_path: Path) -> None:
    assert command_listener(Config.default(), "node-1", no_dispatch) is None
    on = parse_config(
        '[mqtt]\nenabled = true\nusername = "u"\npassword_file = "/etc/flexmig/mqtt.password"\n', "flexmig.toml"
    )
    assert command_listener(on, "node-1", no_dispatch) is None, "publishing alone does not listen"
    both = dataclasses.replace(on, mqtt=dataclasses.replace(on.mqtt, commands_enabled=True))
    listener = command_listener(both, "node-1", no_dispatch)
    assert listener is not None
    assert listener.filter == "flexmig/v1/node-1/commands/+"
    assert listener.result_topic == "flexmig/v1/node-1/commands/result"
    off_mqtt = dataclasses.replace(both, mqtt=dataclasses.replace(both.mqtt, enabled=False))
    assert command_listener(off_mqtt, "node-1", no_dispatch) is None


def test_a_configuration_with_commands_but_no_credentials_is_refused_at_load_and_by_the_listener() -> None:
    with pytest.raises(ConfigError, match="commands need broker credentials"):
        parse_config("[mqtt]\nenabled = true\ncommands_enabled = true\n", "flexmig.toml")
    # A Config built in code skips the file checks: the listener checks again.
    cfg = Config(mqtt=MqttConfig(enabled=True, commands_enabled=True))
    with pytest.raises(ConfigError, match="commands need broker credentials"):
        command_listener(cfg, "node-1", no_dispatch)
    remote = Config(
        mqtt=MqttConfig(
            enabled=True,
            commands_enabled=True,
            broker=HostPort("10.0.0.5", 1883),
            username="u",
            password_file=Path("/etc/flexmig/p"),
        )
    )
    with pytest.raises(ConfigError, match="in clear"):
        command_listener(remote, "node-1", no_dispatch)


def test_settings_never_show_the_password() -> None:
    s = settings()
    assert "password_file" in repr(s) and s.password_file is not None
    assert not hasattr(s, "password")
