"""GPM in the simulator: activity integrated into counters, so that a metric is (delta of counter) / elapsed.

A real driver's GPM sample is a snapshot of hardware counters; ``nvmlGpmMetricsGet`` turns two snapshots into
rates. Here every GPU and GPU instance carries a :class:`Counters` that integrates its piecewise-constant
activity over the simulator's clock; a sample copies the totals and the time, and a metric is
``100 * (total2 - total1) / (t2 - t1)``, a percentage 0..100 like NVML's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["METRIC_COUNTER", "Counters", "GpmSnapshot", "metric_value"]

# NVML_GPM_METRIC_* id -> index into the counters (sm, occupancy, dram, tensor).
METRIC_COUNTER: dict[int, int] = {
    1: 0,  # GRAPHICS_UTIL: on a compute-only workload it follows SM activity
    2: 0,  # SM_UTIL
    3: 1,  # SM_OCCUPANCY
    5: 3,  # ANY_TENSOR_UTIL
    7: 3,  # HMMA_TENSOR_UTIL: the simulated jobs use half-precision tensor cores only
    10: 2,  # DRAM_BW_UTIL
}

METRIC_INFO: dict[int, tuple[bytes, bytes, bytes]] = {
    1: (b"gr_util", b"Graphics utilization", b"%"),
    2: (b"sm_util", b"SM utilization", b"%"),
    3: (b"sm_occupancy", b"SM occupancy", b"%"),
    5: (b"any_tensor_util", b"Any tensor utilization", b"%"),
    7: (b"hmma_tensor_util", b"HMMA tensor utilization", b"%"),
    10: (b"dram_bw_util", b"DRAM bandwidth utilization", b"%"),
}


@dataclass(slots=True)
class Counters:
    """Integrals of activity over time (activity-seconds), advanced lazily to the time of each read."""

    t: float
    totals: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    rates: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def advance(self, now: float) -> None:
        """Add ``rates * (now - t)`` to the totals; a clock that went backwards adds nothing."""
        dt = now - self.t
        if dt > 0:
            for i, r in enumerate(self.rates):
                self.totals[i] += r * dt
            self.t = now

    def set_rates(self, now: float, rates: tuple[float, float, float, float]) -> None:
        """Change the activity from ``now`` on (integrating the old rates up to ``now`` first)."""
        self.advance(now)
        self.rates = rates

    def snapshot(self, now: float) -> tuple[float, tuple[float, ...]]:
        """(time, totals) at ``now``."""
        self.advance(now)
        return (self.t, tuple(self.totals))


@dataclass(slots=True)
class GpmSnapshot:
    """What one simulated GPM sample buffer holds: whose counters, when, and their totals."""

    owner: tuple[int, int | None, int] | None = None  # (gpu index, GI id or None for the GPU, GI serial)
    t: float = 0.0
    totals: tuple[float, ...] = ()


def metric_value(first: GpmSnapshot, second: GpmSnapshot, metric_id: int) -> float | None:
    """The percentage ``metric_id`` measures between two snapshots, or None if the simulator has no such metric."""
    idx = METRIC_COUNTER.get(metric_id)
    if idx is None:
        return None
    elapsed = second.t - first.t
    if elapsed <= 0:
        return 0.0
    value = 100.0 * (second.totals[idx] - first.totals[idx]) / elapsed
    return min(100.0, max(0.0, value))
