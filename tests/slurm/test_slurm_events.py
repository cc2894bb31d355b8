"""The Slurm events as the daemon makes them (:mod:`flexmig.mqtt.slurm_events`) validate against the schema."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

from flexmig.mqtt.events import EventFactory, EventKind
from flexmig.mqtt.slurm_events import CarvingNews
from flexmig.slurm.instances import CarvingReport
from support.event_samples import sample_carving, slurm_events
from support.schemas import validator


def test_each_slurm_event_kind_validates() -> None:
    events_schema = validator("event.v1.schema.json")
    ids = (f"id-{n}" for n in itertools.count())
    events = slurm_events(EventFactory("n1", clock=lambda: 1_700_000_000.0, new_id=lambda: next(ids)))
    assert {e.kind for e in events} == {k for k in EventKind if k.value.startswith("slurm_")}
    for e in events:
        errors = [err.message for err in events_schema.iter_errors(json.loads(e.to_json()))]
        assert errors == [], (e.kind, errors)
    plan = next(e for e in events if e.kind is EventKind.SLURM_PLAN)
    assert plan.payload["changes"] == ["destroy gpu0:7g.141gb@0", "create gpu0:1g.18gb@0"]


def test_a_carving_is_news_when_done_when_its_proposal_changes_and_when_a_hold_comes_or_goes() -> None:
    carved, held = sample_carving(waited_s=60.0), sample_carving(waited_s=3600.0)
    nothing = CarvingReport((), (), None, ())
    assert carved.create == (("gpu1:1g.18gb@6", "n1-gpu1-6", "slurm-9"),)
    assert carved.destroy == (("gpu1:3g.71gb@4", "n1-gpu1-4"),)
    assert held.hold == ("slurm-8", "gpu1:7g.141gb@0", 600.0) and held.create == ()
    news = CarvingNews()
    # mode advise: the same proposal every round is published once, and again after it went away
    assert [news.news("n1", r, done=False) for r in (nothing, carved, carved, nothing, carved)] == [
        False, True, False, False, True,
    ]  # fmt: skip
    # mode act: each carving done is news; the empty rounds after it are not
    act = CarvingNews()
    assert [act.news("n1", r, done=d) for r, d in ((carved, True), (nothing, False), (carved, True))] == [
        True, False, True,
    ]  # fmt: skip
    # a hold: taken (news), kept while its countdown runs (not), dropped (news); per host node
    later = replace(held, hold=("slurm-8", "gpu1:7g.141gb@0", 540.0), reasons=())
    assert [news.news("n2", r, done=False) for r in (held, later, nothing, nothing)] == [True, False, True, False]
