"""Property test of reading an event back (from the outbox on disk, or from the broker): whatever the bytes, the
answer is an Event or a ValueError saying what is wrong, never a RecursionError or an int() past 4,300 digits."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mqtt.events import Event

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
docs = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner))
hostile = st.sampled_from(
    [b"[" * 50_000 + b"]" * 50_000, b'{"schema_version": ' + b"9" * 5000 + b"}", b"NaN", b'{"payload": 1e999}']
)


@settings(max_examples=300, deadline=None)
@given(data=hostile | st.binary(max_size=300) | docs.map(lambda d: json.dumps(d, allow_nan=True).encode()))
def test_no_bytes_make_reading_an_event_raise_anything_but_value_error(data: bytes) -> None:
    try:
        Event.from_json(data)
    except ValueError as exc:
        assert str(exc), "the error says what is wrong"
