"""The forecast of Slurm's own scheduling on one MIG node: exact GRES types, whole-node backfill windows by time
limits (as verified on Slurm 22.05.8), and flexmig's reservation."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from flexmig.plan.backfill import Ask, Seat, forecast

G1, G2, G3, G7 = "1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"


def test_a_job_for_a_type_the_node_lacks_reserves_nothing_and_later_jobs_start() -> None:
    f = forecast([Seat(G1, 1)], [Ask("big", G7, 60, 120), Ask("small", G1, 60, 600)], 300)
    assert f.started == ("small",)


def test_a_job_waiting_for_its_type_holds_the_whole_node_from_when_that_type_frees_by_limits() -> None:
    # A 3g job runs until its limit in 300 s (expected to end in 50 s); another 3g job waits for it: Slurm reserves
    # the whole node from 300 s. A 1g job with a 600 s limit waits beside the free 1g; one with a 120 s limit starts.
    seats = [Seat(G3, 3, busy_s=50, limit_s=300), Seat(G1, 1)]
    long = forecast(seats, [Ask("next3g", G3, 60, 120), Ask("long1g", G1, 60, 600)], 30)
    assert long.started == ()
    short = forecast(seats, [Ask("next3g", G3, 60, 120), Ask("short1g", G1, 60, 120)], 30)
    assert short.started == ("short1g",)


def test_the_waiting_job_starts_when_its_instance_frees_and_the_others_follow() -> None:
    seats = [Seat(G3, 3, busy_s=50, limit_s=300), Seat(G1, 1)]
    f = forecast(seats, [Ask("next3g", G3, 60, 120), Ask("long1g", G1, 60, 600)], 1000)
    assert f.started == ("next3g", "long1g")  # at 50 s the 3g frees: the window is gone, both start
    assert f.empty_s == 110


def test_no_job_starts_into_flexmigs_reservation() -> None:
    seats = [Seat(G2, 2), Seat(G1, 1, busy_s=40, limit_s=100)]
    f = forecast(seats, [Ask("fits", G2, 30, 60), Ask("too_long", G2, 60, 120)], 300, close_s=90)
    assert f.started == ("fits",)
    closed = forecast(seats, [Ask("later", G1, 10, 20)], 300, close_s=30)
    assert closed.started == ()  # its instance frees at 40 s, after the close


def test_a_job_needing_two_instances_waits_until_both_are_free() -> None:
    seats = [Seat(G1, 1), Seat(G1, 1, busy_s=20, limit_s=40)]
    f = forecast(seats, [Ask("pair", G1, 30, 60, count=2)], 100)
    assert f.started == ("pair",) and f.empty_s == 50


def test_a_job_without_a_limit_never_backfills_before_a_window() -> None:
    seats = [Seat(G3, 3, busy_s=50, limit_s=300), Seat(G1, 1)]
    f = forecast(seats, [Ask("next3g", G3, 60, 120), Ask("nolimit", G1, 60, math.inf)], 30)
    assert f.started == ()


asks_st = st.lists(
    st.builds(
        Ask,
        name=st.uuids().map(str),
        profile=st.sampled_from([G1, G2, G3, G7]),
        runtime_s=st.floats(1, 200),
        limit_s=st.one_of(st.just(math.inf), st.floats(1, 400)),
        count=st.integers(1, 2),
    ),
    max_size=12,
)
seats_st = st.lists(
    st.builds(
        Seat,
        profile=st.sampled_from([G1, G2, G3]),
        slices=st.integers(1, 3),
        busy_s=st.floats(0, 200),
        limit_s=st.floats(0, 400),
    ),
    max_size=5,
)


@given(seats_st, asks_st, st.floats(1, 1000))
def test_busy_slice_seconds_never_exceed_the_capacity_of_the_horizon(
    seats: list[Seat], asks: list[Ask], horizon: float
) -> None:
    f = forecast(seats, asks, horizon)
    assert 0 <= f.busy_slice_s <= sum(s.slices for s in seats) * horizon + 1e-6
    assert len(set(f.started)) == len(f.started)


@given(seats_st, asks_st, st.floats(1, 1000))
def test_a_node_closed_now_starts_nothing_and_empties_when_its_jobs_end(
    seats: list[Seat], asks: list[Ask], horizon: float
) -> None:
    f = forecast(seats, asks, horizon, close_s=0.0)
    assert f.started == ()
    assert f.empty_s == max([0.0, *(s.busy_s for s in seats)])
