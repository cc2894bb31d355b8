"""Thresholds and windows of detection, with their defaults and why they are what they are."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_DEMAND",
    "DetectSettings",
    "FragmentationSettings",
    "UnderuseSettings",
]

DEFAULT_DEMAND: tuple[tuple[str, float], ...] = (
    ("1g", 0.35),
    ("2g", 0.25),
    ("3g", 0.20),
    ("4g", 0.10),
    ("7g", 0.10),
)
"""The request mix assumed when no recent requests are known: skewed to small instances, because MIG is chosen
for jobs smaller than a GPU (and FGD's Alibaba trace is dominated by fractional-GPU tasks), with
some weight on whole GPUs so that a node which can no longer host one shows as fragmented. Shapes name compute
slices (``3g``: the plain 3-slice profile of the GPU's model) or an exact profile (``1g.35gb``)."""


@dataclass(frozen=True, slots=True)
class UnderuseSettings:
    """When an instance is idle or underused, and when a job is oversized.

    A window is *low* when the instance has no process, or when its activity (p95, else mean) is at most
    ``activity_enter`` and its memory use at most ``memory_enter`` of the instance. It is *high* when activity is
    above ``activity_exit`` or memory above ``memory_exit`` (or it runs processes whose activity nobody can see).
    In between, nothing changes. A finding starts once low has held for ``enter_after_s`` and ends once high has
    held for ``exit_after_s``: two thresholds and two durations, so a job that hovers near one threshold does not
    make the finding flap.
    """

    activity_enter: float = 0.05
    activity_exit: float = 0.15
    memory_enter: float = 0.10
    memory_exit: float = 0.25
    enter_after_s: float = 600.0
    exit_after_s: float = 120.0
    oversize_margin: float = 0.25
    """A smaller profile must hold the job's p95 SM use and memory with this much headroom (25%)."""
    oversize_after_s: float = 900.0
    max_gap_s: float = 300.0
    """A gap in telemetry longer than this restarts any pending condition (it did not "hold" while unseen)."""
    forget_after_s: float = 300.0
    """An instance unreported this long, or gone from the layout, ends its findings."""

    def __post_init__(self) -> None:
        if not 0 <= self.activity_enter <= self.activity_exit:
            raise ValueError("underuse: need 0 <= activity_enter <= activity_exit")
        if not 0 <= self.memory_enter <= self.memory_exit:
            raise ValueError("underuse: need 0 <= memory_enter <= memory_exit")
        if min(self.enter_after_s, self.exit_after_s, self.oversize_after_s, self.max_gap_s) < 0:
            raise ValueError("underuse: durations must be >= 0")
        if self.oversize_margin < 0:
            raise ValueError("underuse: oversize_margin must be >= 0")


@dataclass(frozen=True, slots=True)
class FragmentationSettings:
    """When a GPU counts as fragmented, and which request mix the figures are weighted by.

    The recoverable score (0..1, see ``detect.fragmentation``: the compute slices a repack would make usable by a
    profile the demand mix asks for, over the GPU's seven) must reach ``enter`` for ``enter_after_s`` to start a
    finding and fall to ``exit`` for ``exit_after_s`` to end it. The defaults start a finding at two recoverable
    compute slices (2/7 >= 0.25) and end it at one or none (1/7 <= 0.15): a single stranded slice is not worth
    moving jobs for, a recoverable 2g or more is.
    """

    enter: float = 0.25
    exit: float = 0.15
    enter_after_s: float = 60.0
    exit_after_s: float = 60.0
    demand: tuple[tuple[str, float], ...] = DEFAULT_DEMAND
    demand_window_s: float = 3600.0
    """Requests older than this are forgotten when the mix is learned from recent requests."""
    demand_prior_weight: float = 5.0
    """How many requests' worth of weight the configured mix keeps against observed requests."""

    def __post_init__(self) -> None:
        if not 0 <= self.exit <= self.enter <= 1:
            raise ValueError("fragmentation: need 0 <= exit <= enter <= 1")
        if not self.demand or any(w < 0 for _, w in self.demand) or sum(w for _, w in self.demand) <= 0:
            raise ValueError("fragmentation: demand needs at least one shape with a positive weight")


@dataclass(frozen=True, slots=True)
class DetectSettings:
    """All detection settings."""

    underuse: UnderuseSettings = field(default_factory=UnderuseSettings)
    fragmentation: FragmentationSettings = field(default_factory=FragmentationSettings)
