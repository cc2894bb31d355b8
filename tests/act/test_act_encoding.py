"""How the journal keeps actions: each kind's payload is typed, and its JSON shape is the one journals already hold."""

from __future__ import annotations

from typing import Any

import pytest

from flexmig.act.encoding import (
    CreateInstancePayload,
    DestroyInstancePayload,
    MigratePayload,
    Payload,
    ResplitPayload,
    RestartPayload,
    StartPayload,
    StopPayload,
    decode,
    encode,
    encode_action,
    is_undo,
    payload_of,
    reason_of,
    slots_named,
)
from flexmig.act.journal import ActionRow, JournalError
from flexmig.act.records import Slot
from flexmig.mig import H200
from flexmig.plan.types import CreateInstance, DestroyInstance, Instance, MigrateJob, ResplitJob, StartJob

A, B, C = Slot(0, 0, "3g.71gb"), Slot(0, 4, "2g.35gb"), Slot(1, 6, "1g.18gb", "MIG-x")

PAYLOADS: list[Payload] = [
    CreateInstancePayload(A, "make room"),
    DestroyInstancePayload(B, "free it"),
    DestroyInstancePayload(B, "undo action 3", undo=True),
    StartPayload((A, B), "queued"),
    MigratePayload((A,), (C,), "defragment"),
    ResplitPayload((A,), (B, C), 2, "grow"),
    StopPayload(force=True, reason="operator request"),
    RestartPayload("late acknowledgement"),
]


def row(kind: str, payload: dict[str, Any], action_id: int = 7) -> ActionRow:
    return ActionRow(action_id, 1, 0, kind, "train", payload, "pending", None, None, None)


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_every_payload_decodes_to_what_was_encoded(payload: Payload) -> None:
    kind, job, doc = encode(payload, "train")
    assert (kind, job) == (payload.KIND, "train")
    assert decode(kind, doc) == payload
    assert payload_of(row(kind, doc)) == payload


def i(gpu: int, start: int, profile: str) -> Instance:
    return Instance(gpu, start, H200.profile(profile))


def slot_json(gpu: int, start: int, profile: str) -> dict[str, object]:
    return {"gpu": gpu, "start": start, "profile": profile, "uuid": ""}


def test_plan_actions_are_journalled_in_the_shape_journals_already_hold() -> None:
    a, b = i(0, 0, "3g.71gb"), i(0, 4, "2g.35gb")
    sa, sb = slot_json(0, 0, "3g.71gb"), slot_json(0, 4, "2g.35gb")
    h = H200.profile("2g.35gb")
    assert encode_action(CreateInstance(0, 4, h, "r", 1.0)) == ("create_instance", None, {"slot": sb, "reason": "r"})
    assert encode_action(DestroyInstance(0, 4, h, "r", 1.0)) == ("destroy_instance", None, {"slot": sb, "reason": "r"})
    assert encode_action(StartJob("j", (a,), "r", 1.0)) == ("start", "j", {"to": [sa], "reason": "r"})
    assert encode_action(MigrateJob("j", (a,), (b,), "r", 1.0)) == (
        "migrate",
        "j",
        {"from": [sa], "to": [sb], "reason": "r"},
    )
    assert encode_action(ResplitJob("j", 2, h, (a,), (b, b), "r", 1.0)) == (
        "resplit",
        "j",
        {"from": [sa], "to": [sb, sb], "ranks": 2, "reason": "r"},
    )
    assert encode(StopPayload(False, "operator request"), "j") == (
        "stop",
        "j",
        {"force": False, "reason": "operator request"},
    )
    undo = encode(DestroyInstancePayload(B, "u", undo=True))
    assert undo == ("destroy_instance", None, {"slot": slot_json(0, 4, "2g.35gb"), "reason": "u", "undo": True})


@pytest.mark.parametrize(
    ("kind", "payload", "why"),
    [
        ("migrate", {"to": [], "reason": "r"}, "'from'"),
        ("start", {"to": {"gpu": 0}}, "a list of instances"),
        ("create_instance", {"slot": {"gpu": "zero", "start": 0, "profile": "1g.18gb"}}, "invalid literal"),
        ("resplit", {"from": [], "to": []}, "'ranks'"),
        ("reboot", {}, "unknown action kind 'reboot'"),
    ],
)
def test_a_malformed_payload_is_a_journal_error_naming_the_action(kind: str, payload: dict[str, Any], why: str) -> None:
    with pytest.raises(JournalError, match=rf"^action 7: .*{why}"):
        payload_of(row(kind, payload))
    assert reason_of(row(kind, payload)) == "" and not is_undo(row(kind, payload)), "listings never fail"


def test_only_the_executors_undo_destroys_are_undo_actions() -> None:
    undo = []
    for p in PAYLOADS:
        kind, _, doc = encode(p)
        undo.append(is_undo(row(kind, doc)))
    assert undo == [False, False, True, False, False, False, False, False]


def test_an_action_names_the_instances_it_creates_destroys_leaves_or_uses() -> None:
    assert [slots_named(p) for p in PAYLOADS] == [(A,), (B,), (B,), (A, B), (A, C), (A, B, C), (), ()]
