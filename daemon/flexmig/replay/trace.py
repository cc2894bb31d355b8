"""Reading Alibaba ``cluster-trace-gpu-v2023`` pod lists and turning rows into MIG jobs.

The mapping (documented in docs/replay.md, and the same for every policy):

* **GPU share to profile.** A row with ``num_gpu == 1`` asks ``gpu_milli`` thousandths of one GPU. It becomes
  one rank of the smallest plain MIG profile that covers the share in compute *or* in memory: the fewest compute
  slices ``k`` (then memory slices ``m``) with ``k/7 >= share`` or ``m/8 >= share``. On an
  H200: up to 142 -> 1g.18gb, up to 250 -> 1g.35gb, up to 285 -> 2g.35gb, up to 500 -> 3g.71gb, up to 571 ->
  4g.71gb, above -> 7g.141gb.
* **Multi-GPU tasks.** ``num_gpu = n > 1`` becomes a distributed job of ``n`` ranks of the full-GPU profile.
* **Run time** is ``deletion_time - scheduled_time`` (the time it held its GPU in the trace); the arrival is
  ``creation_time``. Rows still running when the trace was cut carry the cut as their deletion time: their run
  time is what was observed, a lower bound.
* **Skipped rows**, counted by reason: no GPU (``num_gpu == 0``); never scheduled (no ``scheduled_time``: the pod
  was still pending when the trace was cut or was deleted while pending, so it never ran and has no run time); no
  deletion time; a run time of zero or less.
* **Elastic jobs** (may run as several smaller ranks): by default the jobs that ask for whole GPUs
  (``gpu_milli == 1000`` or ``num_gpu > 1``), taken to be data-parallel training; a fractional share is taken to be
  a service or notebook that cannot be split. Other rules: ``none``, ``multi`` (only ``num_gpu > 1``), ``all``.
  An elastic job may run as 1 to 7 x ``num_gpu`` ranks (down to one compute slice each).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flexmig.errors import TraceError
from flexmig.mig.catalogue import GpuModel, Profile

__all__ = [
    "ELASTIC_RULES",
    "ElasticRule",
    "MappedTrace",
    "TraceJob",
    "TraceRow",
    "map_trace",
    "profile_for_share",
    "read_trace",
]

ElasticRule = Literal["none", "whole", "multi", "all"]
ELASTIC_RULES: tuple[str, ...] = ("none", "whole", "multi", "all")
_REQUIRED = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One pod of the trace, as read (times in seconds; None where the trace leaves them empty)."""

    line: int
    name: str
    num_gpu: int
    gpu_milli: int
    creation_s: int
    scheduled_s: int | None
    deletion_s: int | None
    qos: str
    phase: str


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A job to replay: ``ranks`` ranks of ``profile`` arriving at ``arrival_s``, running ``runtime_s`` nominally."""

    name: str
    arrival_s: float
    runtime_s: float
    profile: Profile
    ranks: int
    elastic: bool
    gpu_milli: int

    @property
    def compute_slices(self) -> int:
        """Compute slices the job holds at its nominal shape."""
        return self.ranks * self.profile.compute_slices

    @property
    def work(self) -> float:
        """Slice-seconds of work (compute slices times nominal run time)."""
        return self.compute_slices * self.runtime_s


@dataclass(frozen=True, slots=True)
class MappedTrace:
    """The jobs of a trace, in arrival order, and how many rows were skipped, by reason."""

    jobs: tuple[TraceJob, ...]
    skipped: dict[str, int]


def _int(path: Path, line: int, row: dict[str, str], key: str, *, optional: bool = False) -> int | None:
    raw = (row.get(key) or "").strip()
    if raw == "":
        if optional:
            return None
        raise TraceError(f"{path}:{line}: column {key!r} is empty")
    try:
        return int(float(raw)) if "." in raw else int(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {key!r} is not a number: {raw!r}") from None


def read_trace(path: str | Path) -> list[TraceRow]:
    """Read a pod-list CSV; TraceError names the file, line and column of the first bad field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace {p} is not UTF-8 text: {exc.reason}") from None
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [k for k in _REQUIRED if k not in header]
    if missing:
        raise TraceError(f"{p}:1: missing column(s) {', '.join(missing)} (have: {', '.join(header) or 'none'})")
    rows: list[TraceRow] = []
    for n, row in enumerate(reader, start=2):
        if None in row:
            raise TraceError(f"{p}:{n}: more fields than the header has columns")
        num_gpu = _int(p, n, row, "num_gpu")
        milli = _int(p, n, row, "gpu_milli")
        creation = _int(p, n, row, "creation_time")
        assert num_gpu is not None and milli is not None and creation is not None
        if num_gpu < 0 or milli < 0:
            raise TraceError(f"{p}:{n}: num_gpu and gpu_milli must not be negative")
        if num_gpu == 1 and milli > 1000:
            raise TraceError(f"{p}:{n}: column 'gpu_milli' is {milli}, more than one GPU (1000)")
        rows.append(
            TraceRow(
                line=n,
                name=(row.get("name") or f"row{n}").strip(),
                num_gpu=num_gpu,
                gpu_milli=milli,
                creation_s=creation,
                scheduled_s=_int(p, n, row, "scheduled_time", optional=True),
                deletion_s=_int(p, n, row, "deletion_time", optional=True),
                qos=(row.get("qos") or "").strip(),
                phase=(row.get("pod_phase") or "").strip(),
            )
        )
    return rows


def profile_for_share(model: GpuModel, milli: int) -> Profile:
    """The smallest plain profile covering ``milli`` thousandths of a GPU in compute or in memory."""
    for p in sorted(model.plain_profiles, key=lambda p: (p.compute_slices, p.memory_slices)):
        if (
            p.compute_slices * 1000 >= milli * model.compute_slices
            or p.memory_slices * 1000 >= milli * model.memory_slices
        ):
            return p
    return model.profile_for_slices(model.compute_slices)


def _elastic(rule: ElasticRule, row: TraceRow) -> bool:
    if rule == "none":
        return False
    if rule == "all":
        return True
    if rule == "multi":
        return row.num_gpu > 1
    return row.num_gpu > 1 or row.gpu_milli >= 1000


def map_trace(rows: Iterable[TraceRow], model: GpuModel, *, elastic: ElasticRule = "whole") -> MappedTrace:
    """Turn trace rows into jobs for ``model`` (see the module docstring for every rule)."""
    if elastic not in ELASTIC_RULES:
        raise TraceError(f"unknown elastic rule {elastic!r}; expected one of {', '.join(ELASTIC_RULES)}")
    full = model.profile_for_slices(model.compute_slices)
    jobs: list[TraceJob] = []
    skipped: Counter[str] = Counter()
    for row in rows:
        if row.num_gpu == 0:
            skipped["no GPU"] += 1
            continue
        if row.scheduled_s is None:
            skipped["never scheduled"] += 1
            continue
        if row.deletion_s is None:
            skipped["no deletion time"] += 1
            continue
        runtime = row.deletion_s - row.scheduled_s
        if runtime <= 0:
            skipped["run time <= 0"] += 1
            continue
        if row.num_gpu == 1:
            milli = row.gpu_milli if row.gpu_milli > 0 else 1000
            profile, ranks = profile_for_share(model, milli), 1
        else:
            milli, profile, ranks = 1000, full, row.num_gpu
        jobs.append(
            TraceJob(
                name=row.name,
                arrival_s=float(row.creation_s),
                runtime_s=float(runtime),
                profile=profile,
                ranks=ranks,
                elastic=_elastic(elastic, row),
                gpu_milli=milli,
            )
        )
    jobs.sort(key=lambda j: (j.arrival_s, j.name))
    return MappedTrace(tuple(jobs), dict(sorted(skipped.items())))
