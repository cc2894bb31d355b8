"""The telemetry window that detection reads: one MIG instance over one stretch of time.

Telemetry keeps ring buffers of raw samples; detection only needs a few figures per instance and window. This
value is the contract between the two layers, kept small so that any source (NVML GPM on Hopper, a
dcgm-exporter scrape, memory and process lists only on Ampere) can fill it. A figure the source could not give is
``None`` and detection treats it as unknown, never as zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.mig.fastinit import fast_init

__all__ = ["InstanceKey", "InstanceUsage"]

InstanceKey = tuple[int, int]
"""(GPU index, start memory slice): what identifies a GPU instance across sweeps (GI IDs belong to the driver)."""


@fast_init
@dataclass(frozen=True, slots=True)
class InstanceUsage:
    """What one MIG instance did during the window ``(at - window_s, at]``.

    ``activity_mean`` and ``activity_p95`` are ratios 0..1 of the instance's own SMs (GPM ``SM_ACTIVITY`` or DCGM
    ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``); None when no source gives per-instance activity (Ampere without DCGM).
    ``memory_used_bytes``/``memory_total_bytes`` are the instance's framebuffer figures; ``processes`` the number of
    compute processes seen on it (None: NVML would not list them).
    """

    gpu: int
    start: int
    profile: str
    at: float
    window_s: float
    activity_mean: float | None
    activity_p95: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    processes: int | None
    uuid: str | None = None

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError(f"InstanceUsage for GPU {self.gpu} slice {self.start}: window_s must be > 0")
        # DCGM's SM_ACTIVE can read a little above 1.0 on a GPU instance (DCGM #152); more is a unit mix-up. Checked
        # field by field, not in a loop over names: every sweep builds one of these per instance.
        mean, p95 = self.activity_mean, self.activity_p95
        if mean is not None and not 0.0 <= mean <= 1.5:
            raise ValueError(
                f"InstanceUsage for GPU {self.gpu} slice {self.start}: activity_mean={mean} is not a ratio"
            )
        if p95 is not None and not 0.0 <= p95 <= 1.5:
            raise ValueError(f"InstanceUsage for GPU {self.gpu} slice {self.start}: activity_p95={p95} is not a ratio")

    @property
    def key(self) -> InstanceKey:
        """(GPU index, start memory slice)."""
        return (self.gpu, self.start)

    @property
    def since(self) -> float:
        """Start of the window."""
        return self.at - self.window_s

    @property
    def activity(self) -> float | None:
        """The activity figure detection judges by: the 95th percentile when known (bursty jobs are not idle), else
        the mean."""
        return self.activity_p95 if self.activity_p95 is not None else self.activity_mean

    @property
    def memory_ratio(self) -> float | None:
        """Memory used over memory total, or None when either is unknown."""
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes
