"""Writing the exposition: flexmig's families straight into the text and OpenMetrics formats, at a chosen detail.

prometheus_client builds a :class:`~prometheus_client.metrics_core.Metric` per family and a sample per series, each
sample with a fresh dict of labels, then formats and escapes every label of every sample again at every scrape: on
a node of 112 MIG devices that was 23 series of 11 labels per device, 54 ms of CPU and 897 KB per scrape. Most of
it repeats: an instance's labels are the same on each of its series. A :class:`Writer` takes each label set once
(:class:`LabelSet`, formatted and escaped when it is made) and writes a sample as its family's name, that block
and the value. The output is what prometheus_client's encoders write for the same families (the same lines, with
the labels in the catalogue's order rather than sorted), and :meth:`Writer.metrics` turns what was written back
into prometheus_client families, which the tests use to hold the two to the same samples.

Detail: every family of the catalogue has a level (:data:`~flexmig.metrics.families.LEVELS`: ``minimal``,
``standard``, ``full``); a writer at one level writes the families of that level and below and ignores the rest
(:meth:`Writer.family` gives None). Below the level :data:`~flexmig.metrics.families.ZEROS_FROM` gives each, the 0/1
finding families carry only the findings that are active (:meth:`Writer.zeros` is False), which is what alerts
compare (an instance's zeros would be a third of its series).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from flexmig.metrics.families import LEVELS, ZEROS_FROM, Family, FamilyKind, Level, by_name

__all__ = ["FamilyWriter", "LabelSet", "Writer", "label_set"]

_KINDS: dict[str, FamilyKind] = {"counter": "counter", "gauge": "gauge", "info": "info", "histogram": "histogram"}
_go_float = cast(Callable[[float], str], floatToGoString)


def _value(v: float) -> str:
    """A sample's value: the shortest repr of the float (``0.6``, ``8589934592.0``, ``3.0``), which both formats
    read, and prometheus_client's spelling of the infinities and NaN (``+Inf``, ``-Inf``, ``NaN``)."""
    if v.__class__ is int:
        v = float(v)
    elif v.__class__ is not float:  # a bool, a numpy or Decimal value
        return _go_float(v)
    r = repr(v)
    return _go_float(v) if r[-1] in "fn" else r


def _escape(value: str) -> str:
    """A label value as both formats write it between quotes."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


@dataclass(frozen=True, slots=True)
class LabelSet:
    """Label names and values, and ``block``: ``a="x",b="y"`` as a sample writes them (made once, used often);
    ``braced`` is the block in braces, or nothing for no labels."""

    names: tuple[str, ...]
    values: tuple[str, ...]
    block: str
    braced: str

    def extend(self, names: Sequence[str], values: Sequence[str]) -> LabelSet:
        """These labels followed by ``names`` = ``values``."""
        more = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))
        block = f"{self.block},{more}" if self.block and more else self.block or more
        return LabelSet((*self.names, *names), (*self.values, *values), block, f"{{{block}}}" if block else "")


def label_set(names: Sequence[str], values: Sequence[str]) -> LabelSet:
    """The label set ``names`` = ``values`` (as many of each)."""
    return LabelSet((), (), "", "").extend(names, values)


class FamilyWriter:
    """The samples of one family being written."""

    __slots__ = ("family", "keep", "lines", "name", "samples")

    def __init__(self, family: Family, keep: bool) -> None:
        self.family = family
        self.name = family.samples[0]
        self.keep = keep
        self.lines: list[str] = []
        self.samples: list[tuple[str, LabelSet, float]] = []

    def add(self, labels: LabelSet, value: float, sample: str | None = None) -> None:
        """One sample: ``labels`` and ``value`` under the family's sample name, or ``sample`` (a histogram's
        ``_bucket``, ``_sum`` and ``_count``)."""
        name = self.name if sample is None else sample
        if self.keep:
            self.samples.append((name, labels, value))
        self.lines.append(f"{name}{labels.braced} {_value(value)}\n")

    def info(self, labels: LabelSet, info_values: Sequence[str]) -> None:
        """One sample of an info family: ``labels`` and the family's info labels (value 1)."""
        self.add(labels.extend(self.family.info_labels, info_values), 1.0)


def _sample_name(line: str) -> str:
    """The sample name a written line starts with."""
    end = line.find("{")
    return line[: end if end >= 0 else line.find(" ")]


def _help_text(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")


def _help_om(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Writer:
    """Families written at one detail ``level``, in the order they were begun; rendered in either format."""

    def __init__(self, level: Level = "full", *, keep: bool = False) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown detail {level!r}; expected one of {', '.join(LEVELS)}")
        self.level = level
        self.keep = keep
        """Whether the samples are kept as values too (for :meth:`metrics`), not only as lines."""
        self._rank = LEVELS.index(level)
        self._families: dict[str, FamilyWriter] = {}
        self._labels: dict[Hashable, LabelSet] = {}

    def zeros(self, name: str) -> bool:
        """Whether the 0/1 finding family ``name`` also carries the findings judged absent (0) at this detail, or
        only the active ones (:data:`~flexmig.metrics.families.ZEROS_FROM`)."""
        return self._rank >= LEVELS.index(ZEROS_FROM[name])

    def labels(self, key: Hashable, make: Callable[[], LabelSet]) -> LabelSet:
        """The label set ``make()`` gives for ``key``, made once per writer (a GPU's or an instance's labels are
        written by the node's families and by detection's)."""
        got = self._labels.get(key)
        if got is None:
            got = self._labels[key] = make()
        return got

    def family(self, name: str) -> FamilyWriter | None:
        """The writer of catalogue family ``name``, begun on first call; None when this detail leaves it out."""
        got = self._families.get(name)
        if got is None:
            fam = by_name(name)
            if LEVELS.index(fam.level) > self._rank:
                return None
            got = self._families[name] = FamilyWriter(fam, self.keep)
        return got

    def add_metrics(self, metrics: Iterable[Metric]) -> None:
        """Write prometheus_client families (the live extensions', the process's) as families of the catalogue, at
        this writer's detail; a family the catalogue lacks is written under its own name, type and help."""
        for m in metrics:
            try:
                fam = by_name(m.name)
            except KeyError:
                fam = Family(m.name, _KINDS.get(m.type, "gauge"), (), m.documentation)
            if LEVELS.index(fam.level) > self._rank:
                continue
            fw = self._families.get(fam.name)
            if fw is None:
                fw = self._families[fam.name] = FamilyWriter(fam, self.keep)
            for sample in m.samples:
                ls = label_set(tuple(sample.labels), tuple(sample.labels.values()))
                fw.add(ls, sample.value, sample.name)

    def only(self, names: frozenset[str]) -> Writer:
        """A writer holding only the samples named in ``names``, and the families that keep any (as
        prometheus_client's ``name[]`` filter restricts a registry)."""
        out = Writer(self.level, keep=self.keep)
        for name, fw in self._families.items():
            keep = [i for i, line in enumerate(fw.lines) if _sample_name(line) in names]
            if not keep:
                continue
            copy = out._families[name] = FamilyWriter(fw.family, self.keep)
            copy.lines = [fw.lines[i] for i in keep]
            if self.keep:
                copy.samples = [fw.samples[i] for i in keep]
        return out

    def __iter__(self) -> Iterator[FamilyWriter]:
        return iter(self._families.values())

    def text(self) -> str:
        """The classic text format (version 0.0.4)."""
        out: list[str] = []
        for fw in self._families.values():
            f = fw.family
            name = f.samples[0] if f.kind in ("counter", "info") else f.name
            kind = "gauge" if f.kind == "info" else f.kind
            out.append(f"# HELP {name} {_help_text(f.help)}\n# TYPE {name} {kind}\n")
            out.extend(fw.lines)
        return "".join(out)

    def openmetrics(self) -> str:
        """OpenMetrics 1.0, without the closing ``# EOF`` (the caller appends it after whatever follows)."""
        out: list[str] = []
        for fw in self._families.values():
            f = fw.family
            out.append(f"# HELP {f.name} {_help_om(f.help)}\n# TYPE {f.name} {f.kind}\n")
            out.extend(fw.lines)
        return "".join(out)

    def metrics(self) -> Iterator[Metric]:
        """What was written, as prometheus_client families (for its encoders and parsers); needs ``keep``."""
        if not self.keep:
            raise ValueError("a writer made without keep=True has only lines, no samples to return")
        for fw in self._families.values():
            f = fw.family
            labels = list(f.labels)
            m: Metric
            if f.kind == "counter":
                m = CounterMetricFamily(f.name, f.help, labels=labels)
            elif f.kind == "info":
                m = InfoMetricFamily(f.name, f.help, labels=labels)
            elif f.kind == "histogram":
                m = HistogramMetricFamily(f.name, f.help, labels=labels)
            else:
                m = GaugeMetricFamily(f.name, f.help, labels=labels)
            for sample_name, ls, value in fw.samples:
                m.add_sample(sample_name, dict(zip(ls.names, ls.values, strict=True)), value)
            yield m
