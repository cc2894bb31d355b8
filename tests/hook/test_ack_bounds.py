"""An acknowledgement is written by the job's user: whatever they put there, reading it raises AckError or gives a
valid Ack, never anything else (a ValueError or RecursionError out of ``read_ack`` killed the daemon's settle task,
and every restart after it). Real files; the fuzzer runs a fixed budget."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexmig_hook.boundedjson import JsonBoundsError, loads
from flexmig_hook.protocol import ACK_MAX_BYTES, ACK_MAX_STEP, Ack, AckError, read_ack

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"step": ' + b"9" * 5000 + b', "checkpoint": "/x"}', "more than 20 digits"),
        (b'{"step": ' + b"9" * 4000 + b', "checkpoint": "/x"}', "more than 20 digits"),
        (b'{"step": ' + str(ACK_MAX_STEP + 1).encode() + b', "checkpoint": "/x"}', "non-negative integer up to"),
        (b"[" * 30_000 + b"]" * 30_000, "nests deeper"),
        (b'{"step": 1, "checkpoint": "/x", "more": ' + b"[" * 50 + b"]" * 50 + b"}", "nests deeper"),
        (b'{"step": NaN, "checkpoint": "/x"}', "NaN"),
        (b'{"step": 1e999, "checkpoint": "/x"}', "out of range"),
        (b'{"step": 1, "checkpoint": "' + b"a" * 5000 + b'"}', "at most 4096"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_an_acknowledgement_out_of_bounds_is_an_ack_error_naming_the_bound(
    tmp_path: Path, content: bytes, why: str
) -> None:
    (tmp_path / "ack.json").write_bytes(content)
    with pytest.raises(AckError, match=why):
        read_ack(tmp_path / "ack.json")


def test_an_acknowledgement_that_is_a_directory_or_a_fifo_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "ack.json").mkdir()
    with pytest.raises(AckError, match="is a directory"):
        read_ack(tmp_path / "ack.json")
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(AckError, match="not a regular file"):
        read_ack(tmp_path / "fifo.json")  # opened O_NONBLOCK: no writer needed, nothing blocks


def test_an_acknowledgement_is_read_relative_to_a_directory_descriptor(tmp_path: Path) -> None:
    (tmp_path / "ack.json").write_text('{"step": 7, "checkpoint": "/ckpt/7"}')
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_ack(Path("ack.json"), dir_fd=fd) == Ack(7, "/ckpt/7")
        assert read_ack(Path("none.json"), dir_fd=fd) is None
    finally:
        os.close(fd)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50)
json_docs = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
)
raw = st.binary(max_size=2000) | st.builds(
    lambda depth, digits: b"[" * depth + b"9" * digits + b"]" * depth,
    st.integers(0, 3000),
    st.integers(1, 6000),
)


@FUZZ
@given(doc=json_docs | st.fixed_dictionaries({"step": json_scalars | json_docs, "checkpoint": json_scalars}))
def test_no_decoded_document_makes_read_ack_raise_anything_but_ack_error(tmp_path: Path, doc: object) -> None:
    path = tmp_path / "ack.json"
    path.write_bytes(json.dumps(doc, allow_nan=True).encode())
    try:
        got = read_ack(path)
    except AckError:
        return
    assert isinstance(got, Ack) and 0 <= got.step <= ACK_MAX_STEP and got.checkpoint


@FUZZ
@given(data=raw)
def test_no_bytes_make_read_ack_raise_anything_but_ack_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "ack.json"
    path.write_bytes(data[: ACK_MAX_BYTES + 10])
    with contextlib.suppress(AckError):
        read_ack(path)


@FUZZ
@given(data=raw, depth=st.integers(1, 40), digits=st.integers(1, 30))
def test_bounded_json_raises_only_its_own_error_and_keeps_its_bounds(data: bytes, depth: int, digits: int) -> None:
    try:
        doc = loads(data, max_bytes=4096, max_depth=depth, max_int_digits=digits)
    except JsonBoundsError:
        return
    stack = [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            assert level <= depth
            stack.extend((c, level + 1) for c in (node.values() if isinstance(node, dict) else node))
        elif isinstance(node, int) and not isinstance(node, bool):
            assert len(str(abs(node))) <= digits
