"""Ring buffers and windows: bounded memory, right statistics, unavailable readings stay unavailable."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmig.telemetry.ring import RingBuffer, capacity_for


def test_window_reports_mean_min_max_p95_and_last_over_the_last_seconds() -> None:
    ring = RingBuffer(100)
    for t in range(1, 21):  # values 1..20 at t = 1..20
        ring.append(float(t), float(t))
    w = ring.window(now=20.0, seconds=10.0)  # (10, 20] -> 11..20
    assert w is not None
    assert w.count == 10
    assert w.mean == pytest.approx(15.5)
    assert (w.min, w.max, w.last) == (11.0, 20.0, 20.0)
    assert w.p95 == 20.0  # nearest rank: ceil(0.95 * 10) = 10th of 10
    assert w.span_s == 9.0


def test_window_with_no_point_in_it_is_none_not_zero() -> None:
    ring = RingBuffer(10)
    assert ring.window(now=5.0, seconds=1.0) is None
    ring.append(1.0, 0.5)
    assert ring.window(now=100.0, seconds=10.0) is None


def test_buffer_holds_at_most_its_capacity_and_drops_the_oldest() -> None:
    ring = RingBuffer(5)
    for t in range(100):
        ring.append(float(t), float(t))
    assert len(ring) == 5
    w = ring.window(now=99.0, seconds=1000.0)
    assert w is not None
    assert (w.count, w.min, w.max) == (5, 95.0, 99.0)


def test_time_going_backwards_is_refused_and_same_time_replaces() -> None:
    ring = RingBuffer(5)
    ring.append(2.0, 1.0)
    with pytest.raises(ValueError, match="before the previous"):
        ring.append(1.0, 1.0)
    ring.append(2.0, 3.0)
    assert ring.latest() == (2.0, 3.0)
    assert len(ring) == 1


def test_nan_is_not_a_sample() -> None:
    with pytest.raises(ValueError, match="NaN"):
        RingBuffer(3).append(1.0, math.nan)


def test_points_after_now_are_outside_the_window() -> None:
    ring = RingBuffer(10)
    ring.append(1.0, 1.0)
    ring.append(5.0, 9.0)
    w = ring.window(now=2.0, seconds=5.0)
    assert w is not None
    assert (w.count, w.last) == (1, 1.0)


def test_capacity_covers_the_window_at_the_interval() -> None:
    assert capacity_for(60.0, 1.0) >= 60
    assert capacity_for(1.0, 0.25) >= 4
    with pytest.raises(ValueError):
        capacity_for(0.0, 1.0)


@given(
    st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), min_size=1, max_size=300),
    st.integers(min_value=1, max_value=64),
    st.floats(min_value=0.5, max_value=400),
)
def test_window_statistics_match_a_direct_computation(values: list[float], cap: int, seconds: float) -> None:
    check_windows(values, cap, seconds)


@given(
    st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=1, max_size=300),
    st.integers(min_value=1, max_value=64),
    st.floats(min_value=0.5, max_value=400),
)
def test_windows_of_readings_that_repeat_match_a_direct_computation(
    values: list[float], cap: int, seconds: float
) -> None:
    check_windows(values, cap, seconds)


def test_a_window_of_unchanging_readings_moves_with_time_and_sees_the_next_change() -> None:
    ring = RingBuffer(100)
    for t in range(10):
        ring.append(float(t), 0.5)
    first = ring.window(9.0, 5.0)
    assert first is not None and (first.count, first.span_s, first.mean, first.p95) == (5, 4.0, 0.5, 0.5)
    ring.append(10.0, 0.5)
    assert ring.window(10.0, 5.0) == first  # the same figures a second later
    ring.append(11.0, 0.9)
    moved = ring.window(11.0, 5.0)
    assert moved is not None and (moved.count, moved.max, moved.last) == (5, 0.9, 0.9)
    assert moved.mean == (4 * 0.5 + 0.9) / 5


def check_windows(values: list[float], cap: int, seconds: float) -> None:
    """Every window of the buffer after each append, against a direct computation over the points kept."""
    ring = RingBuffer(cap)
    for i, v in enumerate(values):
        ring.append(float(i), v)
        check_window(ring, values[: i + 1], cap, seconds)


def check_window(ring: RingBuffer, values: list[float], cap: int, seconds: float) -> None:
    """The window ending at the last point, against a direct computation."""
    now = float(len(values) - 1)
    kept = list(enumerate(values))[-cap:]
    inside = [v for t, v in kept if now - seconds < t <= now]
    times = [t for t, _ in kept if now - seconds < t <= now]
    w = ring.window(now, seconds)
    if not inside:
        assert w is None
        return
    assert w is not None
    assert w.count == len(inside)
    assert w.mean == pytest.approx(sum(inside) / len(inside))
    assert w.min == min(inside) <= w.p95 <= w.max == max(inside)
    assert w.p95 == sorted(inside)[max(1, math.ceil(0.95 * len(inside))) - 1]
    assert w.span_s == times[-1] - times[0]
    assert w.last == inside[-1]
