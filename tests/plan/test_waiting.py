"""What a round does with a layout change (:func:`flexmig.plan.waiting.next_step`): a change is committed only on a
busy node, abandoned whenever its demand is gone, its reservation only ever moves earlier and never into the past,
and bad figures are refused by name."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmig.plan.waiting import (
    ENDING,
    FOR_JOBS,
    GONE_NO_GO,
    GONE_NO_INSTANCES,
    Committed,
    Step,
    next_step,
)

NOW = st.floats(0.0, 1e9, allow_nan=False)
SECONDS = st.floats(0.0, 1e5, allow_nan=False)


@st.composite
def committed(draw: st.DrawFn) -> Committed:
    """A reservation around ``now`` = 1e6: not started, started, or (Slurm says) ACTIVE early."""
    start = draw(st.floats(1e6 - 2e4, 1e6 + 2e4, allow_nan=False))
    end = start + draw(st.floats(0.0, 2e4, allow_nan=False))
    return Committed(start, end, started=draw(st.booleans()))


@given(changes=st.booleans(), go=st.booleans(), busy=st.booleans(), now=NOW, close=SECONDS)
def test_nothing_committed(changes: bool, go: bool, busy: bool, now: float, close: float) -> None:
    """Without a committed change: nothing unless the plan changes instances and the verdict says go; then change
    now on a node without immovable jobs, and commit (never on an idle node) on a busy one, starting when it is
    expected to be empty."""
    step = next_step(None, changes=changes, go=go, busy=busy, now_s=now, close_in_s=close)
    if not (changes and go):
        assert step == Step("nothing")
    elif not busy:
        assert step == Step("change")
    else:
        assert step == Step("commit", close)
    assert step.kind not in ("earlier", "abandon", "wait")
    if step.kind == "commit":
        assert busy and step.start_in_s >= 0


@given(res=committed(), changes=st.booleans(), go=st.booleans(), busy=st.booleans(), close=SECONDS)
def test_committed(res: Committed, changes: bool, go: bool, busy: bool, close: float) -> None:
    """With a committed change: abandoned whenever the plan changes no instance or the verdict says no; carried out
    once no immovable job runs; otherwise moved only earlier (more than the margin, never before now, never once
    started) or kept; never committed again."""
    now = 1e6
    step = next_step(res, changes=changes, go=go, busy=busy, now_s=now, close_in_s=close)
    assert step.kind not in ("nothing", "commit")
    if not changes or not go:
        assert step == Step("abandon", reason=GONE_NO_INSTANCES if not changes else GONE_NO_GO)
        return
    assert step.kind != "abandon"
    if not busy:
        assert step == Step("change")
        return
    if step.kind == "earlier":
        assert not res.active(now)
        assert 0 <= step.start_in_s == close
        assert now + step.start_in_s < res.start_s - 2.0  # earlier, by more than the margin
    else:
        assert step.kind == "wait"
        assert step.reason == (ENDING if res.active(now) and now >= res.end_s - 1.0 else FOR_JOBS)
        if not res.active(now):
            assert now + close >= res.start_s - 2.0  # no move by less than the margin, and never later


@given(res=committed(), close=SECONDS)
def test_ending_reservation_is_left_to_end(res: Committed, close: float) -> None:
    """A started reservation within ``ending_s`` of its end is neither moved nor carried out early: the round waits."""
    now = res.end_s - 0.5
    step = next_step(res, changes=True, go=True, busy=True, now_s=now, close_in_s=close)
    if res.active(now):
        assert step == Step("wait", reason=ENDING)


@given(res=committed(), close=SECONDS, ending=SECONDS, margin=SECONDS)
def test_margins(res: Committed, close: float, ending: float, margin: float) -> None:
    """The margins are the caller's: a move is always by more than ``min_move_s``."""
    now = 1e6
    step = next_step(
        res, changes=True, go=True, busy=True, now_s=now, close_in_s=close, ending_s=ending, min_move_s=margin
    )
    if step.kind == "earlier":
        assert now + step.start_in_s < res.start_s - margin
    elif res.active(now) and now >= res.end_s - ending:
        assert step.reason == ENDING


def test_examples() -> None:
    """The agent's cases, by hand: jobs ending early move the reservation earlier; a few seconds do not."""
    res = Committed(1000.0, 1900.0)
    assert next_step(res, changes=True, go=True, busy=True, now_s=100.0, close_in_s=500.0) == Step("earlier", 500.0)
    assert next_step(res, changes=True, go=True, busy=True, now_s=100.0, close_in_s=899.0) == Step("wait", 0, FOR_JOBS)
    assert next_step(res, changes=True, go=True, busy=True, now_s=1899.5, close_in_s=0.0) == Step("wait", 0, ENDING)
    assert next_step(res, changes=True, go=True, busy=True, now_s=1500.0, close_in_s=0.0) == Step("wait", 0, FOR_JOBS)
    assert next_step(res, changes=True, go=True, busy=False, now_s=1500.0, close_in_s=0.0) == Step("change")
    slurm_says_active = Committed(1000.0, 1900.0, started=True)
    assert next_step(slurm_says_active, changes=True, go=True, busy=True, now_s=100.0, close_in_s=0.0).kind == "wait"


@pytest.mark.parametrize(
    ("kwargs", "culprit"),
    [
        ({"close_in_s": -1.0}, "close_in_s must not be negative"),
        ({"close_in_s": math.nan}, "close_in_s must be a finite number"),
        ({"close_in_s": math.inf}, "close_in_s must be a finite number"),
        ({"now_s": math.nan}, "now_s must be a finite number"),
        ({"ending_s": -0.5}, "ending_s must not be negative"),
        ({"min_move_s": -2.0}, "min_move_s must not be negative"),
        ({"committed": Committed(10.0, 5.0)}, "committed reservation ends (5.0) before it starts (10.0)"),
        ({"committed": Committed(math.nan, 5.0)}, "committed.start_s must be a finite number"),
    ],
)
def test_bad_figures_are_refused_by_name(kwargs: dict[str, object], culprit: str) -> None:
    """A figure that is no finite number, a negative delay or margin, or a reservation ending before it starts:
    one ValueError naming it."""
    args: dict[str, object] = {
        "committed": None, "changes": True, "go": True, "busy": True, "now_s": 0.0, "close_in_s": 0.0, **kwargs,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"^next_step: ") as err:
        next_step(**args)  # type: ignore[arg-type]
    assert culprit in str(err.value)
