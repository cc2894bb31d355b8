"""A trace the replay was not tuned on, for the reference check (not a test module).

``openb_pod_list_multigpu30.csv`` (Alibaba cluster-trace-gpu-v2023, resampled towards multi-GPU tasks) gives
task shapes but no times. :func:`heldout_trace` writes a pod list in the usual format whose ``i``-th GPU task has
the shape (``num_gpu``, ``gpu_milli``) of multigpu30's ``i``-th GPU task and the times (creation, scheduled,
deletion) of ``openb_pod_list_default.csv``'s ``i``-th GPU task that has all three: the arrival process and run
times of the default trace with another, more multi-GPU, mix of shapes. Deterministic; ``limit`` keeps the first
that many tasks.
"""

from __future__ import annotations

import csv
from pathlib import Path

__all__ = ["TRACES", "heldout_trace"]

TRACES = Path(__file__).resolve().parents[2] / "bench" / "traces" / "alibaba-gpu-v2023"
HEADER = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
          "creation_time", "deletion_time", "scheduled_time")  # fmt: skip


def heldout_trace(out: Path, limit: int | None = None, traces: Path = TRACES) -> Path:
    """Write the held-out pod list to ``out`` (see the module docstring); returns ``out``."""
    with (traces / "openb_pod_list_multigpu30.csv").open(newline="") as f:
        shapes = [r for r in csv.DictReader(f) if int(r["num_gpu"]) > 0]
    with (traces / "openb_pod_list_default.csv").open(newline="") as f:
        times = [
            r
            for r in csv.DictReader(f)
            if int(r["num_gpu"]) > 0 and r["creation_time"] and r["scheduled_time"] and r["deletion_time"]
        ]
    n = min(len(shapes), len(times), limit if limit is not None else len(shapes))
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for i in range(n):
            s, t = shapes[i], times[i]
            w.writerow(
                (f"heldout-{i:05}", s["cpu_milli"], s["memory_mib"], s["num_gpu"], s["gpu_milli"], "", "LS",
                 "Running", t["creation_time"], t["deletion_time"], t["scheduled_time"])
            )  # fmt: skip
    return out
