"""Settings of the telemetry loops, with the defaults the daemon runs with when no configuration says otherwise.

A frozen value built once at start-up (from the ``[intervals]``, ``[dcgm]`` and ``[prometheus]`` sections of the
configuration file, see ``flexmig.config``) and passed down; nothing reads a global.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.config import Config
from flexmig.errors import ConfigError

__all__ = ["DEFAULT_WINDOW_S", "TelemetrySettings"]

DEFAULT_WINDOW_S = 60.0  # the window of the exported mean/min/p95 series


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """How often and how much the samplers read, and what counts as idle."""

    interval_s: float = 1.0  # one sweep of every GPU and MIG device
    window_s: float = DEFAULT_WINDOW_S  # the window the exported mean/min/p95 cover
    history_s: float = 600.0  # how much history each ring buffer keeps (the longest window a reader may ask)
    inventory_interval_s: float = 60.0  # full re-inventory even when nothing seems to have changed
    idle_threshold: float = 0.01  # SM activity (0..1) at or below which an instance with no process is idle
    gpm: bool = True  # ask NVML for GPM activity on GPUs that support it (Hopper and newer)
    host: bool = True  # join psutil facts (user, cgroup, CPU, RSS) onto GPU processes
    dcgm_url: str | None = None  # a dcgm-exporter /metrics URL to join DCGM_FI_PROF_* from; None: off
    dcgm_interval_s: float = 5.0
    dcgm_timeout_s: float = 3.0
    dcgm_max_age_s: float = 30.0  # older DCGM figures are not joined any more

    def __post_init__(self) -> None:
        for name in (
            "interval_s",
            "window_s",
            "history_s",
            "inventory_interval_s",
            "dcgm_interval_s",
            "dcgm_timeout_s",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"telemetry setting {name} must be a positive number of seconds, not {value!r}")
        if self.interval_s < 0.05:
            raise ConfigError(f"telemetry setting interval_s must be at least 0.05 s, not {self.interval_s}")
        if self.history_s < self.window_s:
            raise ConfigError(f"telemetry setting history_s ({self.history_s}) must cover window_s ({self.window_s})")
        if not 0.0 <= self.idle_threshold <= 1.0:
            raise ConfigError(f"telemetry setting idle_threshold must be a ratio 0..1, not {self.idle_threshold}")

    @classmethod
    def from_config(cls, config: Config) -> TelemetrySettings:
        """The telemetry part of the daemon's configuration file (``[sampling]`` and ``[dcgm]``)."""
        s = config.sampling
        return cls(
            interval_s=s.interval_s,
            window_s=min(DEFAULT_WINDOW_S, s.retention_s),
            history_s=s.retention_s,
            gpm=s.gpm,
            dcgm_url=config.dcgm.url if config.dcgm.enabled else None,
            dcgm_timeout_s=config.dcgm.timeout_s,
        )
