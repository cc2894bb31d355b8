"""Property tests of MQTT command payloads: the code and the published schema agree on every document, and
whatever arrives on a commands topic through a real mosquitto gets one clear refusal, runs nothing, and leaves
the listener alive.

One broker, one live actuator (mode ``act``, job ``counter`` running) and one listener for the module; each example
publishes one message and waits for its result, so results pair with messages by order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flexmig.mqtt.command_schema import MAX_COMMAND_BYTES, VERBS, CommandRefusedError, parse_command
from support.actuator import LiveNode
from support.commands import Operator, RunningListener, password_file
from support.mosquitto import Mosquitto, needs_mosquitto

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "command.v1.schema.json").read_text())
VALIDATORS = {verb: jsonschema.Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{verb}"}) for verb in VERBS}
PROFILES = VERBS["migrate"].args["to"].choices or ()

# ------------------------------------------------------------------------------------------------ strategies
ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}", fullmatch=True),
    st.sampled_from(["", " ", "a b", "a\n", "-lead", "x" * 65, "id;reboot", "é"]),
    st.integers(),
    st.none(),
)
names = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", fullmatch=True),
    st.sampled_from(["", "counter", "counter\n", "a/b", "../etc", "$(id)", "a;b", "x" * 65, "ｃounter"]),
    st.text(max_size=12),
)
numbers = st.one_of(
    st.integers(min_value=-5, max_value=70),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1.0, 2.0, 64.0, 65.0, 0.5]),
)
anything = st.recursive(
    st.none() | st.booleans() | numbers | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
arg_values = {
    "name": st.one_of(names, anything),
    "to": st.one_of(st.sampled_from(PROFILES), st.sampled_from(["9g.1tb", "1g.18GB", ""]), anything),
    "profile": st.one_of(st.sampled_from(PROFILES), anything),
    "ranks": st.one_of(numbers, st.booleans(), anything),
    "force": st.one_of(st.booleans(), anything),
    "in_place": st.one_of(st.booleans(), anything),
}


@st.composite
def near_valid(draw: st.DrawFn, verb: str) -> dict[str, Any]:
    """A document close to a valid ``verb`` command: each field present or not, valid or not, extras sometimes."""
    doc: dict[str, Any] = {}
    if draw(st.booleans()) or draw(st.booleans()):
        doc["id"] = draw(ids)
    if draw(st.integers(0, 4)) > 0:
        args: dict[str, Any] = {}
        for key, spec in VERBS[verb].args.items():
            if draw(st.integers(0, 3)) > (0 if spec.required else 1):
                args[key] = draw(arg_values[key])
        if draw(st.integers(0, 5)) == 0:
            args[draw(st.sampled_from(["argv", "path", "cmd", "name2", "gpu"]))] = draw(anything)
        doc["args"] = args if draw(st.integers(0, 6)) else draw(anything)
    if draw(st.integers(0, 6)) == 0:
        doc[draw(st.sampled_from(["verb", "reply_to", "cmd", "ID"]))] = draw(anything)
    return doc


def finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(finite(v) for v in value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    return True


# ------------------------------------------------------------------------------------------------ the schema
@settings(max_examples=500, deadline=None)
@given(st.sampled_from(list(VERBS)).flatmap(lambda v: st.tuples(st.just(v), near_valid(v))))
def test_the_code_accepts_exactly_what_the_published_schema_accepts(case: tuple[str, dict[str, Any]]) -> None:
    verb, doc = case
    payload = json.dumps(doc).encode()
    assume(len(payload) <= MAX_COMMAND_BYTES and finite(doc))  # size and NaN are rules on the bytes
    by_schema = VALIDATORS[verb].is_valid(doc)
    try:
        parse_command(verb, payload)
    except CommandRefusedError:
        assert not by_schema, f"code refused a document the schema accepts: {doc}"
    else:
        assert by_schema, f"code accepted a document the schema refuses: {doc}"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20), st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_no_topic_level_or_payload_raises_anything_but_a_refusal(verb: str, payload: bytes) -> None:
    try:
        command = parse_command(verb, payload)
    except CommandRefusedError as exc:
        assert str(exc)
    else:
        assert command.verb in VERBS and json.loads(command.control_line())["op"] == VERBS[command.verb].op


# ------------------------------------------------------------------------------------------------ live
LIVE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def rig(
    secured_broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveNode, RunningListener, Operator]]:
    with LiveNode("h200") as node:
        node.before = node.truth()  # type: ignore[attr-defined]
        listener = RunningListener(node, secured_broker, password_file(tmp_path_factory.mktemp("secrets")))
        listener.wait_connected()
        operator = Operator(secured_broker)
        try:
            yield node, listener, operator
        finally:
            operator.close()
            listener.stop()


def could_act(verb: str, payload: bytes) -> bool:
    """Commands that pass validation and name the running job are operators' commands (excluded here)."""
    try:
        command = parse_command(verb, payload)
    except CommandRefusedError:
        return False
    return command.args.get("name") == "counter"


def assert_refused_and_unchanged(rig: tuple[LiveNode, RunningListener, Operator], verb: str, payload: bytes) -> None:
    node, listener, operator = rig
    before = listener.listener.stats()
    result = operator.ask(verb, payload)
    assert result["ok"] is False, result
    assert result["type"] in {"CommandRefused", "RequestError", "DuplicateCommand", "PlanRejectedError"}, result
    assert isinstance(result["error"], str) and result["error"]
    try:
        sent_id = json.loads(payload).get("id")
    except (ValueError, AttributeError):
        sent_id = None
    assert result["id"] in (None, sent_id)
    after = listener.listener.stats()
    assert after.received == before.received + 1 and after.completed == before.completed
    assert listener.alive()
    assert node.truth() == node.before, "a refused command changed the node"  # type: ignore[attr-defined]


topic_levels = st.one_of(
    st.sampled_from([*VERBS, "reboot", "submit", "Migrate", "", "stop ", "plan_now"]),
    st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Cn"), blacklist_characters="/+#\x00"),
        max_size=20,
    ).filter(lambda s: s != "result"),
)


@pytest.mark.integration
@needs_mosquitto
@LIVE
@given(topic_levels, st.binary(min_size=1, max_size=300))
def test_random_bytes_on_any_commands_topic_are_refused(
    rig: tuple[LiveNode, RunningListener, Operator], verb: str, payload: bytes
) -> None:
    assume(not could_act(verb, payload))
    assert_refused_and_unchanged(rig, verb, payload)


@pytest.mark.integration
@needs_mosquitto
@LIVE
@given(topic_levels, anything)
def test_json_of_any_shape_on_any_commands_topic_is_refused(
    rig: tuple[LiveNode, RunningListener, Operator], verb: str, doc: Any
) -> None:
    payload = json.dumps(doc).encode()
    assume(payload and not could_act(verb, payload))
    assert_refused_and_unchanged(rig, verb, payload)


@pytest.mark.integration
@needs_mosquitto
@LIVE
@given(st.sampled_from(list(VERBS)).flatmap(lambda v: st.tuples(st.just(v), near_valid(v))))
def test_hostile_commands_are_refused_and_run_nothing(
    rig: tuple[LiveNode, RunningListener, Operator], case: tuple[str, dict[str, Any]]
) -> None:
    verb, doc = case
    payload = json.dumps(doc).encode()
    assume(not could_act(verb, payload))
    assert_refused_and_unchanged(rig, verb, payload)


@pytest.mark.integration
@needs_mosquitto
def test_an_oversized_payload_is_refused_unread(rig: tuple[LiveNode, RunningListener, Operator]) -> None:
    payload = json.dumps({"id": "big", "args": {"name": "counter", "pad": "x" * 10_000}}).encode()
    node, _, operator = rig
    result = operator.ask("stop", payload)
    assert result["id"] is None and result["error"] == f"payload of {len(payload)} bytes is larger than 4096"
    assert node.truth() == node.before  # type: ignore[attr-defined]
