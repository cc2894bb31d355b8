"""The generated tables of docs/metrics.md, from the catalogue (:mod:`flexmig.metrics.families`): the metric
reference (one row per family), the families each detail level adds, and the series budget each level costs a node
and a fleet. ``python -m flexmig.metrics.reference --markdown | --levels | --budget`` prints them; a test compares
docs/metrics.md with them."""

from __future__ import annotations

import argparse
import sys

from flexmig.metrics.families import FAMILIES, GPU_LABELS, INSTANCE_LABELS, LEVELS, ZEROS_FROM, Family, Level, by_name

__all__ = [
    "NODE_WIDE_SERIES",
    "SAMPLE_DISK_BYTES",
    "SERIES_RAM_BYTES",
    "budget_table",
    "levels_table",
    "main",
    "markdown_table",
    "series_per_level",
]


def _labels_cell(f: Family) -> str:
    labels, head = list(f.labels), ""
    for prefix, word in ((INSTANCE_LABELS, "instance"), (GPU_LABELS, "GPU")):
        if tuple(labels[: len(prefix)]) == prefix:
            head, labels = word, labels[len(prefix) :]
            break
    parts = ([head] if head else []) + [f"`{x}`" for x in (*labels, *f.info_labels)]
    return ", ".join(parts) if parts else "(target labels only)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The metric reference table of docs/metrics.md (between its generated-table markers), one row per family."""
    lines = ["| metric | type | labels | meaning | series | detail |", "|---|---|---|---|---|---|"]
    for f in FAMILIES:
        names = " ".join(f"`{n}`" for n in f.samples)
        kind = "gauge (info)" if f.kind == "info" else f.kind
        when = _cell(f.when) or "always"
        lines.append(f"| {names} | {kind} | {_labels_cell(f)} | {_cell(f.help)} | {when} | {f.level} |")
    return "\n".join(lines) + "\n"


_ONLY_ACTIVE = (
    "flexmig_mig_finding_duration_seconds",
    "flexmig_mig_suggested_profile",
    "flexmig_gpu_finding_duration_seconds",
)
"""Families with a series only while a finding is active, at every level."""


def series_per_level(labels: tuple[str, ...], profiles: int) -> dict[Level, tuple[int, int]]:
    """Series each detail level costs per thing labelled ``labels`` (an instance or a GPU): (fewest, most).

    The fewest is with no finding active; the most with every finding active. A family labelled per profile
    counts ``profiles`` series; per finding kind, one series per kind (at ``full``, where the absent ones are 0);
    per layout change, two (created, destroyed).
    """
    kinds = {"flexmig_mig_finding": 3, "flexmig_gpu_finding": 1, "flexmig_mig_finding_duration_seconds": 3,
             "flexmig_gpu_finding_duration_seconds": 1}  # fmt: skip
    out: dict[Level, tuple[int, int]] = {}
    for rank, level in enumerate(LEVELS):
        low = high = 0
        for f in FAMILIES:
            if f.labels[: len(labels)] != labels or LEVELS.index(f.level) > rank or f.when.startswith("with `"):
                continue
            rest = f.labels[len(labels) :]
            if rest and rest[0] in ("gpu", "GPU_I_ID"):
                continue  # a family of a longer label set (instances, when counting GPUs)
            n = profiles if "profile" in rest else 2 if "change" in rest else kinds.get(f.name, 1)
            if f.name in _ONLY_ACTIVE or (f.name in ZEROS_FROM and rank < LEVELS.index(ZEROS_FROM[f.name])):
                high += n
            else:
                low += n
                high += n
        out[level] = (low, high)
    return out


NODE_WIDE_SERIES = 115
"""About how many node-wide series a node in mode act exports at every level (the daemon's own health, detection's
node figures, the actuator's counters and histograms, MQTT's): what bench/scrape.py measured (100, rounded up), and
the 14 of the instances creatable per profile now and if repacked added since."""
SERIES_RAM_BYTES = 2560
"""Prometheus 2.x head memory per active series with a dozen labels: about 732 B, 32 B per label pair and the
name twice, doubled for Go's garbage collector (Robust Perception, "How much RAM does Prometheus 2.x need for
cardinality and ingestion?", https://www.robustperception.io/how-much-ram-does-prometheus-2-x-need-for-cardinality-and-ingestion/),
rounded to 2.5 KiB."""
SAMPLE_DISK_BYTES = 1.5
"""Bytes per sample on disk after compaction (Prometheus's storage documentation: 1-2 bytes per sample,
https://prometheus.io/docs/prometheus/latest/storage/)."""


def budget_table(profiles: int = 7, gpus: int = 8, per_gpu: int = 7, nodes: int = 1000, scrape_s: int = 15) -> str:
    """The budget tables of docs/metrics.md: series per MIG instance, per GPU and per node of ``gpus`` GPUs with
    ``per_gpu`` instances each at every detail level (a range: from no finding active to every finding active),
    and what ``nodes`` such nodes cost a Prometheus scraping every ``scrape_s`` seconds. ``profiles``: how many
    profiles a GPU lists (7 on an H200)."""
    inst = series_per_level(INSTANCE_LABELS, profiles)
    gpu = series_per_level(GPU_LABELS, profiles)
    devices = gpus * per_gpu
    lines = [
        f"| detail | series per MIG instance | series per GPU | series per node ({gpus} GPUs x {per_gpu} instances) |",
        "|---|---|---|---|",
    ]
    per_node: dict[str, int] = {}
    for level in LEVELS:
        lo = devices * inst[level][0] + gpus * gpu[level][0] + NODE_WIDE_SERIES
        hi = devices * inst[level][1] + gpus * gpu[level][1] + NODE_WIDE_SERIES
        per_node[level] = lo
        cells = [f"{a}" if a == b else f"{a}-{b}" for a, b in (inst[level], gpu[level], (lo, hi))]
        lines.append(f"| {level}{' (default)' if level == 'standard' else ''} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"| detail | {nodes:,} nodes: active series | head memory | samples per second | disk per day |",
        "|---|---|---|---|---|",
    ]
    for level in LEVELS:
        series = per_node[level] * nodes
        ram = series * SERIES_RAM_BYTES / 2**30
        rate = series / scrape_s
        disk = rate * 86400 * SAMPLE_DISK_BYTES / 1e9
        lines.append(f"| {level} | {series / 1e6:.2f} M | {ram:.1f} GiB | {rate / 1000:.0f} k | {disk:.1f} GB |")
    return "\n".join(lines) + "\n"


def levels_table() -> str:
    """The table of docs/metrics.md that names, per detail level, the per-instance and per-GPU families it adds to
    the level before it (every node-wide family is exported at every level), and from which level a 0/1 finding
    family carries the findings judged absent too (:data:`ZEROS_FROM`)."""
    lines = ["| detail | adds per MIG instance | adds per GPU |", "|---|---|---|"]
    for level in LEVELS:
        cells = []
        for labels in (INSTANCE_LABELS, GPU_LABELS):
            names = [
                f"`{f.name}`"
                for f in FAMILIES
                if f.level == level and f.labels[: len(labels)] == labels
                and (labels == INSTANCE_LABELS or "GPU_I_ID" not in f.labels)
            ]  # fmt: skip
            names += [f"`{n}` = 0 (judged absent)" for n, z in ZEROS_FROM.items()
                      if z == level and level != "minimal" and by_name(n).labels[: len(labels)] == labels
                      and (labels == INSTANCE_LABELS or "GPU_I_ID" not in by_name(n).labels)]  # fmt: skip
            cells.append(", ".join(names) or "nothing")
        lines.append(f"| {level}{' (default)' if level == 'standard' else ''} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m flexmig.metrics.reference --markdown``: print the reference table."""
    parser = argparse.ArgumentParser(
        prog="python -m flexmig.metrics.reference", description="flexmigd's metric families."
    )
    parser.add_argument("--markdown", action="store_true", help="print the reference table of docs/metrics.md")
    parser.add_argument("--budget", action="store_true", help="print the series budget table of docs/metrics.md")
    parser.add_argument("--levels", action="store_true", help="print the families each detail adds (docs/metrics.md)")
    args = parser.parse_args(argv)
    if args.levels:
        sys.stdout.write(levels_table())
    elif args.budget:
        sys.stdout.write(budget_table())
    elif args.markdown:
        sys.stdout.write(markdown_table())
    else:
        for f in FAMILIES:
            print(f"{f.name} {f.kind} {','.join(f.labels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
