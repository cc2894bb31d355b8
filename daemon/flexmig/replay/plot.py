"""A replay's timeline as a PNG: utilization, queue length and fragmentation over simulated time.

matplotlib runs with the Agg backend (no display); it is imported here only, so replays without ``--plot``
never pay for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flexmig.errors import TraceError
from flexmig.replay.engine import Sample

__all__ = ["plot_timeline"]

_MAX_POINTS = 4000


def plot_timeline(samples: Sequence[Sample], capacity_slices: int, path: Path, title: str = "") -> None:
    """Draw three stacked step plots of ``samples`` into ``path`` (PNG). TraceError if it cannot be written."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    if not samples:
        raise TraceError("no samples to plot")
    step = max(1, len(samples) // _MAX_POINTS)
    picked = list(samples[::step])
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    t0 = picked[0].t
    days = [(s.t - t0) / 86400.0 for s in picked]
    fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    try:
        axes[0].step(days, [s.used_slices / capacity_slices for s in picked], where="post", color="tab:blue")
        axes[0].set_ylabel("utilization")
        axes[0].set_ylim(0, 1.05)
        axes[1].step(days, [s.queued for s in picked], where="post", color="tab:orange")
        axes[1].set_ylabel("jobs waiting")
        axes[2].step(days, [s.fragmentation for s in picked], where="post", color="tab:red")
        axes[2].set_ylabel("fragmentation")
        axes[2].set_ylim(0, 1.05)
        axes[2].set_xlabel("simulated time (days)")
        if title:
            axes[0].set_title(title)
        fig.tight_layout()
        try:
            fig.savefig(path, format="png", dpi=100)
        except OSError as exc:
            raise TraceError(f"cannot write plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
