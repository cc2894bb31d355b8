"""Property tests of the control API against a live server: whatever a client sends (random bytes, JSON of any
shape, hostile arguments, oversized lines, unknown operations), it gets one clear error answer, the server keeps
serving, and nothing on the node changes.

One live actuator for the module (mode ``act``, a simulated H200, job ``counter`` running on a 1g.18gb): a request
that got through validation could really migrate or stop that job, which the ground truth would show.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flexmig.act.control import MAX_REQUEST_BYTES
from flexmig.mig import H200
from support.actuator import LiveNode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
OPS = ["jobs.submit", "jobs.list", "jobs.migrate", "jobs.resplit", "jobs.stop"]
ACTING = {"jobs.migrate": {"name", "to"}, "jobs.resplit": {"name", "ranks", "profile"}, "jobs.stop": {"name", "force"}}
#: Error types a validation refusal may carry; InternalError (an exception the validation did not expect) is a bug.
H200_PROFILES = {p.name for p in H200.profiles}
CLEAR = {"RequestError", "PlanRejectedError", "JobSpecError", "ConfigError"}


@pytest.fixture(scope="module")
def live() -> Iterator[LiveNode]:
    with LiveNode("h200") as node:
        node.before = node.truth()  # type: ignore[attr-defined]
        yield node


def exchange(node: LiveNode, payload: bytes, expect: int = 1) -> list[dict[str, Any]]:
    """Send ``payload`` on a fresh connection; read up to ``expect`` answers (fewer if the server hangs up)."""
    answers: list[dict[str, Any]] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(node.socket))
        # On an oversized line it answers and hangs up mid-send: its answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(payload)
        buf = b""
        while len(answers) < expect:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                answers.append(json.loads(line))
    return answers


def assert_unchanged_and_serving(node: LiveNode) -> None:
    assert node.truth() == node.before, "a refused request changed the node"  # type: ignore[attr-defined]
    (answer,) = exchange(node, b'{"op": "jobs.list"}\n')
    assert answer["ok"] and [j["name"] for j in answer["result"]] == ["counter"]


def assert_clear_refusal(answer: dict[str, Any]) -> None:
    assert answer["ok"] is False, answer
    assert isinstance(answer["error"], str) and answer["error"], answer
    assert answer["type"] in CLEAR, answer


def may_act(request: object) -> bool:
    """An over-approximation of the requests that could really act on the running job (excluded: those are
    operators' requests, tested in test_act_executor)."""
    if not isinstance(request, dict) or set(request) - {"op", "args"}:
        return False
    op, args = request.get("op"), request.get("args", {})
    if op not in ACTING or not isinstance(args, dict):
        return False
    return args.get("name") == "counter" and set(args) <= ACTING[op]


# ------------------------------------------------------------------------------------------------ raw input
@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes_get_an_error_answer_and_change_nothing(live: LiveNode, data: bytes) -> None:
    line = data.replace(b"\n", b" ") + b"\n"
    (answer,) = exchange(live, line)
    assert_clear_refusal(answer)
    assert answer["type"] == "RequestError"
    assert_unchanged_and_serving(live)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(json_values)
def test_json_of_any_shape_gets_an_error_answer_and_changes_nothing(live: LiveNode, request: Any) -> None:
    assume(not may_act(request))
    (answer,) = exchange(live, json.dumps(request).encode() + b"\n")
    if request in ({"op": "jobs.list"}, {"op": "jobs.list", "args": {}}):
        assert answer["ok"]
    else:
        assert_clear_refusal(answer)
    assert_unchanged_and_serving(live)


# ------------------------------------------------------------------------------------------ hostile arguments
hostile_strings = st.one_of(
    st.sampled_from(
        [
            "counter; rm -rf /",
            "$(reboot)",
            "`id`",
            "counter\n",
            "counter\x00",
            "../../etc/passwd",
            "/etc/shadow",
            "/proc/self/environ",
            "/dev/zero",
            "/",
            "",
            " ",
            "counter ",
            "Counter",
            "7g.141gb",
            "1g.18gb; reboot",
            "x" * 5000,
            "ｃｏｕｎｔｅｒ",
            "\u202ecounter",
            "%s%s%s%n",
            "{name}",
        ]
    ),
    st.text(max_size=40),
)
hostile_values = st.one_of(
    hostile_strings,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.lists(hostile_strings, max_size=3),
    st.dictionaries(hostile_strings, hostile_strings, max_size=2),
)
arg_names = st.sampled_from(["name", "to", "ranks", "profile", "force", "path", "argv", "cmd", "user", "__class__"])
requests = st.fixed_dictionaries(
    {"op": st.one_of(st.sampled_from(OPS), hostile_strings)},
    optional={"args": st.dictionaries(arg_names, hostile_values, max_size=4)},
)


@FUZZ
@given(requests)
def test_hostile_arguments_get_a_clear_error_answer_and_change_nothing(live: LiveNode, request: Any) -> None:
    assume(not may_act(request))
    assume(request.get("op") != "jobs.list" or not request.get("args"))  # jobs.list with no args is a plain list
    (answer,) = exchange(live, json.dumps(request).encode() + b"\n")
    if request.get("op") == "jobs.list":
        assert answer["ok"]
    else:
        assert_clear_refusal(answer)
    assert_unchanged_and_serving(live)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(list(ACTING)),
    st.sampled_from(["to", "ranks", "profile", "force"]),
    hostile_values,
)
def test_the_running_job_with_a_bad_argument_is_refused_and_keeps_running(
    live: LiveNode, op: str, key: str, value: Any
) -> None:
    """The running job's own name with one bad argument: validation refuses before any plan is made."""
    args = {"name": "counter", key: value}
    valid = {
        ("jobs.migrate", "to"): isinstance(value, str) and value in H200_PROFILES,
        ("jobs.resplit", "ranks"): isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2,
        ("jobs.resplit", "profile"): False,  # without ranks a resplit is refused whatever the profile
        ("jobs.stop", "force"): isinstance(value, bool),
    }
    assume(not valid.get((op, key), False))
    (answer,) = exchange(live, json.dumps({"op": op, "args": args}).encode() + b"\n")
    assert_clear_refusal(answer)
    assert answer["type"] == "RequestError", answer
    assert_unchanged_and_serving(live)


# ------------------------------------------------------------------------------------------ size limit
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=MAX_REQUEST_BYTES + 1, max_value=4 * MAX_REQUEST_BYTES), st.booleans())
def test_an_oversized_line_is_refused_and_the_connection_closed(live: LiveNode, size: int, newline: bool) -> None:
    payload = b'{"op": "jobs.list", "args": {"x": "' + b"a" * size + b'"}}' + (b"\n" if newline else b"")
    answers = exchange(live, payload + b'{"op": "jobs.list"}\n', expect=2)
    assert answers == [{"ok": False, "error": f"request longer than {MAX_REQUEST_BYTES} bytes", "type": "RequestError"}]
    assert_unchanged_and_serving(live)


def test_many_requests_on_one_connection_each_get_their_own_answer(live: LiveNode) -> None:
    lines = [b"{}\n", b"[]\n", b'{"op": "jobs.stop", "args": {"name": "nosuch"}}\n', b'{"op": "jobs.list"}\n']
    answers = exchange(live, b"".join(lines), expect=4)
    assert [a["ok"] for a in answers] == [False, False, False, True]
    assert "no job named 'nosuch'" in answers[2]["error"]
    assert_unchanged_and_serving(live)
