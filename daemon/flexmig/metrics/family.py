"""One metric family's entry in the catalogue (:mod:`flexmig.metrics.families`): the :class:`Family` record, the
detail levels, and the identity label sets every flexmig series joins on (see the catalogue's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

__all__ = [
    "GPU_LABELS",
    "INSTANCE_LABELS",
    "LEVELS",
    "NODE_LABELS",
    "Family",
    "FamilyKind",
    "Level",
    "counter",
    "gauge",
]

FamilyKind = Literal["gauge", "counter", "info", "histogram"]
Level = Literal["minimal", "standard", "full"]
LEVELS: tuple[Level, ...] = ("minimal", "standard", "full")
"""Detail levels, least first: a node exports the families of its level and of every level before it."""

NODE_LABELS: tuple[str, ...] = ("Hostname",)
GPU_LABELS: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", "model_name", "Hostname")
INSTANCE_LABELS: tuple[str, ...] = (*GPU_LABELS, "GPU_I_ID", "GPU_I_PROFILE", "GPU_CI_ID", "mig_uuid")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family: its name as ``# TYPE`` writes it, its kind, labels in order, and what it means.

    ``help`` is the exposition's ``# HELP`` text and the meaning column of the reference; ``when`` says when the
    family has series at all (empty: always, on every node with a sweep); ``info_labels`` are the labels an info
    family's value carries (beside ``labels``); ``extern`` marks families another library exports for us
    (prometheus_client's ``process_*``); ``level`` is the least detail at which it is exported (:data:`LEVELS`).
    """

    name: str
    kind: FamilyKind
    labels: tuple[str, ...]
    help: str
    when: str = ""
    info_labels: tuple[str, ...] = ()
    extern: bool = False
    level: Level = "minimal"

    @property
    def samples(self) -> tuple[str, ...]:
        """The sample names PromQL uses for this family (``_total`` for counters, ``_info``, histogram parts)."""
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "info":
            return (f"{self.name}_info",)
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)

    def _check(self, kind: FamilyKind) -> None:
        if self.kind != kind:
            raise TypeError(f"{self.name} is a {self.kind}, not a {kind}")

    def gauge(self) -> GaugeMetricFamily:
        """An empty gauge family with this entry's name, help and labels."""
        self._check("gauge")
        return GaugeMetricFamily(self.name, self.help, labels=list(self.labels))

    def counter(self) -> CounterMetricFamily:
        """An empty counter family (samples ``<name>_total``)."""
        self._check("counter")
        return CounterMetricFamily(self.name, self.help, labels=list(self.labels))

    def info(self) -> InfoMetricFamily:
        """An empty info family (samples ``<name>_info``, value 1, the information in labels)."""
        self._check("info")
        return InfoMetricFamily(self.name, self.help, labels=list(self.labels))

    def histogram(self) -> HistogramMetricFamily:
        """An empty histogram family (``_bucket``, ``_sum``, ``_count``)."""
        self._check("histogram")
        return HistogramMetricFamily(self.name, self.help, labels=list(self.labels))


def gauge(name: str, labels: tuple[str, ...], doc: str, when: str = "") -> Family:
    """A gauge's entry (the catalogue's shorthand)."""
    return Family(name, "gauge", labels, doc, when)


def counter(name: str, labels: tuple[str, ...], doc: str, when: str = "") -> Family:
    """A counter's entry (the catalogue's shorthand)."""
    return Family(name, "counter", labels, doc, when)
