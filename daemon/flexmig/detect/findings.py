"""Findings: what detection concluded, as typed values with their figures and a reason in words.

A finding has a ``key`` that stays the same while the condition lasts, so a tracker can tell when one starts and
when it ends; events are emitted on those transitions, and the Prometheus exporter shows the active ones.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FINDING_DOCS",
    "EndedFinding",
    "Finding",
    "FindingKey",
    "FragmentationFinding",
    "InstanceChange",
    "OversizedFinding",
    "UnderuseFinding",
    "finding_docs",
]

#: Where docs/detection.md explains each kind of finding and the words its lines use (slices, ``PROFILE@START``, the
#: demand mix, the recoverable score), for every line people read a finding in (status, the demo, flexmig events):
#: (kind or event-kind prefix, section).
FINDING_DOCS: tuple[tuple[str, str], ...] = (
    ("fragmentation", "docs/detection.md#fragmented-gpus"),
    ("idle", "docs/detection.md#idle-and-underused-instances"),
    ("underuse", "docs/detection.md#idle-and-underused-instances"),
    ("oversize", "docs/detection.md#oversized-jobs"),
)


def finding_docs(kind: str) -> str:
    """The docs/detection.md section of a finding kind (``fragmentation``, ``idle``, ``underused``, ``oversized``) or
    of an event kind (``fragmentation_above``, ``underuse_started``, ...); the page itself for another kind."""
    return next((where for prefix, where in FINDING_DOCS if kind.startswith(prefix)), "docs/detection.md")


FindingKey = tuple[str, int, int]
"""(kind, GPU index, start memory slice; -1 for GPU-wide findings)."""


@dataclass(frozen=True, slots=True)
class UnderuseFinding:
    """An instance whose activity and memory stayed below the thresholds for the whole entry window.

    ``level`` is ``idle`` when no process ran on it, ``underused`` when a job ran but used little.
    """

    gpu: int
    start: int
    profile: str
    uuid: str | None
    level: str
    since: float
    activity: float | None
    memory_ratio: float | None
    processes: int | None
    reason: str

    @property
    def key(self) -> FindingKey:
        """Identity while the finding lasts."""
        return ("underuse", self.gpu, self.start)


@dataclass(frozen=True, slots=True)
class OversizedFinding:
    """A job whose p95 SM use and memory would fit a smaller profile with the configured headroom."""

    gpu: int
    start: int
    profile: str
    uuid: str | None
    suggested: str
    since: float
    activity: float
    memory_used_bytes: int
    reason: str

    @property
    def key(self) -> FindingKey:
        """Identity while the finding lasts."""
        return ("oversized", self.gpu, self.start)


@dataclass(frozen=True, slots=True)
class FragmentationFinding:
    """A GPU on which repacking the running instances would make capacity usable that the demand mix asks for.

    ``score`` is the recoverable score (recoverable compute slices over the GPU's compute slices) that stayed at
    or above ``threshold``; ``recoverable_compute_slices`` and ``recoverable_profile`` say what a repack would
    gain (that many compute slices, as instances of that profile).
    """

    gpu: int
    model: str
    layout: str
    since: float
    score: float
    threshold: float
    free_compute_slices: int
    stranded_compute_slices: int
    unfit: tuple[str, ...]
    reason: str
    recoverable_compute_slices: int = 0
    recoverable_profile: str | None = None

    @property
    def key(self) -> FindingKey:
        """Identity while the finding lasts."""
        return ("fragmentation", self.gpu, -1)


Finding = UnderuseFinding | OversizedFinding | FragmentationFinding


@dataclass(frozen=True, slots=True)
class EndedFinding:
    """A finding that ended at ``at``, and why in words (condition cleared, instance destroyed, GPU lost...)."""

    finding: Finding
    at: float
    reason: str

    @property
    def duration_s(self) -> float:
        """How long the finding lasted."""
        return self.at - self.finding.since


@dataclass(frozen=True, slots=True)
class InstanceChange:
    """A GPU instance that appeared or disappeared between two observations of the layouts.

    ``uuid`` is the instance's own MIG device UUID when the observation that saw it knew one: for a destroyed
    instance the one it had, not that of an instance created at the same place since.
    """

    gpu: int
    start: int
    profile: str
    at: float
    uuid: str | None = None
